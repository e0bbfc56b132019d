#!/usr/bin/env bash
# Installs every Debian package ringtrain needs to build and test (idempotent; run as root).
#   tools/setup.sh            build + test dependencies
#   tools/setup.sh --peers    also what the peer measurements need beyond PyTorch (jemalloc)
#   tools/setup.sh --fuzz     also clang and libFuzzer for tools/fuzz.sh
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev                        # oneDNN: the CPU backend
  ocl-icd-opencl-dev                 # Debian's oneDNN has an OpenCL GPU runtime: its CMake config needs OpenCL
  openmpi-bin libopenmpi-dev         # MPI point-to-point transport for the ring allreduce
  libopencv-dev                      # image decode and augmentation
  libyaml-cpp-dev                    # configuration files
  libgtest-dev libgmock-dev          # tests
  libboost-context-dev               # fibers for the CUDA emulator's block threads (tests)
  python3 python3-numpy              # scaling cost model and its tests
  python3-matplotlib                 # plots of tools/scaling, tools/costmodel.py, tools/plot_metrics.py
  python3-torch python3-torchvision  # tools/torch_weights.py (PyTorch's own file format) and its tests
  iproute2                           # emulated cluster (network namespaces, tc)
)
if [[ "${1:-}" == "--peers" ]]; then
  pkgs+=(libjemalloc2)
fi
if [[ " $* " == *" --fuzz "* ]]; then
  pkgs+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#pkgs[@]} packages already installed"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: missing packages: ${missing[*]} (run as root, or: sudo $0 $*)" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
