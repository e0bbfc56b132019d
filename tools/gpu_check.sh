#!/usr/bin/env bash
# Builds the CUDA backend and its tests (sm_90) and runs them, on a GPU machine that may have
# nothing but the CUDA toolkit, CMake and ninja: RT_GPU_ONLY needs no oneDNN, MPI, OpenCV or
# yaml-cpp. Logs and a summary go to $OUT (default ./gpu-out). Exit status: 0 when no test
# failed (and, where nvidia-smi sees a GPU, none was skipped), 1 otherwise.
#
#   tools/gpu_check.sh [build-dir]     (default build-gpu)
#   env: OUT, JOBS (default: all cores), CUDA_ARCH (default 90), GTEST_SOURCE (a googletest
#        source tree; else /usr/src/googletest or .gpu-deps/googletest, else an installed GTest),
#        CUDNN_ROOT (else beside the toolkit, else the nvidia-cudnn Python wheel)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
build=${1:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
arch=${CUDA_ARCH:-90}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)

# What the machine offers, for the record.
{
  date -u
  uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi
  command -v nvcc >/dev/null && nvcc --version
  [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version
  cmake --version | head -1
  ninja --version
} >"$out/env.txt" 2>&1
gpu_present=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu_present=1; fi
say "gpu_check: GPU visible to nvidia-smi: $([ $gpu_present = 1 ] && echo yes || echo no)"

args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DRT_GPU_ONLY=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch")
gtest=${GTEST_SOURCE:-}
for d in /usr/src/googletest "$root/.gpu-deps/googletest"; do
  [ -z "$gtest" ] && [ -f "$d/CMakeLists.txt" ] && gtest=$d
done
[ -n "$gtest" ] && args+=("-DRT_GTEST_SOURCE=$gtest")
cudnn=${CUDNN_ROOT:-}
if [ -z "$cudnn" ] && [ ! -f /usr/local/cuda/include/cudnn.h ] && [ ! -f /usr/include/cudnn.h ]; then
  cudnn=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
if [ -n "$cudnn" ]; then
  args+=("-DCUDNN_ROOT=$cudnn")
  # cuDNN 9 loads its engine libraries (libcudnn_cnn, ...) at run time from the loader's path.
  export LD_LIBRARY_PATH=$cudnn/lib:$cudnn/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
say "gpu_check: googletest: ${gtest:-installed}; cuDNN: ${cudnn:-beside the toolkit}; sm_$arch"

if ! timeout 120 cmake -S "$root" -B "$build" "${args[@]}" >"$out/configure.log" 2>&1; then
  say "gpu_check: FAILED to configure (see configure.log)"; tail -20 "$out/configure.log"; exit 1
fi
if ! timeout 360 cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1; then
  say "gpu_check: FAILED to build (see build.log)"; grep -m 20 -E 'error|FAILED' "$out/build.log"; exit 1
fi
say "gpu_check: built in $(( $(date +%s) - start )) s"

# The CUDA host tests (label unit) and the GPU tests; each GPU test skips, saying why, without one.
timeout 60 ctest --test-dir "$build" -L unit --output-on-failure >"$out/ctest-unit.log" 2>&1
unit_rc=$?
timeout 240 ctest --test-dir "$build" -L gpu --output-on-failure --output-junit "$out/ctest-gpu.xml" \
  >"$out/ctest-gpu.log" 2>&1
gpu_rc=$?
skipped=$(grep -c '(Skipped)$' "$out/ctest-gpu.log" || true)
total=$(grep -oE 'tests failed out of [0-9]+' "$out/ctest-gpu.log" | grep -oE '[0-9]+$' || echo 0)
say "gpu_check: unit: $(grep -E 'tests passed|tests failed' "$out/ctest-unit.log" | tail -1)"
say "gpu_check: gpu:  $(grep -E 'tests passed|tests failed' "$out/ctest-gpu.log" | tail -1); $skipped of $total skipped"
# ctest keeps a skipped test's output to itself: ask one test program for the reason.
reason=$("$build/tests/gpu_smoke" 2>&1 | grep -m 1 -oE 'no CUDA device: .*' || true)
[ "$skipped" -gt 0 ] && [ -n "$reason" ] && say "gpu_check: skip reason: $reason"
say "gpu_check: done in $(( $(date +%s) - start )) s"

rc=0
[ $unit_rc -ne 0 ] && rc=1
[ $gpu_rc -ne 0 ] && rc=1
if [ $gpu_present = 1 ] && [ "$skipped" -gt 0 ]; then
  say "gpu_check: FAILED: a GPU is present but $skipped GPU tests skipped"; rc=1
fi
exit $rc
