#!/usr/bin/env bash
# Side-by-side cost of the automatic augmentation policies: ringtrain's loader (data.auto_augment)
# vs torchvision's ImageFolder + DataLoader with the same policy in its reference recipe's place,
# on the same ImageNet-like JPEGs (500x375), one decode thread / worker process each, each policy
# run back to back on both so they see the same load.
#   tools/bench_autoaugment.sh [OUT.md]     (needs python3-torchvision and a built build/)
# Writes the table between the bench_autoaugment markers of OUT.md (default docs/data.md).
# Env: BUILD (build), WORK (/tmp/ringtrain_bench_data), BATCH (64), SIZE (224), BATCHES (20),
#      PASSES (3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/data.md}
build=${BUILD:-build}
work=${WORK:-/tmp/ringtrain_bench_data}
batch=${BATCH:-64} size=${SIZE:-224} batches=${BATCHES:-20} passes=${PASSES:-3}
py=/usr/bin/python3
for b in make_imagenet_like bench_data; do
  [[ -x $build/bin/$b ]] || { echo "build first: cmake --build $build" >&2; exit 1; }
done

# 10 classes x 130 train images of 500x375 (as tools/bench_data.sh): 20 batches of 64 per epoch.
$build/bin/make_imagenet_like --out "$work/images" --classes 10 --train-per-class 130 --val-per-class 20 \
  --width 500 --height 375 --seed 0 --quality 90

log=$(mktemp)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
common=(--batch "$batch" --size "$size" --batches "$batches" --passes "$passes")
for p in none autoaugment randaugment trivialaugment; do
  echo "RUN ours $p $($build/bin/bench_data --root "$work/images" --threads 1 --auto-augment "$p" "${common[@]}")" | tee -a "$log"
  echo "RUN torch $p $($py tools/torch_autoaugment.py "$work/images/train" --policy "$p" --workers 1 "${common[@]}")" | tee -a "$log"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

$py - "$log" "$out" "$load_before" "$load_after" "$batch" "$size" <<'PY'
import sys
sys.path.insert(0, "tools")
from doc_table import measured_on, put_between_markers, rate_cell, run_rates
log, out, before, after, batch, size = sys.argv[1:7]
res = run_rates(log)
cell = lambda k: rate_cell(res[k])
def us(k, base):  # the policy's own microseconds per image: the rates' difference
    return 1e6 / res[k][0] - 1e6 / res[base][0]
rows = [f"{measured_on(before, after)}; batch {batch}, {size}×{size}, 1300 JPEGs of 500×375, one "
        "decode thread (ringtrain) / one worker process (torchvision).",
        "images/s: median (min–max) over timed passes; µs/image: what the policy adds to the same "
        "pipeline without it.", "",
        "| policy | ringtrain | torchvision | ringtrain / torchvision | ringtrain µs/image | torchvision µs/image |",
        "|---|---|---|---|---|---|"]
for p in ("none", "autoaugment", "randaugment", "trivialaugment"):
    o, t = ("ours", p), ("torch", p)
    cost_o = "—" if p == "none" else f"{us(o, ('ours', 'none')):.0f}"
    cost_t = "—" if p == "none" else f"{us(t, ('torch', 'none')):.0f}"
    rows.append(f"| {p} | {cell(o)} | {cell(t)} | {res[o][0] / res[t][0]:.2f}× | {cost_o} | {cost_t} |")
table = "\n".join(rows) + "\n"
put_between_markers(out, "bench_autoaugment", table)
print(table)
PY
rm -f "$log"
