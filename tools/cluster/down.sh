#!/bin/bash
# Removes the emulated cluster: ends the processes still running inside its namespaces, deletes
# the namespaces (their veths and the bridge go with them), the per-host /etc/netns files and the
# state directory. Safe to run at any time, also when nothing is up.
set -uo pipefail
. "$(dirname "$0")/common.sh"
[ "$(id -u)" = 0 ] || rtc_die "must run as root"

mapfile -t spaces < <(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${RTC_PREFIX}-(sw|h[0-9]+)$")
# Processes left in the hosts (an interrupted mpirun, orted, ranks): TERM, then KILL.
for sig in TERM KILL; do
  pids=()
  for ns in "${spaces[@]}"; do
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
  done
  [ ${#pids[@]} -eq 0 ] && break
  kill -s "$sig" "${pids[@]}" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
done
for ns in "${spaces[@]}"; do
  ip netns del "$ns" || echo "cluster: could not delete namespace $ns" >&2
  rm -rf "/etc/netns/$ns"
done
rm -rf "$RTC_STATE_DIR"
rmdir /etc/netns 2>/dev/null || true  # made by up.sh; kept if anything else lives there
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -cE "^${RTC_PREFIX}-(sw|h[0-9]+)$")
if [ "$left" != 0 ]; then rtc_die "$left namespace(s) could not be removed"; fi
echo "cluster: down (${#spaces[@]} namespaces removed)"
