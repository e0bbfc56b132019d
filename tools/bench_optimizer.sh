#!/usr/bin/env bash
# Side by side in one run: ringtrain's optimizer step (SGD, AdamW, LAMB) and PyTorch's (SGD,
# AdamW) over ResNet-50's parameters, at 1 and 2 threads; prints a markdown table.
#   tools/bench_optimizer.sh        (needs a built build/ and PyTorch + torchvision)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-/usr/bin/python3}
[[ -x build/bin/bench_optimizer ]] || { echo "build first: cmake --build build" >&2; exit 1; }
log=$(mktemp)
for t in 1 2; do
  build/bin/bench_optimizer --threads "$t" | sed "s/^RESULT,/RESULT,ours,/" >>"$log"
  "$py" tools/torch_optimizer.py --threads "$t" 2>/dev/null | sed "s/^RESULT,/RESULT,torch,/" >>"$log"
done
"$py" - "$log" <<'PY'
import sys, datetime
rows = {}
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if f[0] != "RESULT": continue
    kv = dict(x.split("=", 1) for x in f[2:])
    rows[(f[1], kv["kind"], kv["threads"])] = kv
print(f"Measured {datetime.date.today()}, one run; ms per step over ResNet-50's 25.6M parameters, median (min–max) of 10 after 2 warm-up.\n")
print("| optimizer | threads | ringtrain ms | PyTorch ms | PyTorch / ringtrain |")
print("|---|---|---|---|---|")
fmt = lambda r: f'{r["median_ms"]} ({r["min_ms"]}–{r["max_ms"]})' if r else "–"
for t in ("1", "2"):
    for k in ("sgd", "adamw", "lamb"):
        o, p = rows.get(("ours", k, t)), rows.get(("torch", k, t))
        ratio = f'{float(p["median_ms"]) / float(o["median_ms"]):.2f}×' if o and p else "– (no torch.optim LAMB)"
        print(f"| {k} | {t} | {fmt(o)} | {fmt(p)} | {ratio} |")
PY
rm -f "$log"
