#!/usr/bin/env bash
# Builds the CUDA backend and its tests (sm_90) and runs them, on a GPU machine that may have
# nothing but the CUDA toolkit, CMake and ninja: RT_GPU_ONLY needs no oneDNN, MPI, OpenCV or
# yaml-cpp. Logs and a summary go to $OUT (default ./gpu-out). Exit status: 0 when no test
# failed (and, where nvidia-smi sees a GPU, none was skipped) and bench_gpu_step succeeded, 1
# otherwise. With a GPU it then benchmarks the training step (bench_gpu_step against
# tools/bench_torch_gpu.py) into $OUT/bench.md, within what is left of the time budget.
#
#   tools/gpu_check.sh [build-dir]     (default build-gpu)
#   env: OUT, JOBS (default: all cores), CUDA_ARCH (default 90), GTEST_SOURCE (a googletest
#        source tree; else /usr/src/googletest or .gpu-deps/googletest, else an installed GTest),
#        CUDNN_ROOT (else beside the toolkit, else the nvidia-cudnn Python wheel),
#        BUDGET_S (wall seconds for the whole script, default 480: each benchmark's timeout is cut
#        to end within it, and one left under 30 s is not started), BENCH_BATCH (default 256),
#        BENCH_SIZE (default 224), PYTHON (the interpreter with torch; default python3)
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
ld_orig=${LD_LIBRARY_PATH-}  # PyTorch loads its own cuDNN: it runs without the path set below
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

rc=0
[ $unit_rc -ne 0 ] && rc=1
[ $gpu_rc -ne 0 ] && rc=1

# Benchmark: ResNet-50 training steps, ours against PyTorch in fp32, tf32 and bf16, each
# run in its own process under a timeout cut to the time left. Pairs of the same precision run
# back to back, so that a budget cut still leaves a comparison. A failing bench_gpu_step (error,
# timeout, or any allocation in the timed steps) fails the check; PyTorch problems are reported.
rm -f "$out"/bench-* "$out/bench.md"
if [ $gpu_present = 0 ]; then
  say "gpu_check: benchmark skipped: no GPU ($("$build/bin/bench_gpu_step" 2>&1 | head -1))"
else
  deadline=$(( start + ${BUDGET_S:-480} - 15 ))  # 15 s kept for the table
  bargs=(--batch "${BENCH_BATCH:-256}" --size "${BENCH_SIZE:-224}" --warmup 5 --steps 10 --repeats 3)
  py=${PYTHON:-python3}
  # bench NAME CAP CMD...: CMD under `timeout` (CAP s at most), log in bench-NAME.log.
  bench() {
    local name=$1 cap=$2 left=$(( deadline - $(date +%s) ))
    shift 2
    [ $left -lt $cap ] && cap=$left
    if [ $cap -lt 30 ]; then
      echo "not run: time budget spent" >"$out/bench-$name.log"; say "gpu_check: bench $name: not run (time budget spent)"
      return 0
    fi
    timeout -k 10 "$cap" "$@" >"$out/bench-$name.log" 2>&1
    local brc=$?
    [ $brc = 124 ] || [ $brc = 137 ] && echo "timed out after $cap s" >>"$out/bench-$name.log"
    say "gpu_check: bench $name: $(grep -m 1 -E '^(RESULT|pytorch )' "$out/bench-$name.log" || echo "exit $brc: $(tail -1 "$out/bench-$name.log")")"
    if [ $brc -ne 0 ] && [ "${name%%-*}" = ringtrain ]; then say "gpu_check: FAILED: bench $name (exit $brc)"; rc=1; fi
  }
  # bf16 first: its ratio is the target, and a budget cut should take fp32, not it.
  for p in bf16 fp16 tf32 fp32; do
    bench ringtrain-$p 150 "$build/bin/bench_gpu_step" --precision $p "${bargs[@]}" --json "$out/bench-ringtrain-$p.json"
    bench pytorch-$p 100 env LD_LIBRARY_PATH="$ld_orig" "$py" "$root/tools/bench_torch_gpu.py" --modes $p \
      "${bargs[@]}" --json "$out/bench-pytorch-$p.json"
  done
  gpu_name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  # The table: one row per run; a run without its JSON shows its log's last line instead.
  if ! python3 - "$out" "$gpu_name" "${bargs[*]}" >"$out/bench.md" 2>"$out/bench-table.log" <<'EOF'
import json, sys, time
out, gpu, bargs = sys.argv[1:4]
def load(name):
    try:
        with open(f"{out}/bench-{name}.json") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        try:
            with open(f"{out}/bench-{name}.log") as f:
                lines = [l.strip() for l in f if l.strip()]
            return lines[-1][:120].replace("|", "/") if lines else "no output"
        except OSError:
            return "not run"
def mib(v):  # None: a CPU smoke run of the PyTorch script
    return "–" if v is None else f"{v:.0f}"
names = ["ringtrain-fp32", "ringtrain-tf32", "ringtrain-bf16", "pytorch-fp32", "pytorch-tf32", "pytorch-bf16"]
runs = {n: load(n) for n in names}
pt = next((r for n, r in runs.items() if n.startswith("pytorch") and isinstance(r, dict)), {})
net = f"torchvision {pt['torchvision']}" if pt.get("torchvision") else "bench_torch_gpu.py's ResNet-50"
print("# ResNet-50 training step on one GPU\n")
print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {gpu}; {bargs}; "
      f"PyTorch {pt.get('torch', '?')}, cuDNN {pt.get('cudnn', '?')}, {net}.\n")
print("| run | img/s median [min–max] | peak memory in use, MiB | allocator peak, MiB "
      "| allocations in timed steps | ringtrain / PyTorch |")
print("|---|---|---|---|---|---|")
for name in names:
    who, prec = name.split("-")
    label = f"{'ringtrain' if who == 'ringtrain' else 'PyTorch'} {prec}"
    r = runs[name]
    if not isinstance(r, dict):
        print(f"| {label} | {r} | | | | |")
        continue
    ours = who == "ringtrain"
    peer = runs[f"pytorch-{prec}"]
    ratio = f"{r['img_per_s'] / peer['img_per_s']:.2f}" if ours and isinstance(peer, dict) else ""
    alloc = (f"{mib(r['alloc_device_mib'])} (rt::cuda)" if ours
             else f"{mib(r['max_allocated_mib'])} (max_memory_allocated)")
    print(f"| {label} | {r['img_per_s']:.1f} [{r['img_per_s_min']:.1f}–{r['img_per_s_max']:.1f}] "
          f"| {mib(r['peak_used_mib'])} | {alloc} | {r['steady_allocs'] if ours else ''} | {ratio} |")
print("\nPeak memory in use: cudaMemGetInfo's total − free after the first step (and at the end), "
      "minus that before the model was built. Logs: bench-*.log; figures: bench-*.json.")
EOF
  then
    say "gpu_check: FAILED to write bench.md (see bench-table.log)"
  fi
  [ -s "$out/bench.md" ] && cat "$out/bench.md" >>"$summary"
fi
say "gpu_check: done in $(( $(date +%s) - start )) s"
if [ $gpu_present = 1 ] && [ "$skipped" -gt 0 ]; then
  say "gpu_check: FAILED: a GPU is present but $skipped GPU tests skipped"; rc=1
fi
exit $rc
