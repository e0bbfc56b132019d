#!/bin/bash
# Runs tools/bench_overlap for 2 ranks over TCP loopback and over shared memory (2 ranks x 1
# compute thread on a 2-core machine), with the communication thread's sleeping waits (default)
# and MPI_Wait side by side: real backward on the CPU (resnet18 at 72x72 and at 32x32, where
# backward is shortest next to its 44.6 MiB of gradients), then a backward emulated to last as long
# as the allreduce alone (resnet50's 97.5 MiB), which leaves the cores to communication as a GPU
# would. Extra arguments go to bench_overlap.
# Usage: tools/bench_overlap.sh [--build DIR] [bench_overlap options...]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build
if [ "${1:-}" = --build ]; then BUILD=$2; shift 2; fi
BENCH=$BUILD/bin/bench_overlap
[ -x "$BENCH" ] || { echo "build $BENCH first (ninja -C $BUILD bench_overlap)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
COMMON=(--steps 10 --warmup 1 --bucket-mib 4 --overlap-sleep-us 50,0)
for work in "--model resnet18 --batch 1 --size 72" "--model resnet18 --batch 2 --size 32" \
            "--model resnet50 --batch 1 --size 64 --emulate-ms auto"; do
  read -r -a W <<<"$work"
  for tr in tcp shm; do
    [ "$tr" = tcp ] && MCA="--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo" || MCA=""
    echo "\$ mpirun -np 2 --bind-to none $MCA $BENCH ${W[*]} ${COMMON[*]} --transport $tr $*"
    mpirun -np 2 --bind-to none $MCA "$BENCH" "${W[@]}" "${COMMON[@]}" --transport "$tr" "$@"
  done
done
