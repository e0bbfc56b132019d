#!/usr/bin/env bash
# Side-by-side input-pipeline benchmark: ringtrain's loader (from the folder and from shards) vs
# torchvision's ImageFolder + DataLoader, on the same ImageNet-like JPEGs (about 500x375), the
# same batch, size and training transforms, at 1 and 2 decode threads / worker processes.
#   tools/bench_data.sh [OUT.md]     (needs tools/setup.sh --peers and a built build/)
# Writes the table between the bench_data markers of OUT.md (default docs/data.md).
# Env: BUILD (build), WORK (/tmp/ringtrain_bench_data), PEERS (../shared/peers), BATCH (64),
#      SIZE (224), BATCHES (20), PASSES (3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/data.md}
build=${BUILD:-build}
work=${WORK:-/tmp/ringtrain_bench_data}
peers=${PEERS:-../shared/peers}
batch=${BATCH:-64} size=${SIZE:-224} batches=${BATCHES:-20} passes=${PASSES:-3}
py=/usr/bin/python3
for b in make_imagenet_like pack_dataset bench_data; do
  [[ -x $build/bin/$b ]] || { echo "build first: cmake --build $build" >&2; exit 1; }
done
[[ -f $peers/torch_dataloader.py ]] || { echo "no torchvision peer script at $peers (set PEERS=)" >&2; exit 1; }

# (a) 10 classes x 130 train images of 500x375 (ImageNet's typical size): 20 batches of 64 per epoch.
$build/bin/make_imagenet_like --out "$work/images" --classes 10 --train-per-class 130 --val-per-class 20 \
  --width 500 --height 375 --seed 0 --quality 90
[[ $work/shards/train.index -nt $work/images/DATASET.txt ]] || $build/bin/pack_dataset --root "$work/images" --split train --out "$work/shards/train"

# (b) ours from folder and shards, torchvision with as many workers as we have threads.
log=$(mktemp)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
common=(--batch "$batch" --size "$size" --batches "$batches" --passes "$passes")
for t in 1 2; do
  echo "RUN folder $t $($build/bin/bench_data --root "$work/images" --threads "$t" "${common[@]}")" | tee -a "$log"
  echo "RUN shards $t $($build/bin/bench_data --shards "$work/shards/train.index" --threads "$t" "${common[@]}")" | tee -a "$log"
  echo "RUN torch $t $($py "$peers/torch_dataloader.py" "$work/images/train" --workers "$t" "${common[@]}")" | tee -a "$log"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

$py - "$log" "$out" "$load_before" "$load_after" "$batch" "$size" <<'PY'
import sys
sys.path.insert(0, "tools")
from doc_table import measured_on, put_between_markers, rate_cell, run_rates
log, out, before, after, batch, size = sys.argv[1:7]
res = run_rates(log)
cell = lambda k: rate_cell(res[k])
rows = [f"{measured_on(before, after)}; batch {batch}, {size}×{size}, training transforms "
        "(random-resized crop, flip, normalize), 1300 JPEGs of 500×375.",
        "images/s: median (min–max) over timed passes; torchvision = ImageFolder + DataLoader with as "
        "many worker processes as we have decode threads.", "",
        "| threads | ringtrain folder | ringtrain shards | torchvision DataLoader | folder / torchvision | shards / torchvision | ringtrain folder per thread |",
        "|---|---|---|---|---|---|---|"]
for t in ("1", "2"):
    f, s, p = res[("folder", t)][0], res[("shards", t)][0], res[("torch", t)][0]
    rows.append(f"| {t} | {cell(('folder', t))} | {cell(('shards', t))} | {cell(('torch', t))} | "
                f"{f / p:.2f}× | {s / p:.2f}× | {f / int(t):.0f} |")
table = "\n".join(rows) + "\n"
put_between_markers(out, "bench_data", table)
print(table)
PY
rm -f "$log"
