#!/usr/bin/env bash
# Data-parallel training throughput, side by side: the ringtrain trainer (synthetic data, 2 ranks
# x 1 thread, ring allreduce overlapped with backward) against PyTorch DistributedDataParallel
# over gloo with the same ranks, threads and batches, in its default configuration and in its best
# one (channels-last + jemalloc). Writes a markdown table into docs/trainer.md between the
# "bench_trainer" markers (or into OUT.md).
#
#   tools/bench_trainer.sh [--rows resnet20,resnet50] [--warmup 5] [--steps 20] [OUT.md]
#
# Rows: resnet20 b128/rank 32x32 (10 classes), resnet50 b32/rank 224x224 (1000 classes).
# ringtrain's figure is global images/s = 2 x batch / step time of rank 0's per-step records in
# the metrics file, median (min-max) over the steps after warm-up; PyTorch's is its script's own
# median (min-max) over the same number of steps. Needs a built build/ and tools/setup.sh --peers.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) ends the script too, not a row of blanks
cd "$(dirname "$0")/.."
rows=resnet20,resnet50 warmup=5 steps=20 out=docs/trainer.md
usage() { echo "tools/bench_trainer.sh: $1" >&2; sed -n '8p' "$0" | sed 's/^# */usage: /' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --rows|--warmup|--steps)
      [[ $# -ge 2 && $2 != -* ]] || usage "$1 needs a value"
      case $1 in --rows) rows=$2 ;; --warmup) warmup=$2 ;; --steps) steps=$2 ;; esac
      shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) usage "unknown option $1" ;;
    *) out=$1; shift ;;
  esac
done
[[ $warmup =~ ^[0-9]+$ && $steps =~ ^[1-9][0-9]*$ ]] || usage "--warmup takes a count >= 0, --steps one >= 1"
peers=${PEERS:-/work/shared/peers}
trainer=${TRAINER:-build/bin/trainer}
py=/usr/bin/python3
[[ -x $trainer ]] || { echo "build first: cmake --build build (no $trainer)" >&2; exit 1; }
[[ -f $peers/torch_ddp.py ]] || { echo "no PyTorch peer scripts at $peers (set PEERS=)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.txt

# ringtrain: one run of warmup + steps optimizer steps; prints "median min max" global img/s.
ours() {
  local model=$1 batch=$2 size=$3 classes=$4 run=$tmp/$1
  mpirun -np 2 --bind-to none "$trainer" --config /dev/null \
    --set model.name="$model" --set model.classes="$classes" \
    --set data.synthetic=true --set data.synthetic_classes="$classes" --set data.image_size="$size" \
    --set data.synthetic_samples=$((2 * batch * (warmup + steps))) --set data.threads=1 \
    --set train.batch="$batch" --set train.epochs=1 --set threads=1 \
    --set eval.every_epochs=0 --set eval.at_end=false --set checkpoint.at_epoch_end=false \
    --set log.print_config=false --set log.progress=false --set log.jsonl="$run/metrics.jsonl" \
    --set run_dir="$run" >&2
  $py - "$run/metrics.jsonl" "$warmup" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [s for s in steps if s["type"] == "step"][int(sys.argv[2]):]
ips = [s["img_s"] for s in steps]
print("%.2f %.2f %.2f" % (statistics.median(ips), min(ips), max(ips)))
PY
}

# PyTorch DDP (default or best); prints "median min max".
ddp() {
  local how=$1 model=$2 batch=$3 size=$4 line
  local args=(--ranks 2 --model "$model" --batch "$batch" --size "$size" --threads 1 --warmup "$warmup" --iters "$steps")
  if [[ $how == best ]]; then
    line=$(bash "$peers/run_torch_best.sh" torch_ddp.py "${args[@]}" | grep '^RESULT')
  else
    line=$($py "$peers/torch_ddp.py" "${args[@]}" | grep '^RESULT')
  fi
  echo "$line" >&2
  [[ $line == *img_per_s_median=* ]] || { echo "bench_trainer: PyTorch DDP ($how) gave no result" >&2; return 1; }
  sed -E 's/.*img_per_s_median=([0-9.]+) min=([0-9.]+) max=([0-9.]+).*/\1 \2 \3/' <<<"$line"
}

IFS=, read -ra want <<<"$rows"
for m in "${want[@]}"; do
  case $m in
    resnet20) b=128 s=32 c=10 ;;
    resnet50) b=32 s=224 c=1000 ;;
    *) echo "unknown row $m (resnet20, resnet50)" >&2; exit 2 ;;
  esac
  echo "== $m: ringtrain" >&2
  o=$(ours $m $b $s $c)
  echo "== $m: PyTorch DDP default" >&2
  d=$(ddp default $m $b $s)
  echo "== $m: PyTorch DDP best" >&2
  p=$(ddp best $m $b $s)
  echo "$m $b $s $o $d $p" | tee -a "$results" >&2
done

$py - "$results" "$out" "$warmup" "$steps" "$(nproc --all)" <<'PY'
import datetime, re, sys
res, out, warm, steps, cores = sys.argv[1:6]
rows = [l.split() for l in open(res) if l.strip()]
lines = [
    "Measured %s on %s cores, all rows in one run: 2 ranks x 1 thread, synthetic data; global images/s, "
    "median (min-max) over %s steps after %s warm-up steps." % (datetime.date.today(), cores, steps, warm),
    "",
    "| model | batch/rank | size | ringtrain img/s | DDP default | DDP best | vs default | vs best |",
    "|---|---|---|---|---|---|---|---|",
]
for m, b, s, o, omin, omax, d, dmin, dmax, p, pmin, pmax in rows:
    f = lambda a, lo, hi: "%s (%s–%s)" % (a, lo, hi)
    lines.append("| %s | %s | %s | %s | %s | %s | %.2f× | %.2f× |" % (
        m, b, s, f(o, omin, omax), f(d, dmin, dmax), f(p, pmin, pmax), float(o) / float(d), float(o) / float(p)))
table = "\n".join(lines)
print(table)
sys.path.insert(0, "tools")
from doc_table import put_between_markers
put_between_markers(out, "bench_trainer", table)
print("table written to", out)
PY
