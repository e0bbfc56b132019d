#!/usr/bin/env bash
# Soak run: the quickstart model for many steps on several ranks, data threads and overlap on,
# checkpoints and evaluation as configured; then, from every rank's epoch records, resident memory
# and open descriptors after warm-up. Fails (exit 1) when either grows.
#
#   tools/soak.sh [--np 4] [--steps 2000] [--batch 16] [--warmup-epochs 2] [--rss-slack-mib 8]
#                 [--bin build/bin/trainer] [--out runs/soak] [-- extra --set arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

np=4 steps=2000 batch=16 warmup=2 slack=8 bin=build/bin/trainer out=runs/soak
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --warmup-epochs) warmup=$2; shift 2 ;;
    --rss-slack-mib) slack=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "soak.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "soak.sh: $bin not built (cmake --build build)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out"
# 5,000 training images / (np x batch) steps per epoch; enough epochs to cover the steps.
epochs=$(( (steps * np * batch + 4999) / 5000 ))
sets=(--set train.steps="$steps" --set train.epochs="$epochs" --set train.batch="$batch"
      --set run_dir="$out" --set "log.jsonl=$out/metrics-{rank}.jsonl" --set log.progress=false
      --set eval.every_epochs=5 --set comm.overlap=true --set data.threads=1)
for s in "${extra[@]}"; do sets+=("$s"); done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s)
mpirun -np "$np" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
  "$bin" --config configs/quickstart.yaml "${sets[@]}" > "$out/output.txt" 2>&1 \
  || { tail -20 "$out/output.txt"; echo "soak.sh: the run failed (output: $out/output.txt)" >&2; exit 1; }
echo "soak: $steps steps on $np ranks x batch $batch in $(( $(date +%s) - start )) s"

python3 - "$out" "$np" "$warmup" "$slack" <<'EOF'
import json, sys
out, np_, warmup, slack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ok = True
print("| rank | epochs | RSS after warm-up (MiB) | RSS max after (MiB) | RSS last (MiB) | growth (MiB) | fds after warm-up | fds min-max after |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in range(np_):
    ep = [json.loads(l) for l in open(f"{out}/metrics-{r}.jsonl") if '"type":"epoch"' in l]
    if len(ep) <= warmup:
        print(f"soak: rank {r} has {len(ep)} epoch records, not more than the {warmup} warm-up epochs"); sys.exit(1)
    after = ep[warmup - 1:] if warmup > 0 else ep
    base = after[0]
    rss = [e["rss_mib"] for e in after]
    fds = [e["open_fds"] for e in after]
    growth = max(rss) - base["rss_mib"]
    print(f"| {r} | {len(ep)} | {base['rss_mib']:.1f} | {max(rss):.1f} | {rss[-1]:.1f} | {growth:+.1f} | {fds[0]} | {min(fds)}-{max(fds)} |")
    if growth > slack:
        print(f"soak: rank {r}: resident memory grew {growth:.1f} MiB after warm-up (allowed {slack})"); ok = False
    if max(fds) != fds[0] or min(fds) != fds[0]:
        print(f"soak: rank {r}: open descriptors changed after warm-up ({min(fds)}-{max(fds)})"); ok = False
print("soak: flat" if ok else "soak: GROWTH")
sys.exit(0 if ok else 1)
EOF
