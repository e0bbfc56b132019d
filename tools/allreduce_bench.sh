#!/bin/bash
# Side-by-side allreduce table in ONE run: ringtrain's ring, mpi and reducer (build/bin/
# allreduce_bench) next to the peers in /work/shared/peers (OpenMPI MPI_Allreduce and the naive
# single reducer from mpi_allreduce.c, built and called exactly as run_mpi.sh does; Gloo through
# torch as run_gloo.sh does), for N = 2 and 4, over shared memory (OpenMPI's default) and TCP
# loopback. Per (transport, N) our binary and the peers run back to back with the same mpirun
# flags. Every run goes through cpuguard.py; sizes disturbed by other processes are re-measured
# inside the benchmarks and flagged (*) in the table if still disturbed.
# Writes the raw RESULT lines to $OUT/allreduce_raw.csv and the markdown table into docs/comm.md
# (between the bench markers) unless --no-doc.
#
# Usage: tools/allreduce_bench.sh [--build DIR] [--budget S] [--min-reps R] [--np "2 4"]
#          [--sizes "4096 16384 ..."] [--transports "shm tcp"] [--no-gloo] [--no-wait] [--no-doc]
# --no-wait drops cpuguard's wait for a quiet machine before each run; the OpenMPI peer
# (mpi_allreduce.c) still waits inside for quiet on a size it found disturbed, so on a busy machine
# its runs can take up to their 600 s limit each and leave its columns empty: measure on a quiet one.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS:-/work/shared/peers}
BUILD=$ROOT/build BUDGET=2 MINREPS=5 NPS="2 4" TRANSPORTS="shm tcp" GLOO=1 WAIT=--wait-quiet DOC=1
SIZES="4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456"
# usage [STATUS]: the usage on stderr, exit 2 (a mistake); --help: on stdout, exit 0.
usage() { sed -n 's/^# \{0,1\}//; /^Usage:/,/^--no-wait/p' "$0" | sed '$d' >&"$(( ${1:-2} ? 2 : 1 ))"; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --build|--budget|--min-reps|--np|--sizes|--transports)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; usage; } ;;
  esac
  case $1 in
    --build) BUILD=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --min-reps) MINREPS=$2; shift ;;
    --np) NPS=$2; shift ;;
    --sizes) SIZES=$2; shift ;;
    --transports) TRANSPORTS=$2; shift ;;
    --no-gloo) GLOO=0 ;;
    --no-wait) WAIT= ;;
    --no-doc) DOC=0 ;;
    -h|--help) usage 0 ;;
    *) echo "unknown option $1" >&2; usage ;;
  esac
  shift
