#!/usr/bin/env bash
# tools/supervise.sh: a job killed midway (a rank lost, once) is restarted and continues from its
# newest checkpoint to the end; a failure at start-up, a stop that was asked for, a signal to the
# supervisor and spent restarts are not restarted; a command without --resume auto is refused.
# Usage: test_supervise.sh BIN_DIR   (trainer)
set -u
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
sv=$here/tools/supervise.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $1"; echo "$2" | tail -15; fails=$((fails + 1)); }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# A 2-rank job whose first attempt loses rank 1 at step 6 (SIGKILL), after the checkpoint of step 4.
cat >"$tmp/tiny.yaml" <<YAML
model: {name: resnet20, classes: 4, width: 0.25}
data: {synthetic: true, synthetic_samples: 64, synthetic_classes: 4, image_size: 8, threads: 1}
train: {steps: 10, batch: 4}
checkpoint: {every_steps: 2}
log: {print_config: false}
threads: 1
run_dir: $tmp/run
YAML
cat >"$tmp/job.sh" <<JOB
#!/usr/bin/env bash
fault=()
[ -f "$tmp/once" ] || { touch "$tmp/once"; fault=(--set debug.fault=kill --set debug.rank=1 --set debug.step=6); }
exec mpirun -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 "$bin/trainer" \\
  --config "$tmp/tiny.yaml" "\${fault[@]}" "\$@"
JOB
chmod +x "$tmp/job.sh"
out=$("$sv" --min-uptime 0 --delay 0 -- "$tmp/job.sh" --resume auto 2>&1)
rc=$?
[[ $rc -eq 0 && $out == *"attempt 1 failed (status "*"restarting in 0 s (3 restart(s) left)"* &&
   $out == *"loaded $tmp/run/checkpoints/ckpt-0000000004.rtck: 4 steps done"* && $out == *"finished: 6 steps"* ]] ||
  fail "a job that lost a rank once is restarted and finishes (status $rc)" "$out"

# Not restarted: a configuration error at start-up, a stop that was asked for, spent restarts.
out=$("$sv" --delay 0 -- "$bin/trainer" --config "$here/configs/quickstart.yaml" --set train.bacth=4 --resume auto 2>&1)
rc=$?
[[ $rc -eq 1 && $out == *"unknown key 'train.bacth'"* && $out == *"within "*"s of its start, under --min-uptime 60"* &&
   $out != *restarting* ]] || fail "a configuration error is not restarted (status $rc)" "$out"
out=$("$sv" --min-uptime 0 --delay 0 -- sh -c 'exit 138' x --resume auto 2>&1)
rc=$?
[[ $rc -eq 138 && $out == *"stopped as asked (status 138)"* ]] || fail "a stop asked for is not restarted (status $rc)" "$out"
echo 0 >"$tmp/count"
out=$("$sv" --max-restarts 2 --min-uptime 0 --delay 0 -- sh -c 'echo $(( $(cat '"$tmp"'/count) + 1 )) > '"$tmp"'/count; exit 3' x --resume=auto 2>&1)
rc=$?
[[ $rc -eq 3 && $(cat "$tmp/count") -eq 3 && $out == *"2 restart(s) spent: giving up"* ]] ||
  fail "two restarts, then the last status (status $rc, $(cat "$tmp/count") attempts)" "$out"

# A signal to the supervisor goes to the job, which is then not restarted.
"$sv" --min-uptime 0 --delay 0 -- sh -c 'trap "exit 143" TERM; sleep 30 & wait' x --resume auto >"$tmp/sig.out" 2>&1 &
pid=$!
sleep 1
kill -TERM $pid
t0=$(date +%s)
wait $pid
rc=$?
[[ $rc -eq 143 && $(($(date +%s) - t0)) -lt 10 ]] || fail "SIGTERM to the supervisor ends the job (status $rc)" "$(cat "$tmp/sig.out")"

out=$("$sv" -- sh -c true 2>&1)
[[ $? -eq 2 && $out == *"must hold --resume auto"* ]] || fail "a command without --resume auto is refused" "$out"
out=$("$sv" --delay x -- true --resume auto 2>&1)
[[ $? -eq 2 && $out == *"--delay takes a whole number, not 'x'"* ]] || fail "a bad --delay is refused" "$out"

[ $fails -eq 0 ] && echo "test_supervise: passed" || echo "test_supervise: FAILED ($fails failures)"
exit $((fails > 0))
