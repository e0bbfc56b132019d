#!/bin/bash
# Quick self-check of the emulated cluster: UDP round trip from host 0 to every other host, TCP
# throughput of one link (host 1 → host 0) against the configured rate, and an MPI launch on all
# hosts. Exits non-zero on any failure. `--seconds S` sets the throughput test's length (2).
# `--ring` also measures every link at once, host i sending to host i+1 (mod N) as a ring
# allreduce does: what the machine's cores can carry for all N links together.
#
# `link_bytes_per_s B` is the measured TCP throughput of one link: the B of the bandwidth bound
# 2(N−1)/N · S/B; with --ring, `ring_link_bytes_per_s MIN MEAN` gives the links under full load.
set -euo pipefail
. "$(dirname "$0")/common.sh"
rtc_need_root
rtc_need_up
seconds=2 ring=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --ring) ring=1; shift ;;
    *) rtc_die "unknown argument '$1' (use --seconds S, --ring)" ;;
  esac
done
PY=/usr/bin/python3
NC="$RTC_TOOLS_DIR/netcheck.py"
h0=$(rtc_host 0)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "cluster: $RTC_HOSTS hosts, rate $RTC_RATE ($RTC_RATE_BITS bit/s)"
for ((i = 1; i < RTC_HOSTS; i++)); do
  ip netns exec "$(rtc_host $i)" $PY "$NC" echo --port 5301 & pids+=($!)
done
sleep 0.3
for ((i = 1; i < RTC_HOSTS; i++)); do
  ip netns exec "$h0" $PY "$NC" ping "$(rtc_host $i)" --port 5301 --count 10 ||
    rtc_die "$(rtc_host 0) cannot reach $(rtc_host $i)"
done
cleanup; pids=()

if [ "$RTC_HOSTS" -ge 2 ]; then
  ip netns exec "$h0" $PY "$NC" sink --port 5302 & pids+=($!)
  line=$(ip netns exec "$(rtc_host 1)" $PY "$NC" send "$h0" --port 5302 --seconds "$seconds") ||
    rtc_die "TCP throughput test $(rtc_host 1) → $h0 failed"
  wait "${pids[0]}" || true; pids=()
  echo "$line"
  bps=$(echo "$line" | awk '{print $5}')
  awk -v b="$bps" -v r="$RTC_RATE_BITS" 'BEGIN {
    printf "tcp goodput %.1f Mbit/s = %.1f%% of the configured %.1f Mbit/s (TCP/IP/Ethernet headers leave at most %.1f%% at MTU 1500)\n",
      b * 8 / 1e6, 100 * b * 8 / r, r / 1e6, 100 * 1448 / 1514 }'
  awk -v b="$bps" -v r="$RTC_RATE_BITS" 'BEGIN { exit !(b * 8 > 0.5 * r) }' ||
    rtc_die "the link carries less than half its configured rate: the machine is probably overloaded"
fi

if [ $ring = 1 ] && [ "$RTC_HOSTS" -ge 2 ]; then
  tmp=$(mktemp -d)
  for ((i = 0; i < RTC_HOSTS; i++)); do
    ip netns exec "$(rtc_host $(((i + 1) % RTC_HOSTS)))" $PY "$NC" sink --port 5303 & pids+=($!)
  done
  sleep 0.3
  senders=()
  for ((i = 0; i < RTC_HOSTS; i++)); do
    ip netns exec "$(rtc_host $i)" $PY "$NC" send "$(rtc_host $(((i + 1) % RTC_HOSTS)))" --port 5303 \
      --seconds "$seconds" > "$tmp/$i" & senders+=($!)
  done
  for p in "${senders[@]}"; do wait "$p" || rtc_die "a ring throughput sender failed"; done
  for p in "${pids[@]}"; do wait "$p" || true; done; pids=()
  cat "$tmp"/* | awk -v n="$RTC_HOSTS" '{ b = $5; s += b; if (min == "" || b < min) min = b }
    END { printf "ring: %d links at once: min %.1f, mean %.1f Mbit/s per link\nring_link_bytes_per_s %.0f %.0f\n",
          n, min * 8 / 1e6, s / n * 8 / 1e6, min, s / n }'
  rm -rf "$tmp"
fi

out=$("$RTC_TOOLS_DIR/mpirun.sh" -np "$RTC_HOSTS" bash -c 'ip -4 -o addr show dev eth0 | awk "{print \$4}"' | sort -V | tr '\n' ' ')
n=$(echo "$out" | wc -w)
[ "$n" = "$RTC_HOSTS" ] || rtc_die "MPI launch reached $n of $RTC_HOSTS hosts: $out"
echo "mpi launch: $RTC_HOSTS ranks on $out"
[ "$RTC_HOSTS" -ge 2 ] && echo "link_bytes_per_s $bps"
echo "cluster: check passed"
