#!/usr/bin/env bash
# Builds the CUDA backend and its tests (sm_90) and runs them, on a GPU machine that may have
# nothing but the CUDA toolkit, CMake and ninja: RT_GPU_ONLY needs no oneDNN, OpenCV or yaml-cpp,
# and takes MPI and yaml-cpp from .gpu-deps (tools/bundle_gpu_deps.sh) when the machine has none,
# for the tests that run under mpirun (the ring allreduce on device buffers, NCCL on 2 ranks,
# trainer_cuda on synthetic data against the reference backend). Logs and a summary go to $OUT
# (default ./gpu-out). Exit status: 0 when no test failed (and, where nvidia-smi sees a GPU, the
# tests could use it) and bench_gpu_step succeeded, 1 otherwise. With a GPU it then benchmarks the
# training step (bench_gpu_step against tools/bench_torch_gpu.py) into $OUT/bench.md, within what
# is left of the time budget.
#
#   tools/gpu_check.sh [build-dir]     (default build-gpu)
#   env: OUT, JOBS (default: all cores), CUDA_ARCH (default 90), GTEST_SOURCE (a googletest
#        source tree; else /usr/src/googletest or .gpu-deps/googletest, else an installed GTest),
#        CUDNN_ROOT, NCCL_ROOT (else beside the toolkit, else the nvidia-cudnn / nvidia-nccl
#        Python wheels),
#        BUDGET_S (wall seconds for the whole script, default 480: each benchmark's timeout is cut
#        to end within it, and one left under 60 s is not started; a few steps of up to 40 s each
#        are not cut, so give the command about BUDGET_S + 90 s), BENCH_BATCH (default 256),
#        BENCH_SIZE (default 224), PYTHON (the interpreter with torch; default python3),
#        BUILD_TIMEOUT_S (default 360), PACK (a folder for gpu-check.tgz, all of $OUT packed, and
#        copies of summary.txt and bench.md)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
build=${1:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
arch=${CUDA_ARCH:-90}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: job files name paths in it
summary=$out/summary.txt
: >"$summary"
# Every line said also refreshes $PACK: a run killed outright (SIGKILL, no EXIT trap) still leaves
# what it had done so far.
say() { echo "$*" | tee -a "$summary"; pack; }
# PACK=<dir>: on any exit, all of $out as one archive there beside copies of summary.txt (and
# bench.md): a GPU machine's output folder may take back only a few files.
pack() {
  [ -n "${PACK:-}" ] || return 0
  mkdir -p "$PACK" || return 0
  # Written beside and renamed: a kill mid-write leaves the previous archive whole.
  tar czf "$PACK/.gpu-check.tgz.part" -C "$out" . 2>/dev/null && mv -f "$PACK/.gpu-check.tgz.part" "$PACK/gpu-check.tgz"
  cp "$summary" "$PACK/.summary.part" && mv -f "$PACK/.summary.part" "$PACK/summary.txt"
  [ -f "$out/bench.md" ] && cp "$out/bench.md" "$PACK/"
  return 0
}
trap pack EXIT
start=$(date +%s)
budget=${BUDGET_S:-480}
# cap N: N seconds, or what is left of the budget if less (at least 1). cap_keeping N K: the same,
# keeping K seconds of the budget for what follows.
cap() { local l=$(( start + budget - $(date +%s) )); [ "$l" -lt 1 ] && l=1; echo $(( $1 < l ? $1 : l )); }
cap_keeping() { local l=$(( start + budget - $2 - $(date +%s) )); [ "$l" -lt 30 ] && l=30; cap $(( $1 < l ? $1 : l )); }

# What the machine offers, for the record.
{
  date -u
  uname -a
  command -v nvidia-smi >/dev/null && timeout -k 5 30 nvidia-smi
  command -v nvcc >/dev/null && nvcc --version
  [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version
  cmake --version | head -1
  ninja --version
} >"$out/env.txt" 2>&1
gpu_present=0
if command -v nvidia-smi >/dev/null && timeout -k 5 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu_present=1; fi
say "gpu_check: GPU visible to nvidia-smi: $([ $gpu_present = 1 ] && echo yes || echo no)"

args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DRT_GPU_ONLY=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch")
gtest=${GTEST_SOURCE:-}
# The bundled one first: a machine's own may be too old for its CMake (CMake 4 refuses < 3.5).
for d in "$root/.gpu-deps/googletest" /usr/src/googletest; do
  [ -z "$gtest" ] && [ -f "$d/CMakeLists.txt" ] && gtest=$d
done
[ -n "$gtest" ] && args+=("-DRT_GTEST_SOURCE=$gtest")
ld_orig=${LD_LIBRARY_PATH-}  # PyTorch loads its own cuDNN and NCCL: it runs without the paths set below
# wheel_root VAR HEADER MODULE: found=$VAR, else nothing where HEADER is beside the toolkit, else
# the folder of the Python wheel MODULE; a root found is passed to CMake and put on the loader's
# path (cuDNN 9 loads its engine libraries, libcudnn_cnn and the rest, at run time from there).
wheel_root() {
  local v=${!1:-}
  if [ -z "$v" ] && [ ! -f "/usr/local/cuda/include/$2" ] && [ ! -f "/usr/include/$2" ]; then
    v=$("${PYTHON:-python3}" -c "import $3 as m; print(list(m.__path__)[0])" 2>/dev/null || true)
  fi
  if [ -n "$v" ]; then
    args+=("-D$1=$v")
    export LD_LIBRARY_PATH=$v/lib:$v/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  found=${v:-beside the toolkit}
}
wheel_root CUDNN_ROOT cudnn.h nvidia.cudnn; cudnn=$found
wheel_root NCCL_ROOT nccl.h nvidia.nccl; nccl=$found
# MPI: the machine's own, else the bundle (which relocates through the variables env.sh sets).
mpi=none
if mpicxx -showme >/dev/null 2>&1 || mpicxx -show >/dev/null 2>&1; then  # Open MPI, MPICH
  mpi=$(command -v mpicxx)
elif [ -f "$root/.gpu-deps/openmpi/env.sh" ]; then
  # shellcheck source=/dev/null
  source "$root/.gpu-deps/openmpi/env.sh"
  mpi="bundled $(command -v mpicxx)"
fi
# An MPI that cannot start one process here (a library it needs is missing) would fail the build
# (gtest discovery runs gpu_nccl, which calls MPI_Init) and every MPI test: leave it out instead.
if [ "$mpi" != none ] && ! OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
     timeout -k 5 30 "$(dirname "$(command -v mpicxx)")/mpirun" -np 1 true >"$out/mpi-check.log" 2>&1; then
  say "gpu_check: MPI left out: $mpi cannot run 'mpirun -np 1 true' here (mpi-check.log: $(grep -m 1 -iE 'fail|error|not found' "$out/mpi-check.log"))"
  mpi=none
fi
[ "$mpi" = none ] && args+=(-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
# yaml-cpp for trainer_cuda: the machine's, else the bundle's (its CMake package relocates).
ycpp=$root/.gpu-deps/yaml-cpp
if [ -d "$ycpp" ]; then
  args+=("-DCMAKE_PREFIX_PATH=$ycpp")
  export LD_LIBRARY_PATH=$(echo "$ycpp"/lib/*-linux-gnu)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
say "gpu_check: googletest: ${gtest:-installed}; cuDNN: $cudnn; NCCL: $nccl; MPI: $mpi; sm_$arch"
# The versions that decide a first run's fate, in the summary before the build: the driver's CUDA,
# the toolkit's, the cuDNN header the build takes (a wheel built for another CUDA major only
# warns at run time) and PyTorch's own.
cudnn_h=
for d in "${CUDNN_ROOT:-}/include" /usr/local/cuda/include /usr/include; do
  [ -z "$cudnn_h" ] && [ -f "$d/cudnn_version.h" ] && cudnn_h=$d/cudnn_version.h
done
cudnn_v=$([ -n "$cudnn_h" ] && awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{v=v (v?".":"") $3} END{print v}' "$cudnn_h")
driver_v=$(command -v nvidia-smi >/dev/null && timeout -k 5 30 nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: [0-9.]+' | head -1)
nvcc_v=$( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null |
          grep -oE 'release [0-9.]+' | head -1)
torch_v=$(LD_LIBRARY_PATH=$ld_orig timeout -k 5 60 "${PYTHON:-python3}" -c \
  'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>/dev/null)
say "gpu_check: versions: driver ${driver_v:-?}; toolkit ${nvcc_v:-?}; cuDNN header ${cudnn_v:-?} (${cudnn_h:-none found}); torch ${torch_v:-not importable}"

if ! timeout -k 10 "$(cap 120)" cmake -S "$root" -B "$build" "${args[@]}" >"$out/configure.log" 2>&1; then
  say "gpu_check: FAILED to configure (see configure.log)"; tail -20 "$out/configure.log" | tee -a "$summary"; exit 1
fi
# -k 0: a target that fails to build costs its own tests only; what was built still runs.
build_rc=0
if ! timeout -k 10 "$(cap "${BUILD_TIMEOUT_S:-360}")" cmake --build "$build" -j "$jobs" -- -k 0 >"$out/build.log" 2>&1; then
  build_rc=1
  say "gpu_check: FAILED to build every target (see build.log); running what was built"
  grep -m 20 -E 'error|FAILED' "$out/build.log" | tee -a "$summary"
  [ -x "$build/tests/gpu_smoke" ] || [ -x "$build/bin/bench_gpu_step" ] || exit 1
fi
say "gpu_check: built in $(( $(date +%s) - start )) s"
# A container may have a GPU without nvidia-smi: then the CUDA runtime's own answer, from a test
# program of ours (it skips, saying "no CUDA device", without one), decides.
if [ $gpu_present = 0 ] && timeout -k 5 60 "$build/tests/gpu_smoke" >"$out/gpu-smoke.log" 2>&1 &&
   grep -q '^\[  PASSED  \] 1 test' "$out/gpu-smoke.log" && ! grep -q 'no CUDA device' "$out/gpu-smoke.log"; then
  gpu_present=1
  say "gpu_check: no nvidia-smi answer, but the CUDA runtime sees a device: GPU tests and benchmark run"
fi

# The CUDA host tests (label unit) and the GPU tests; each GPU test skips, saying why, without one.
timeout -k 10 "$(cap 60)" ctest --test-dir "$build" -L unit -j 4 --output-on-failure >"$out/ctest-unit.log" 2>&1
unit_rc=$?
# Four at a time (one GPU has room for all of them), each cut at 90 s: a hung test costs its own
# result, not the rest's. With a GPU, the phase ends at the latest 150 s before the budget does,
# which the benchmark's bf16 pair (the target's ratio) needs. cuDNN logs its errors with their context (descriptors, the reason) to
# cudnn-errors.log: a first run's failures explained in one place (tests that provoke errors on
# purpose add theirs).
# One log per process (%i: cuDNN truncates the file each process opens), merged below. In a
# session of its own: jobs a test started under a timeout of its own (a new process group, which
# a cut ctest does not take down) are ended before the benchmark instead of running beside it.
gpu_cap=$(cap_keeping 240 $(( gpu_present * 150 )))
CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG="$out/cudnn-errors-%i.log" \
  setsid timeout -k 10 "$gpu_cap" ctest --test-dir "$build" -L gpu -j 4 --timeout 90 --output-on-failure \
  --output-junit "$out/ctest-gpu.xml" >"$out/ctest-gpu.log" 2>&1 &
gpu_sid=$!
wait $gpu_sid
gpu_rc=$?
# (no pkill on a minimal image: the session id is field 6 of /proc/PID/stat)
for p in /proc/[0-9]*; do
  [ "$(sed 's/.*) //' "$p/stat" 2>/dev/null | cut -d' ' -f4)" = "$gpu_sid" ] && kill -KILL "${p#/proc/}" 2>/dev/null
done
find "$out" -name 'cudnn-errors-*.log' -empty -delete
cat "$out"/cudnn-errors-*.log >"$out/cudnn-errors.log" 2>/dev/null; rm -f "$out"/cudnn-errors-*.log
# Per-test lines, written as each test ends: there even when the phase was cut.
tally() {
  awk '/ Test +#[0-9]+: / { if (/\*\*\*Skipped/) s++; else if (/ Passed +[0-9.]+ sec$/) p++; else f++ }
       END { printf "%d passed, %d failed, %d skipped", p, f, s }' "$1"
}
failed_tests() {  # "  name (Failed|Timeout|Exception...|Not Run)" per test that did not pass or skip
  grep -E ' Test +#[0-9]+: ' "$1" | grep -vE '( Passed|\*\*\*Skipped) +[0-9.]+ sec$' |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+).*\*\*\*(.*[^ ]) +[0-9.]+ sec$/\1 (\2)/' | head -30
}
skipped=$(grep -c '\*\*\*Skipped' "$out/ctest-gpu.log" || true)
say "gpu_check: unit: $(tally "$out/ctest-unit.log")$( [ $unit_rc = 124 ] || [ $unit_rc = 137 ] && echo '; CUT by the time budget')"
failed_tests "$out/ctest-unit.log" | sed 's/^/gpu_check: FAILED unit test: /' >>"$summary"
if [ $gpu_rc = 124 ] || [ $gpu_rc = 137 ]; then
  total=$(ctest --test-dir "$build" -N -L gpu | grep -oE 'Total Tests: [0-9]+' | grep -oE '[0-9]+$')
  say "gpu_check: gpu:  CUT by the time budget after $gpu_cap s: $(tally "$out/ctest-gpu.log") of ${total:-?}; the rest not run"
else
  total=$(grep -oE 'tests failed out of [0-9]+' "$out/ctest-gpu.log" | grep -oE '[0-9]+$' || echo 0)
  say "gpu_check: gpu:  $(tally "$out/ctest-gpu.log") of $total"
fi
failed_tests "$out/ctest-gpu.log" | sed 's/^/gpu_check: FAILED gpu test: /' >>"$summary"
[ -s "$out/cudnn-errors.log" ] && say "gpu_check: cuDNN logged $(grep -c 'function cudnn' "$out/cudnn-errors.log" || true) failed calls (cudnn-errors.log)"
# ctest keeps a skipped test's output to itself: ask one test program for the reason.
reason=$(timeout -k 5 30 "$build/tests/gpu_smoke" 2>&1 | grep -m 1 -oE 'no CUDA device: .*' || true)
[ "$skipped" -gt 0 ] && [ -n "$reason" ] && say "gpu_check: skip reason: $reason"
# Which were skipped (some skip by design on one GPU with a non-CUDA-aware MPI).
grep '(Skipped)$' "$out/ctest-gpu.log" | sed 's/^[[:space:]]*/gpu_check: skipped: /' | head -20 >>"$summary"

rc=0
[ $unit_rc -ne 0 ] && rc=1
[ $build_rc -ne 0 ] && rc=1
[ $gpu_rc -ne 0 ] && rc=1

# Benchmark: ResNet-50 training steps, ours against PyTorch in fp32, tf32 and bf16, each
# run in its own process under a timeout cut to the time left. Pairs of the same precision run
# back to back, so that a budget cut still leaves a comparison. A failing bench_gpu_step (error,
# its own time limit reached, or any allocation in the timed steps) fails the check; one the
# budget cut short, and PyTorch problems, are reported.
rm -f "$out"/bench-* "$out/bench.md" "$out/trainer-bf16-metrics.jsonl"
if [ $gpu_present = 0 ]; then
  say "gpu_check: benchmark skipped: no GPU ($(timeout -k 5 30 "$build/bin/bench_gpu_step" 2>&1 | head -1))"
else
  deadline=$(( start + budget - 15 ))  # 15 s kept for the table
  bargs=(--batch "${BENCH_BATCH:-256}" --size "${BENCH_SIZE:-224}" --warmup 5 --steps 10 --repeats 3)
  py=${PYTHON:-python3}
  # Our runs share one algorithm cache file: the bf16 benchmark times cuDNN's candidates per shape
  # and the trainer, profile and no-fusion runs of the same shapes take its choices (set-up time
  # the budget keeps for measuring).
  cache=(--algo-cache "$out/algos.tsv")
  # bench NAME CAP CMD...: CMD under `timeout`, CAP s at most, cut to what is left of the budget
  # (and not started with under 60 s left), log in bench-NAME.log. A run of ours that fails fails
  # the check, unless the budget cut it short: then only its figure is lost, and it says so.
  bench() {
    local name=$1 nominal=$2 cap=$2 left=$(( deadline - $(date +%s) )) cut=0
    shift 2
    [ $left -lt $cap ] && { cap=$left; cut=1; }
    bench_rc=0
    if [ $cap -lt 60 ]; then
      echo "not run: time budget spent" >"$out/bench-$name.log"; say "gpu_check: bench $name: not run (time budget spent)"
      return 0
    fi
    timeout -k 10 "$cap" "$@" >"$out/bench-$name.log" 2>&1
    local brc=$? budget_cut=0
    bench_rc=$brc
    if [ $brc = 124 ] || [ $brc = 137 ]; then
      if [ $cut = 1 ]; then
        budget_cut=1
        echo "cut by the time budget after $cap s (its own limit: $nominal s)" >>"$out/bench-$name.log"
      else
        echo "timed out after $cap s" >>"$out/bench-$name.log"
      fi
    fi
    # The last line outside Open MPI's abort banner (a failed rank's own error comes before it).
    local last
    last=$(awk '/^-----+$/ {b = !b; next} !b && NF {l = $0} END {print l}' "$out/bench-$name.log")
    say "gpu_check: bench $name: $(grep -m 1 -E '^(RESULT|pytorch )' "$out/bench-$name.log" || echo "exit $brc: $last")"
    # What the run had to work around: a convolution algorithm cuDNN refused at its first run
    # (cuda/conv_run.h), a stem run on padded channels (cuda/lowp_conv.h), a cuDNN built for
    # another CUDA (cuda/context.h).
    grep -m 3 -E 'cuDNN refused to run|zero-padded to|was built for CUDA' "$out/bench-$name.log" |
      sed "s/^/gpu_check: bench $name: /" >>"$summary"
    # Any run of ours failing fails the check, the profile run included.
    if [ $brc -ne 0 ] && [ $budget_cut = 0 ] && [[ $name == *ringtrain* ]]; then
      say "gpu_check: FAILED: bench $name (exit $brc)"; rc=1
    fi
  }
  # The trainer program itself, one rank, bf16, the same batch: synthetic 8-bit images made by the
  # loader's threads, uploaded and normalised on the device, the step and the one-rank reducer.
  # Its figure: the median [min-max] of the per-step img_s after the first 5 steps. The run
  # folder stays out of $out (a ResNet-50 checkpoint is 300 MB); its metrics are copied in.
  bench_trainer() {
    local tb=${BENCH_BATCH:-256} trun
    trun=$(mktemp -d)
    cat >"$trun/job.yaml" <<EOF2
model: {name: resnet50, classes: 1000}
data: {synthetic: true, synthetic_samples: $((tb * 30)), synthetic_classes: 1000, image_size: ${BENCH_SIZE:-224}, threads: 0, output: u8}
train: {epochs: 1, steps: 25, batch: $tb}
checkpoint: {at_epoch_end: false}
eval: {every_epochs: 0, at_end: false}
log: {progress: false, print_config: false}
backend: cuda-bf16
cuda: {algo_cache: $out/algos.tsv}
run_dir: $trun/run
EOF2
    bench ringtrain-trainer-bf16 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun -np 1 --bind-to none "$build/bin/trainer_cuda" --config "$trun/job.yaml"
    cp "$trun/run/metrics.jsonl" "$out/trainer-bf16-metrics.jsonl" 2>/dev/null
    if python3 "$root/tools/gpu_bench_table.py" trainer "$out/trainer-bf16-metrics.jsonl" \
        >"$out/bench-ringtrain-trainer-bf16.json" 2>/dev/null
    then
      say "gpu_check: trainer bf16: $(cat "$out/bench-ringtrain-trainer-bf16.json")"
    else
      rm -f "$out/bench-ringtrain-trainer-bf16.json"
    fi
    rm -rf "$trun"
  }
  # pair P: our step and PyTorch's at precision P; its status is our step's.
  pair() {
    local p=$1
    bench ringtrain-$p 150 "$build/bin/bench_gpu_step" --precision $p "${bargs[@]}" "${cache[@]}" \
      --json "$out/bench-ringtrain-$p.json"
    local ours=$bench_rc
    bench pytorch-$p 150 env LD_LIBRARY_PATH="$ld_orig" "$py" "$root/tools/bench_torch_gpu.py" --modes $p \
      "${bargs[@]}" --json "$out/bench-pytorch-$p.json"
    return $ours
  }
  gpu_name=$(timeout -k 5 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  # The table: one row per run; a run without its JSON shows its log's last line instead.
  table() {
    if ! python3 "$root/tools/gpu_bench_table.py" table "$out" "$gpu_name" "${bargs[*]}" \
        >"$out/bench.md" 2>"$out/bench-table.log"
    then
      say "gpu_check: FAILED to write bench.md (see bench-table.log)"
    fi
    pack  # the table is kept even if the run is killed during the next bench
  }
  # bf16 first: its ratio is the target; the trainer right after it (where built), as it is the
  # figure users see, unless the bf16 step itself timed out (the trainer would hang the same way).
  pair bf16
  bf16_rc=$?
  table  # after each pair: a run killed from outside still leaves the table so far
  if [ -x "$build/bin/trainer_cuda" ]; then
    if [ $bf16_rc = 124 ] || [ $bf16_rc = 137 ]; then
      say "gpu_check: bench ringtrain-trainer-bf16: not run (the bf16 step timed out)"
    else
      bench_trainer
    fi
  fi
  pair tf32
  table
  pair fp32
  table
  # With time left: where a bf16 step's time goes, by kind of layer, on both sides (the device
  # synced around each of our layers; PyTorch's own device time per op from its profiler).
  pargs=(--batch "${BENCH_BATCH:-256}" --size "${BENCH_SIZE:-224}" --warmup 3 --steps 2 --repeats 1 --profile 3)
  bench profile-ringtrain-bf16 120 "$build/bin/bench_gpu_step" --precision bf16 "${pargs[@]}" "${cache[@]}"
  bench profile-pytorch-bf16 90 env LD_LIBRARY_PATH="$ld_orig" "$py" "$root/tools/bench_torch_gpu.py" \
    --modes bf16 "${pargs[@]}"
  for who in ringtrain pytorch; do
    grep -E '^PROFILE_(KIND|TOTAL|ERROR)' "$out/bench-profile-$who-bf16.log" 2>/dev/null | sed "s/^/$who /" >>"$summary"
  done
  # Then what the batch norm + residual add fusion buys: the bf16 step with it off, as the table's.
  bench ringtrain-bf16-nofuse 150 "$build/bin/bench_gpu_step" --precision bf16 --no-fuse "${bargs[@]}" \
    "${cache[@]}" --json "$out/bench-ringtrain-bf16-nofuse.json"
  # fp16, which the table does not need, last: a budget cut takes it first.
  pair fp16
  table
  [ -s "$out/bench.md" ] && cat "$out/bench.md" >>"$summary"
fi

# With time left and compute-sanitizer there (it needs a runtime that exposes the GPU's debug
# interface; gVisor does not), the kernels' own op tests once more under memcheck: out-of-bounds
# and misaligned accesses that results alone can miss. Errors it reports fail the check; a
# sanitizer that cannot attach is only reported.
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
left=$(( start + budget - $(date +%s) ))
[ $gpu_present = 1 ] && { [ -z "$san" ] || [ $left -lt 60 ]; } &&
  say "gpu_check: memcheck: not run ($([ -z "$san" ] && echo 'no compute-sanitizer' || echo "$left s left"))"
if [ $gpu_present = 1 ] && [ -n "$san" ] && [ $left -ge 60 ]; then
  for t in gpu_lowp_ops gpu_lowp_batchnorm gpu_backend_ops gpu_sgd gpu_reduce; do
    left=$(( start + budget - $(date +%s) ))
    [ $left -lt 20 ] && { say "gpu_check: memcheck $t: not run (time budget spent)"; continue; }
    timeout -k 5 $(( left - 10 )) "$san" --tool memcheck --print-limit 100 --error-exitcode 99 "$build/tests/$t" \
      >"$out/memcheck-$t.log" 2>&1
    mrc=$?
    summary_line=$(grep -m 1 'ERROR SUMMARY' "$out/memcheck-$t.log" || tail -1 "$out/memcheck-$t.log")
    say "gpu_check: memcheck $t: exit $mrc: $summary_line"
    if grep -q 'Device not supported' "$out/memcheck-$t.log"; then  # gVisor: the sanitizer cannot attach
      say "gpu_check: memcheck: compute-sanitizer cannot attach here; not run further"; break
    fi
    if [ $mrc = 99 ] || grep -qE 'ERROR SUMMARY: [1-9]' "$out/memcheck-$t.log"; then
      say "gpu_check: FAILED: memcheck found errors in $t"; rc=1
    fi
  done
fi
say "gpu_check: done in $(( $(date +%s) - start )) s"
# A GPU the tests cannot use fails the check; skips by design (multi-GPU, CUDA-aware MPI,
# emulator-only) do not.
if [ $gpu_present = 1 ] && [ -n "$reason" ]; then
  say "gpu_check: FAILED: a GPU is present but the GPU tests cannot use it: $reason"; rc=1
fi
say "gpu_check: $([ $rc = 0 ] && echo PASSED || echo 'FAILED (see the lines above)')"
exit $rc
