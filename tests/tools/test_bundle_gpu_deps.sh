#!/usr/bin/env bash
# tools/bundle_gpu_deps.sh's Open MPI, used as on a GPU machine that has none: in a mount namespace
# where this machine's Open MPI, PMIx and hwloc are hidden, the bundle's mpicxx builds a program
# and its mpirun runs it on 3 ranks, which must agree on an allreduce; nothing may be printed but
# the ranks' lines (a relocation gone wrong shows as help-file or component warnings).
# Exit 77 (skipped) without root and unshare, which the hiding needs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "skipped: hiding the installed Open MPI needs root and unshare -m"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash "$root/tools/bundle_gpu_deps.sh" "$tmp/deps"
cat >"$tmp/sum.cc" <<'CC'
#include <mpi.h>
#include <cstdio>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int mine = rank + 1;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  std::printf("rank %d of %d: sum %d\n", rank, size, sum);
  MPI_Finalize();
  return sum == size * (size + 1) / 2 ? 0 : 1;
}
CC
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
# What Debian's Open MPI, PMIx and hwloc put outside /usr/bin, and their programs, are hidden.
unshare -m bash -s "$tmp" "$multiarch" >"$tmp/out" 2>&1 <<'SH' || { cat "$tmp/out"; exit 1; }
set -e
tmp=$1 lib=/usr/lib/$2
empty=$(mktemp -d)
for d in $lib/openmpi $lib/pmix2 /usr/share/openmpi /etc/openmpi; do  # and libmunge below: Debian's libpmix needs it
  [ -d $d ] && mount --bind $empty $d
done
for f in $lib/libmunge.so.2 $lib/libmpi.so.40 $lib/libmpi_cxx.so.40 $lib/libopen-pal.so.40 $lib/libopen-rte.so.40 \
         $lib/libhwloc.so.15 /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper; do
  [ -e $f ] && mount --bind /dev/null "$(readlink -f $f)"
done
source "$tmp/deps/openmpi/env.sh"
cd "$tmp"
mpicxx sum.cc -o sum
ldd ./sum | grep -E 'libmpi|libopen-pal' | grep -v "$tmp/deps" && { echo "linked outside the bundle"; exit 1; }
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  timeout 60 mpirun -np 3 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 ./sum
SH
cat "$tmp/out"
lines=$(grep -c '^rank [0-2] of 3: sum 6$' "$tmp/out" || true)
others=$(grep -vc '^rank [0-2] of 3: sum 6$' "$tmp/out" || true)
[ "$lines" = 3 ] && [ "$others" = 0 ] || { echo "FAILED: want 3 rank lines and nothing else"; exit 1; }
echo "bundled Open MPI: built and ran 3 ranks with the installed one hidden"
