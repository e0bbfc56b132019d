#!/usr/bin/env bash
# Side-by-side training-step benchmark: ringtrain vs PyTorch (default, and best: channels-last +
# jemalloc) on the same rows and thread counts, in one run, with peak resident memory of each.
#   tools/bench_train_step.sh [OUT.md]      (needs tools/setup.sh --peers and a built build/)
# Rows: resnet50 b32 224², resnet18 b64 224², resnet20 b128 32², at 1 and 2 threads; others with
#   ROWS="resnext50_32x4d 32 224;wide_resnet50_2 16 224" THREADS="2" (any torchvision ResNet name,
#   or timm's models of tools/torch_weights.py's TIMM table: SE, ResNet-D, ECA, resnext101_32x4d;
#   tools/torch_se_models.py gives them to PyTorch).
# MARKER names the table's place in OUT.md (default bench_train_step), so that another set of rows
#   can have a table of its own there.
# ALSO_BLOCK=8 (or 16) adds ringtrain with that oneDNN activation block beside the default one.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench_train_step.md}
peers=${PEERS:-../shared/peers}
bench=build/bin/bench_train_step
log=$(mktemp)
# The raw log is kept either way: a run that failed half-way still shows what it measured.
trap 'echo "raw log: $log" >&2' EXIT
py=/usr/bin/python3
[[ -x $bench ]] || { echo "build first: cmake --build build" >&2; exit 1; }
[[ -f $peers/torch_train.py ]] || { echo "no PyTorch peer scripts at $peers (set PEERS=)" >&2; exit 1; }

# Runs a command, appends its output and its peak RSS (children's maxrss) to the log.
measure() {
  local tag=$1; shift
  $py -c '
import resource, subprocess, sys
p = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, text=True)
out = p.stdout.replace("RESULT,", "RESULT," + sys.argv[1] + ",")
sys.stdout.write(out)
print("RSS,%s,%d" % (sys.argv[1], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(p.returncode)' "$tag" "$@" | tee -a "$log"
}

peers_abs=$(cd "$peers" && pwd)  # the SE peer below runs the script from elsewhere
timm_models=$($py -c 'import sys; sys.path.insert(0, "tools"); import torch_weights; print(*torch_weights.TIMM)')
if [[ -n ${ROWS:-} ]]; then IFS=';' read -r -a rows <<<"$ROWS"
else rows=("resnet50 32 224" "resnet18 64 224" "resnet20 128 32"); fi
for t in ${THREADS:-1 2}; do
  for r in "${rows[@]}"; do
    read -r m b s <<<"$r"
    key="$m/$b/$s/$t"
    measure "ours/$key" $bench --model "$m" --batch "$b" --size "$s" --threads "$t" \
      $([[ $m == resnet50 ]] && echo --peak)
    [[ -n ${ALSO_BLOCK:-} ]] && measure "ours_block/$key" $bench --model "$m" --batch "$b" --size "$s" --threads "$t" \
      --block "$ALSO_BLOCK"
    # timm's models through tools/torch_se_models.py, which runs the same peer script on them.
    peer=(); [[ " $timm_models " == *" $m "* ]] && peer=("$PWD/tools/torch_se_models.py")
    measure "torch_default/$key" $py "${peer[@]}" "$peers_abs/torch_train.py" --model "$m" --batch "$b" --size "$s" \
      --threads "$t"
    measure "torch_best/$key" bash "$peers/run_torch_best.sh" "${peer[@]}" "$peers_abs/torch_train.py" --model "$m" \
      --batch "$b" --size "$s" --threads "$t"
  done
done

PYTHONPATH=tools $py - "$log" "$out" "${MARKER:-bench_train_step}" <<'PY'
import re, sys, datetime, platform
from doc_table import put_between_markers
log, out, marker = sys.argv[1], sys.argv[2], sys.argv[3]
res, rss, peak = {}, {}, {}
for line in open(log):
    f = line.strip().split(",")
    if f[0] == "RESULT":
        kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
        res[f[1]] = kv
    elif f[0] == "RSS":
        rss[f[1]] = int(f[2]) / 1024
    elif f[0] == "PEAK":
        kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
        peak[kv["threads"]] = kv
keys = sorted({k.split("/", 1)[1] for k in res}, key=lambda k: (k.split("/")[3], k))
def img(sys_, k):
    r = res.get(f"{sys_}/{k}")
    if not r: return None, "–"
    b = float(r["batch"])
    txt = f'{float(r["img_per_s"]):.2f} ({b / float(r["max_s"]):.2f}–{b / float(r["min_s"]):.2f})'
    return float(r["img_per_s"]), txt + ("" if r.get("status") == "clean" else " CONTENDED")
setups = sorted({r.get("setup", "") for k, r in res.items() if k.startswith("ours")} - {""})
also = any(k.startswith("ours_block/") for k in res)
lines = [f"Measured {datetime.date.today()} on {platform.node() or 'this machine'} ({open('/proc/cpuinfo').read().count('processor')} cores), all rows in one run.",
         "images/s: median (min–max) over clean timed steps after warm-up; peak RSS of the whole process.",
         "ringtrain: " + "; ".join(setups) + ".", "",
         "| model | batch | size | threads | ringtrain img/s |" + (" ringtrain, other block |" if also else "") +
         " PyTorch default | PyTorch best | vs default | vs best | ringtrain RSS MiB | PyTorch best RSS MiB | PyTorch default RSS MiB |",
         "|---|---|---|---|---|" + ("---|" if also else "") + "---|---|---|---|---|---|---|"]
for k in keys:
    m, b, s, t = k.split("/")
    o, os_ = img("ours", k); d, ds = img("torch_default", k); be, bs = img("torch_best", k)
    ratio = lambda a, c: f"{a / c:.2f}×" if a and c else "–"
    r = lambda n: f'{rss.get(n, 0):.0f}'
    other = f" {img('ours_block', k)[1]} |" if also else ""
    lines.append(f"| {m} | {b} | {s} | {t} | {os_} |{other} {ds} | {bs} | {ratio(o, d)} | {ratio(o, be)} | {r('ours/'+k)} | {r('torch_best/'+k)} | {r('torch_default/'+k)} |")
for t, p in sorted(peak.items()):
    lines.append("")
    lines.append(f"resnet50 b32, {t} thread(s): {p['step_gflops']} GFLOP/s achieved in the training step = "
                 f"{float(p['fraction']) * 100:.0f}% of the measured fp32 peak ({p['sgemm_gflops']} GFLOP/s, 3072³ oneDNN sgemm).")
# Between its markers: the file's notes and earlier measurements around the table stay.
put_between_markers(out, marker, "\n".join(lines) + "\n")
print("\n".join(lines))
PY
