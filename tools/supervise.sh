#!/usr/bin/env bash
# Runs a training job again after it fails, as torchrun's --max-restarts does: a rank that dies
# (a lost node, a driver error) takes the whole job down with it, and the next attempt continues
# from the newest checkpoint (the command must hold `--resume auto`).
#
#   tools/supervise.sh [--max-restarts 3] [--delay 10] [--min-uptime 60] -- COMMAND...
#   e.g. tools/supervise.sh -- mpirun -np 8 build/bin/trainer --config configs/resnet50.yaml --resume auto
#
# Not restarted: a success (status 0); a stop that was asked for (the trainer's 128 + SIGINT,
# SIGUSR1, SIGUSR2 or SIGTERM: 130, 138, 140, 143), which the next job of the batch system
# continues; a failure within --min-uptime seconds of the attempt's start (a configuration error
# or a missing file fails the same way every time: not worth --max-restarts attempts); and any
# attempt after SIGINT, SIGTERM, SIGUSR1 or SIGUSR2 reached this script, which passes the signal
# on to the command. Exit status: the last attempt's.
set -uo pipefail

max_restarts=3 delay=10 min_uptime=60
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
number() {  # number NAME VALUE: a whole number of 0 or more, else usage status 2
  [[ $2 =~ ^[0-9]+$ ]] || { echo "supervise.sh: $1 takes a whole number, not '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case "$1" in
    --max-restarts|--delay|--min-uptime)
      [ $# -ge 2 ] || { echo "supervise.sh: $1 needs a value" >&2; exit 2; }
      number "$1" "$2"
      case "$1" in --max-restarts) max_restarts=$2 ;; --delay) delay=$2 ;; *) min_uptime=$2 ;; esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "supervise.sh: unknown argument '$1' (the command goes after --)" >&2; usage >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "supervise.sh: no command after --" >&2; exit 2; }
# A restart must continue the run, not start it over (or set its checkpoints aside).
resume=0
for ((i = 1; i < $#; i++)); do
  [ "${!i}" = --resume ] && j=$((i + 1)) && [ "${!j}" = auto ] && resume=1
done
for a in "$@"; do [ "$a" = --resume=auto ] && resume=1; done
[ $resume = 1 ] || { echo "supervise.sh: the command must hold --resume auto (a restart continues the run)" >&2; exit 2; }

stopping=""  # the signal that reached this script, passed on
child=0
pass_on() {
  stopping=$1
  [ $child -gt 0 ] && kill -s "$1" "$child" 2>/dev/null
}
for sig in INT TERM USR1 USR2; do trap "pass_on $sig" "$sig"; done

attempt=0
while :; do
  attempt=$((attempt + 1))
  started=$(date +%s)
  "$@" &
  child=$!
  # wait returns early when a trapped signal arrives: wait again for the command's own status.
  while :; do
    wait "$child"
    rc=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=0
  ran=$(($(date +%s) - started))
  case $rc in
    0) exit 0 ;;
    130|138|140|143) echo "supervise.sh: the job stopped as asked (status $rc): not restarted" >&2; exit $rc ;;
  esac
  if [ -n "$stopping" ]; then
    echo "supervise.sh: SIG$stopping was passed on to the job, which ended with status $rc: not restarted" >&2
    exit $rc
  fi
  if [ $ran -lt "$min_uptime" ]; then
    echo "supervise.sh: attempt $attempt failed (status $rc) within $ran s of its start, under --min-uptime" \
      "$min_uptime: a failure at start-up repeats; not restarted" >&2
    exit $rc
  fi
  if [ $((attempt - 1)) -ge "$max_restarts" ]; then
    echo "supervise.sh: attempt $attempt failed (status $rc) after $ran s; $max_restarts restart(s) spent: giving up" >&2
    exit $rc
  fi
  echo "supervise.sh: attempt $attempt failed (status $rc) after $ran s; restarting in $delay s" \
    "($((max_restarts - attempt + 1)) restart(s) left)" >&2
  sleep "$delay" &
  child=$!
  wait $child
  child=0
  [ -n "$stopping" ] && { echo "supervise.sh: SIG$stopping while waiting to restart: not restarted" >&2; exit $rc; }
done
