#!/usr/bin/env bash
# The C++ tools' command lines: --help prints the usage (status 0); an unknown flag, a missing
# value and a number that is not wholly one, or out of range, are named (status 2); a failure
# midway leaves no half-made output behind (status 1); the emulated cluster's bench.sh checks its
# arguments before it tears down or writes anything.
# Usage: test_tool_cli.sh BIN_DIR   (make_imagenet_like, pack_dataset, bench_data, allreduce_bench;
# bench_overlap, bench_onednn_ops, bench_optimizer, bench_train_step and netem_relay where built)
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# expect RC PATTERN CMD...: the command's status is RC and its output matches PATTERN.
expect() {
  local rc=$1 pattern=$2
  shift 2
  local out got
  out=$("$@" 2>&1)
  got=$?
  if [[ $got -ne $rc ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> status $got (want $rc), output:"
    echo "$out" | head -5
    fails=$((fails + 1))
  fi
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for tool in make_imagenet_like pack_dataset bench_data; do
  expect 0 "^usage: $tool" "$bin/$tool" --help
  expect 2 "unknown flag --bogus" "$bin/$tool" --bogus
done
expect 0 "^usage: mpirun -np N allreduce_bench" mpirun -np 1 "$bin/allreduce_bench" --help
expect 1 "option --min-reps takes an integer in \[1, 1073741824\], not 'abc'" \
  mpirun -np 1 "$bin/allreduce_bench" --min-reps abc
expect 1 "bad byte size '0'" mpirun -np 1 "$bin/allreduce_bench" --min-bytes 0 --max-bytes 1K
expect 1 "byte size '5' is not a whole number of 4-byte floats" mpirun -np 1 "$bin/allreduce_bench" --sizes 5
expect 1 "option --sizes needs a value" mpirun -np 1 "$bin/allreduce_bench" --sizes --budget 1
expect 1 "need 1 <= --min-reps <= --max-reps \(got 10 and 5\)" mpirun -np 1 "$bin/allreduce_bench" --min-reps 10 \
  --max-reps 5
expect 1 "--segment-bytes '2' must be >= 4 bytes" mpirun -np 1 "$bin/allreduce_bench" --segment-bytes 2
expect 1 "ring@3 \(@: segment\) '3' must be >= 4 bytes" mpirun -np 1 "$bin/allreduce_bench" --algos ring@3 --sizes 4K
expect 1 "option --algos lists an empty name \(','\)" mpirun -np 1 "$bin/allreduce_bench" --algos , --sizes 4K
expect 1 "openmpi takes no suffix" mpirun -np 1 "$bin/allreduce_bench" --algos openmpi:bf16 --sizes 4K
expect 1 "option --ranks-per-node applies to hierarchical only" mpirun -np 1 "$bin/allreduce_bench" --ranks-per-node 2
# --ranks-per-node reaches the hierarchical allreduce: 2 nodes of 1 rank on one machine, sums checked.
mpi2=(mpirun -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
expect 0 "^RESULT,hierarchical,2,4096,1024,([^,]+,){6}OK," \
  "${mpi2[@]}" "$bin/allreduce_bench" --algos hierarchical --ranks-per-node 1 --sizes 4K --budget 0 --min-reps 1
expect 1 "comm.ranks_per_node 3 does not divide the 2 ranks" \
  "${mpi2[@]}" "$bin/allreduce_bench" --algos hierarchical --ranks-per-node 3 --sizes 4K --budget 0
# Its side-by-side script: a missing value or an unknown option prints the usage (status 2).
here=$(cd "$(dirname "$0")/../.." && pwd)
expect 2 "--np needs a value" bash "$here/tools/allreduce_bench.sh" --np
expect 2 "^Usage: tools/allreduce_bench.sh" bash "$here/tools/allreduce_bench.sh" --bogus
expect 0 "^Usage: tools/allreduce_bench.sh" bash "$here/tools/allreduce_bench.sh" --help
# The trainer's side-by-side script: no option taken for the output file, no value for a flag.
expect 2 "unknown option --step" bash "$here/tools/bench_trainer.sh" --rows resnet20 --step 2
expect 2 "--steps needs a value" bash "$here/tools/bench_trainer.sh" --steps
if [[ -x "$bin/bench_overlap" ]]; then
  expect 0 "^usage: mpirun -np N bench_overlap" mpirun -np 1 "$bin/bench_overlap" --help
  expect 1 "option --batch takes an integer in \[1, 1048576\], not '4x'" mpirun -np 1 "$bin/bench_overlap" --batch 4x
  expect 1 "option --emulate-ms takes a number in \[0, 1e\+07\], not '-5'" mpirun -np 1 "$bin/bench_overlap" \
    --emulate-ms -5
  expect 1 "option --overlap-sleep-us takes an integer" mpirun -np 1 "$bin/bench_overlap" --overlap-sleep-us 5,x
fi
# The benchmarks and the cluster's relay: none of them reads "1abc" as 1 or ignores a lone flag
# (each fails before it measures or creates anything).
for tool in bench_onednn_ops bench_optimizer bench_train_step netem_relay; do
  [[ -x "$bin/$tool" ]] || continue
  expect 0 "^usage: $tool" "$bin/$tool" --help
  expect 2 "unknown flag --bogus" "$bin/$tool" --bogus
done
if [[ -x "$bin/bench_onednn_ops" ]]; then
  expect 2 "missing value for --reps" "$bin/bench_onednn_ops" --reps
  expect 2 "--reps takes an integer in \[1, 1000000\], not '7x'" "$bin/bench_onednn_ops" --reps 7x
  expect 2 "--clock must be wall or cpu, not 'gpu'" "$bin/bench_onednn_ops" --clock gpu
  expect 2 "--compare takes two backends, A,B, not 'onednn'" "$bin/bench_onednn_ops" --compare onednn
fi
if [[ -x "$bin/bench_optimizer" ]]; then
  expect 2 "missing value for --threads" "$bin/bench_optimizer" --threads
  expect 2 "--iters takes an integer in \[1, 1000000\], not '1x'" "$bin/bench_optimizer" --iters 1x
fi
if [[ -x "$bin/bench_train_step" ]]; then
  expect 2 "--batch takes an integer in \[1, 65536\], not '1abc'" "$bin/bench_train_step" --batch 1abc
  expect 2 "missing value for --iters" "$bin/bench_train_step" --peak --iters
  expect 2 "--drop-path takes a rate in \[0, 1\), not '1'" "$bin/bench_train_step" --drop-path 1
  expect 2 "--block takes 8 or 16" "$bin/bench_train_step" --block 4
fi
if [[ -x "$bin/netem_relay" ]]; then
  expect 2 "--hosts takes an integer in \[1, 250\], not '2x'" "$bin/netem_relay" --hosts 2x --rate 1e9
  expect 2 "--latency-us takes a number in \[0, 1e\+09\], not '-5'" "$bin/netem_relay" --hosts 2 --rate 1e9 \
    --latency-us -5
  expect 2 "missing value for --rate" "$bin/netem_relay" --hosts 2 --rate
  expect 2 "--hosts and --rate are required" "$bin/netem_relay" --hosts 2
fi

m="$bin/make_imagenet_like"
expect 2 "missing value for --out" "$m" --out
expect 2 "--classes takes an integer in \[1, 100000\], not '4294967297'" "$m" --out "$tmp/a" --classes 4294967297
expect 2 "--threads takes an integer in \[0, 1024\], not '2x'" "$m" --out "$tmp/a" --threads 2x
expect 2 "--seed takes an integer" "$m" --out "$tmp/a" --seed -1
expect 1 "cannot create directories" "$m" --out /proc/rt-no-such/x --classes 2 --train-per-class 1 --val-per-class 1
expect 0 "6 images \(2 classes\)" "$m" --out "$tmp/d" --classes 2 --train-per-class 2 --val-per-class 1 --width 16 \
  --height 16
# A generator stopped by a signal removes its half-made folder (status 128 + the signal), and the
# next one removes folders that a killed generator (no such process any more) left behind.
sleep 0 & dead=$!
wait $dead
mkdir -p "$tmp/g.tmp-$(hostname)-$dead/train" "$tmp/g.tmp-elsewhere-$dead"  # another machine's stays
"$m" --out "$tmp/g" --classes 4 --train-per-class 100000 --val-per-class 1 --width 64 --height 64 --threads 1 \
  >/dev/null 2>"$tmp/g.err" &
gen=$!
for _ in $(seq 100); do [[ -d $tmp/g.tmp-$(hostname)-$gen/train ]] && break; sleep 0.05; done
sleep 0.3
kill -TERM $gen
wait $gen
rc=$?
left=$(cd "$tmp" && ls -d g g.tmp-* 2>/dev/null)
if [[ $rc -ne 143 || $left != "g.tmp-elsewhere-$dead" ]] || ! grep -q "stopped by signal 15: $tmp/g not made" "$tmp/g.err"; then
  echo "FAIL: make_imagenet_like stopped by SIGTERM: status $rc (want 143), left: $left"
  cat "$tmp/g.err"
  fails=$((fails + 1))
fi
rm -rf "$tmp/g.tmp-elsewhere-$dead"
p="$bin/pack_dataset"
expect 2 "--shard-mib takes an integer in \[1, 1048576\], not '1abc'" "$p" --root "$tmp/d" --split train \
  --out "$tmp/s/tr" --shard-mib 1abc
expect 2 "names a folder: give a file name prefix" "$p" --root "$tmp/d" --split train --out "$tmp/s/"
expect 0 "4 samples, 2 classes" "$p" --root "$tmp/d" --split train --out "$tmp/s/tr"
expect 2 "--batch takes an integer in \[1, 65536\], not '4294967297'" "$bin/bench_data" --root "$tmp/d" \
  --batch 4294967297
expect 2 "--mixup takes a number >= 0, not 'abc'" "$bin/bench_data" --root "$tmp/d" --mixup abc
# The emulated cluster's benchmark checks its arguments before it tears anything down or writes:
# an earlier run's results stay whole (as root only: it needs network namespaces).
if [[ $(id -u) -eq 0 ]]; then
  tools=$(dirname "$0")/../../tools/cluster
  mkdir -p "$tmp/bench" && echo "RESULT,kept" > "$tmp/bench/results.csv"
  expect 1 "-np 3 is not a multiple of --per-host 2" "$tools/bench.sh" --np 3 --per-host 2 --bin "$bin/allreduce_bench" \
    --out "$tmp/bench"
  expect 1 "--np takes positive rank counts \(got 'x'\)" "$tools/bench.sh" --np "2 x" --bin "$bin/allreduce_bench" \
    --out "$tmp/bench"
  if [[ "$(cat "$tmp/bench/results.csv")" != "RESULT,kept" ]]; then
    echo "FAIL: tools/cluster/bench.sh emptied an earlier results.csv on a bad argument"
    fails=$((fails + 1))
  fi
fi
leftover=$(find "$tmp" /proc/rt-no-such 2>/dev/null | grep -c '\.tmp')
if [[ $leftover -ne 0 ]]; then
  echo "FAIL: temporary files left: $(find "$tmp" | grep '\.tmp')"
  fails=$((fails + 1))
fi
echo "test_tool_cli: $([[ $fails -eq 0 ]] && echo passed || echo FAILED) ($fails failures)"
[[ $fails -eq 0 ]]
