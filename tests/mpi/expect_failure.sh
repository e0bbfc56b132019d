#!/bin/sh
# Runs a command that must fail: passes only if it exits non-zero and its output (stdout and
# stderr) contains every PATTERN (grep -E). Used for jobs that must abort rather than hang.
# Usage: expect_failure.sh PATTERN... -- COMMAND [ARGS...]
patterns=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns="$patterns
$1"; shift; done
[ "$1" = "--" ] && shift
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
if [ $rc -eq 0 ]; then echo "expect_failure: command exited 0, expected a failure"; exit 1; fi
fail=0
printf '%s\n' "$patterns" | while IFS= read -r p; do
  [ -z "$p" ] && continue
  printf '%s\n' "$out" | grep -Eq -- "$p" || { echo "expect_failure: output lacks /$p/"; exit 1; }
done || fail=1
[ $fail -eq 0 ] && echo "expect_failure: failed as expected (exit $rc)"
exit $fail