done
BENCH=$BUILD/bin/allreduce_bench
[ -x "$BENCH" ] || { echo "build $BENCH first (ninja -C $BUILD allreduce_bench)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
PEERBIN=${TMPDIR:-/tmp}/ringtrain-peers; mkdir -p "$PEERBIN"
mpicc -O2 "$PEERS/mpi_allreduce.c" -o "$PEERBIN/mpi_allreduce" || exit 1
OUT=${OUT:-$BUILD/allreduce_bench}; mkdir -p "$OUT"
RAW=$OUT/allreduce_raw.csv; : > "$RAW"
guard() { "$PEERS/cpuguard.py" $WAIT --max-foreign 99 -- timeout 600 "$@"; }
# Tags each RESULT line with the transport: RESULT,<impl>-<transport>,...
tag() { sed -u "s/^\(RESULT\|REJECTED\),\([a-z_]*\),/\1,\2-$1,/" | tee -a "$RAW"; }
CSV_SIZES=$(echo $SIZES | tr ' ' ',')

for tr in $TRANSPORTS; do
  [ "$tr" = shm ] && MCA="" || MCA="--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo"
  for np in $NPS; do
    echo "# transport=$tr np=$np"
    guard mpirun -np "$np" --oversubscribe $MCA "$BENCH" --sizes "$CSV_SIZES" \
      --budget "$BUDGET" --min-reps "$MINREPS" | tag "$tr"
    for mode in allreduce naive; do
      guard mpirun -np "$np" --oversubscribe $MCA "$PEERBIN/mpi_allreduce" $mode "$BUDGET" \
        "$MINREPS" $SIZES | sed -u "s/^\(RESULT\|REJECTED\),$mode,/\1,openmpi_$mode,/" | tag "$tr"
    done
    if [ "$GLOO" = 1 ] && [ "$tr" = tcp ]; then  # Gloo always runs over TCP loopback
      guard /usr/bin/python3 "$PEERS/gloo_allreduce.py" --np "$np" --budget "$BUDGET" \
        --min-reps "$MINREPS" --sizes $SIZES | tag "$tr"
    fi
  done
done

TABLE=$OUT/allreduce_table.md
/usr/bin/python3 - "$RAW" "$TABLE" <<'PY'
import collections, sys
raw, table = sys.argv[1], sys.argv[2]
cols = ["ring", "mpi", "reducer", "openmpi_allreduce", "openmpi_naive", "gloo"]
names = {"ring": "ring (ours)", "mpi": "mpi (ours → MPI_Allreduce)", "reducer": "reducer (ours)",
         "openmpi_allreduce": "OpenMPI MPI_Allreduce (peer)", "openmpi_naive": "naive reducer (peer)",
         "gloo": "Gloo (peer)"}
res = collections.defaultdict(dict)  # (transport, np) -> {(impl, bytes): (busbw, flag)}
for line in open(raw):
    f = line.strip().split(",")
    if f[0] != "RESULT" or f[1].startswith("impl"):
        continue
    impl, tr = f[1].rsplit("-", 1)
    flag = "" if f[11] == "OK" and "CONTENDED" not in line else "*"
    if f[11] != "OK":
        flag = " FAIL"
    res[(tr, int(f[2]))][(impl, int(f[3]))] = (float(f[10]), flag)
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
out = ["busbw in GB/s (nccl-tests definition, median over iterations); * = still disturbed by "
       "other processes after re-measuring, FAIL = wrong result.", ""]
for (tr, np) in sorted(res):
    r = res[(tr, np)]
    present = [c for c in cols if any(k[0] == c for k in r)]
    sizes = sorted({k[1] for k in r})
    out.append(f"**{'shared memory' if tr == 'shm' else 'TCP loopback'}, N = {np}**")
    out.append("")
    out.append("| size | " + " | ".join(names[c] for c in present) + " | ring / OpenMPI | ring / reducer |")
    out.append("|---:|" + "---:|" * (len(present) + 2))
    for b in sizes:
        cells = []
        for c in present:
            v = r.get((c, b))
            cells.append((f"{v[0]:.2f}" if v[0] >= 0.1 else f"{v[0]:.3f}") + v[1] if v else "–")
        ring, ompi, red = r.get(("ring", b)), r.get(("openmpi_allreduce", b)), r.get(("reducer", b))
        ratio = lambda a, d: f"{a[0] / d[0]:.2f}×" if a and d and d[0] > 0 else "–"
        out.append(f"| {size(b)} | " + " | ".join(cells) + f" | {ratio(ring, ompi)} | {ratio(ring, red)} |")
    out.append("")
open(table, "w").write("\n".join(out))
print("\n".join(out))
PY

if [ "$DOC" = 1 ]; then
  DOCF=$ROOT/docs/comm.md
  /usr/bin/python3 - "$DOCF" "$TABLE" "$(date -u +%Y-%m-%d) ($(nproc --all) cores, budget ${BUDGET} s per size)" "$ROOT/tools" <<'PY'
import sys
doc, table, when, tools = sys.argv[1:5]
sys.path.insert(0, tools)
from doc_table import put_between_markers
put_between_markers(doc, "allreduce-bench", f"Measured {when} by `tools/allreduce_bench.sh`.\n\n{open(table).read()}\n")
print(f"updated {doc}")
PY
fi
echo "raw results: $RAW; table: $TABLE"
