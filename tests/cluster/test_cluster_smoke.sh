#!/bin/bash
# Smoke test of the emulated cluster: bad input gives clear errors, up.sh is idempotent and
# refuses other settings, check.sh passes (round trips, TCP throughput near the configured rate,
# MPI launch on every host), and down.sh leaves no namespace, file or process behind.
# Needs root and network namespaces; exits 77 (skipped) without them. Optional argument: an MPI
# program to run on 3 hosts (e.g. build/bin/allreduce_bench), checked for a correct result.
# RTC_RELAY=PATH names the netem_relay to test latency with (default: build*/bin/netem_relay).
set -uo pipefail
T="$(cd "$(dirname "$0")/../../tools/cluster" && pwd)"
fail() { echo "FAIL: $*" >&2; "$T/down.sh" >/dev/null 2>&1; exit 1; }
expect_error() {  # message-substring command...
  local want=$1; shift
  local out
  out=$("$@" 2>&1) && fail "'$*' succeeded, expected an error"
  grep -q -- "$want" <<<"$out" || fail "'$*' said '$out', expected '$want'"
}

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
ip netns add rtc-probe 2>/dev/null || { echo "SKIP: cannot create network namespaces"; exit 77; }
ip netns del rtc-probe
if ip netns list | grep -qE '^rtc-(sw|h[0-9]+)\b'; then
  echo "SKIP: an emulated cluster is already up (someone else's run); not touching it"; exit 77
fi
# Interrupted: leave no namespaces behind. (ctest kills a test past its timeout with SIGKILL,
# which no trap sees, so every step that could hang has its own, shorter timeout.)
trap '"$T/down.sh" >/dev/null 2>&1; exit 1' TERM INT

expect_error "is required" "$T/up.sh" --rate 1gbit
expect_error "bad rate unit" "$T/up.sh" --hosts 2 --rate 1gbt
expect_error "bad rate" "$T/up.sh" --hosts 2 --rate fast
expect_error "from 1 to 200" "$T/up.sh" --hosts 0 --rate 1gbit
expect_error "bad latency" "$T/up.sh" --hosts 2 --rate 1gbit --latency 5x
expect_error "no emulated cluster is up" "$T/mpirun.sh" -np 2 true
expect_error "netem_relay" "$T/up.sh" --hosts 2 --rate 1gbit --latency 50us --relay /nonexistent
expect_error "--mtu must be" "$T/up.sh" --hosts 2 --rate 1gbit --latency 50us --mtu 10

"$T/up.sh" --hosts 3 --rate 200mbit >/dev/null || fail "up.sh --hosts 3 --rate 200mbit"
"$T/up.sh" --hosts 3 --rate 200mbit | grep -q "already up" || fail "second up.sh is not a no-op"
expect_error "other settings" "$T/up.sh" --hosts 4 --rate 200mbit
expect_error "exceeds the 3 emulated hosts" "$T/mpirun.sh" -np 4 true
out=$(timeout 40 "$T/check.sh" --seconds 1 2>&1) || fail "check.sh: $out"
bps=$(awk '/^link_bytes_per_s/ {print $2}' <<<"$out")
# 200 Mbit/s = 25 MB/s on the wire; TCP gets at most 95.6 %, and more than the rate means no shaping.
awk -v b="$bps" 'BEGIN { exit !(b > 0.5 * 25e6 && b < 25e6) }' ||
  fail "link throughput $bps B/s is not within (50 %, 100 %) of 200 Mbit/s"
if [ $# -ge 1 ]; then
  res=$(timeout 40 "$T/mpirun.sh" -np 3 "$@" --sizes 1M --budget 0.2 --min-reps 2 2>&1) || fail "$*: $res"
  grep -q '^RESULT,.*,OK,' <<<"$res" || fail "no correct RESULT line from $*: $res"
  grep -q '^RESULT,.*,FAIL' <<<"$res" && fail "wrong allreduce result: $res"
fi

"$T/down.sh" >/dev/null || fail "down.sh"

# Latency through the user-space relay, where it is built: a 2 ms one-way latency makes the UDP
# round trip at least 4 ms, and the rate still holds.
root="$(cd "$T/../.." && pwd)"
relay=${RTC_RELAY:-$(ls "$root"/build*/bin/netem_relay 2>/dev/null | head -1)}
if [ -n "$relay" ]; then
  "$T/up.sh" --hosts 2 --rate 100mbit --latency 2ms --relay "$relay" >/dev/null || fail "up.sh --latency 2ms"
  "$T/up.sh" --hosts 2 --rate 100mbit --latency 2ms --relay "$relay" | grep -q "already up" ||
    fail "second up.sh with latency is not a no-op"
  out=$(timeout 40 "$T/check.sh" --seconds 1 2>&1) || fail "check.sh with latency: $out"
  rtt=$(awk '/^udp_rtt/ {print $3}' <<<"$out")
  bps=$(awk '/^link_bytes_per_s/ {print $2}' <<<"$out")
  awk -v r="$rtt" 'BEGIN { exit !(r >= 4000 && r < 20000) }' || fail "round trip $rtt us with 2 ms one-way latency"
  awk -v b="$bps" 'BEGIN { exit !(b > 0.5 * 12.5e6 && b < 12.5e6) }' ||
    fail "link throughput $bps B/s is not within (50 %, 100 %) of 100 Mbit/s"
  "$T/down.sh" >/dev/null || fail "down.sh after the relay"
  pgrep -f "$relay" >/dev/null && fail "netem_relay still running after down.sh"
else
  echo "note: no build*/bin/netem_relay; latency part skipped"
fi
ip netns list | grep -qE '^rtc-(sw|h[0-9]+)\b' && fail "namespaces left after down.sh"
[ -e /run/ringtrain-cluster ] && fail "/run/ringtrain-cluster left after down.sh"
ls /etc/netns/rtc-* >/dev/null 2>&1 && fail "/etc/netns entries left after down.sh"
"$T/down.sh" >/dev/null || fail "a second down.sh failed"
echo "cluster smoke test passed"
