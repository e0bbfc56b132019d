#!/usr/bin/env bash
# Builds the libFuzzer programs of tools/fuzz (clang, ASan + UBSan, in build-fuzz/) and runs each
# input reader's fuzzer for a bounded time, one after the other.
#   tools/fuzz.sh [SECONDS per target, default 60] [TARGET ...]
#   targets: config list shard image checkpoint (default: all)
# Each run starts from the seeds in tools/fuzz/corpus/<target>/ plus what earlier runs found
# (build-fuzz/corpus/<target>/, not committed). Crashing, hanging and out-of-memory inputs are
# kept in tools/fuzz/crashes/<target>/; the exit status is 1 when a run added one there.
# Needs clang and libclang-rt-14-dev (tools/setup.sh --fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[[ $# -gt 0 ]] && shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(config list shard image checkpoint)

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DRT_FUZZ=ON -DBUILD_TESTING=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j2 --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
found=0
for t in "${targets[@]}"; do
  seeds=tools/fuzz/corpus/$t corpus=build-fuzz/corpus/$t crashes=tools/fuzz/crashes/$t
  mkdir -p "$corpus" "$crashes" build-fuzz/tmp/$t
  before=$(find "$crashes" -type f | wc -l)
  dict=()
  [[ -f tools/fuzz/$t.dict ]] && dict=(-dict=tools/fuzz/$t.dict)
  echo "fuzz: $t for ${secs}s"
  # One worker process (-fork=1) that is restarted after a crash, so one run reports every bug
  # it reaches rather than only the first.
  TMPDIR=$PWD/build-fuzz/tmp/$t build-fuzz/fuzz/fuzz_$t "$corpus" "$seeds" "${dict[@]}" \
    -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=20 -max_len=16384 \
    -artifact_prefix="$crashes/" -print_final_stats=1 >build-fuzz/fuzz-$t.log 2>&1 || true
  rm -rf build-fuzz/tmp/$t
  grep -E '^#[0-9]+' build-fuzz/fuzz-$t.log | tail -1 || true
  after=$(find "$crashes" -type f | wc -l)
  if [[ $after -gt $before ]]; then
    echo "fuzz: $t: $((after - before)) new crashing input(s) in $crashes (log: build-fuzz/fuzz-$t.log)"
    found=1
  fi
done
exit $found
