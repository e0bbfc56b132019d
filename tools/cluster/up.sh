#!/bin/bash
# Brings up an emulated cluster on this machine: N hosts, each a network namespace with its own
# address and a full-duplex link of the given rate to one switch (root; idempotent).
#
# Usage: tools/cluster/up.sh --hosts N --rate RATE [--latency L] [--burst BYTES] [--gso BYTES]
#          [--mtu BYTES] [--relay PATH]
#   --hosts N     number of hosts (1 … 200)
#   --rate R      link rate per direction, tc units: 1gbit, 100mbit, 125mbps (bytes/s) …
#   --latency L   one-way latency host to host: 0 (default), 500us, 2ms … (> 0: user-space relay)
#   --burst B     token bucket depth in bytes (default 64K; must exceed --gso)
#   --gso B       largest segment the veths hand to the qdisc (default 16K)
#   --mtu B       with --latency: MTU of the hosts' links (default 9000: fewer packets to relay)
#   --relay PATH  with --latency: the netem_relay program (default: build*/bin/netem_relay)
#
# Hosts are rtc-h0 … rtc-h<N-1> (namespace name = MPI host name) at 10.77.0.1 … 10.77.0.N/24; the
# switch is the bridge in namespace rtc-sw. Each link is shaped twice, on the host's eth0 (what
# it sends) and on the switch port towards it (what it receives), so a host can send and receive
# at the full rate at once and several senders to one host share its download rate (incast).
# With --latency > 0 (this kernel has no sch_netem) the hosts' eth0 are instead TUN devices of one
# user-space switch process, netem_relay (tools/netem_relay.cc), running in rtc-sw: it paces every
# packet at the rate on the sender's uplink and the receiver's downlink and delivers it the
# latency later. It costs a user-space copy per packet: keep rate × hosts modest.
# Calling up.sh again with the same settings does nothing; with other settings it is an error
# (run down.sh first). Launch MPI onto the hosts with tools/cluster/mpirun.sh, check with
# tools/cluster/check.sh, remove everything with tools/cluster/down.sh.
set -euo pipefail
. "$(dirname "$0")/common.sh"

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2; }
hosts="" rate="" latency="0" burst="64K" gso="16K" mtu=9000 relay=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=${2-}; shift 2 || usage ;;
    --rate) rate=${2-}; shift 2 || usage ;;
    --latency) latency=${2-}; shift 2 || usage ;;
    --burst) burst=${2-}; shift 2 || usage ;;
    --gso) gso=${2-}; shift 2 || usage ;;
    --mtu) mtu=${2-}; shift 2 || usage ;;
    --relay) relay=${2-}; shift 2 || usage ;;
    -h|--help) usage ;;
    *) rtc_die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$hosts" ] || rtc_die "--hosts N is required"
[ -n "$rate" ] || rtc_die "--rate R is required (e.g. --rate 1gbit)"
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] ||
  rtc_die "--hosts must be an integer from 1 to 200 (got '$hosts')"
rate_bits=$(rtc_parse_rate "$rate")
latency_us=$(rtc_parse_latency "$latency")
bytes() {  # 64K, 16k, 1M, 4096 → bytes
  [[ "${1^^}" =~ ^([0-9]+)([KM]?)$ ]] || rtc_die "bad byte count '$1' (examples: 4096, 64K, 1M)"
  case "${BASH_REMATCH[2]}" in K) echo $((BASH_REMATCH[1] * 1024)) ;;
    M) echo $((BASH_REMATCH[1] * 1048576)) ;; *) echo "${BASH_REMATCH[1]}" ;; esac
}
burst_bytes=$(bytes "$burst")
gso_bytes=$(bytes "$gso")
[ "$gso_bytes" -ge 1500 ] && [ "$gso_bytes" -le 65536 ] || rtc_die "--gso must be 1500 … 64K"
[ "$burst_bytes" -gt $((gso_bytes + 1500)) ] ||
  rtc_die "--burst ($burst_bytes) must exceed the largest packet (--gso $gso_bytes + headers), or tbf drops it"
rtc_need_root

if [ "$latency_us" != 0 ]; then
  [[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 576 ] && [ "$mtu" -le 65000 ] || rtc_die "--mtu must be 576 … 65000"
  if [ -z "$relay" ]; then
    root="$(cd "$RTC_TOOLS_DIR/../.." && pwd)"
    for c in "$root"/build/bin/netem_relay "$root"/build*/bin/netem_relay; do
      [ -x "$c" ] && { relay=$c; break; }
    done
  fi
  [ -n "$relay" ] && [ -x "$relay" ] ||
    rtc_die "--latency needs the netem_relay program (this kernel has no sch_netem): build it with 'cmake --build build --target netem_relay' or pass --relay PATH"
  [ -c /dev/net/tun ] || rtc_die "--latency needs TUN devices (/dev/net/tun is missing)"
  relay=$(realpath "$relay")
fi
settings="hosts=$hosts rate_bits=$rate_bits latency_us=$latency_us burst=$burst_bytes gso=$gso_bytes"
[ "$latency_us" != 0 ] && settings="hosts=$hosts rate_bits=$rate_bits latency_us=$latency_us mtu=$mtu"
if rtc_load_state; then
  if [ "$RTC_SETTINGS" = "$settings" ] && ip netns list | grep -qw "$(rtc_host $((hosts - 1)))"; then
    echo "cluster: already up ($RTC_SETTINGS)"
    exit 0
  fi
  rtc_die "a cluster is already up with other settings ($RTC_SETTINGS); run tools/cluster/down.sh first"
fi
if ip netns list | grep -qE "^${RTC_PREFIX}-(sw|h[0-9]+)\b"; then
  rtc_die "leftover namespaces of an earlier cluster exist without a state file; run tools/cluster/down.sh first"
fi

# Anything that fails from here on removes what was made.
trap 'echo "cluster: setup failed; removing what was made" >&2; "$RTC_TOOLS_DIR/down.sh" >/dev/null 2>&1 || true' ERR
mkdir -p "$RTC_STATE_DIR"

# tbf: rate, bucket depth, and a queue of at most 20 ms at the link rate (1 Gbit/s: 2.5 MB).
shape() {  # ns dev
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "${rate_bits}bit" burst "$burst_bytes" latency 20ms
}
quiet_ns() {  # no IPv6 chatter (DAD, router solicitations) on the emulated links
  ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
}

ip netns add "$RTC_SW"
quiet_ns "$RTC_SW"
ip -n "$RTC_SW" link add br0 type bridge stp_state 0 forward_delay 0
ip -n "$RTC_SW" link set lo up
ip -n "$RTC_SW" link set br0 up
# Bridged frames must not go through iptables (br_netfilter, where loaded).
ip netns exec "$RTC_SW" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -e "$f" ] && echo 0 > "$f"; done; true'

hostsfile="$RTC_STATE_DIR/etc-hosts"
{ echo "127.0.0.1 localhost"; echo "127.0.1.1 $(hostname)"
  for ((i = 0; i < hosts; i++)); do echo "$(rtc_addr $i) $(rtc_host $i)"; done; } > "$hostsfile"

if [ "$latency_us" != 0 ]; then
  # The relay creates rtct0 … in the switch namespace and holds them; they move to the hosts.
  ip netns exec "$RTC_SW" setsid "$relay" --hosts "$hosts" --rate "$rate_bits" --latency-us "$latency_us" \
    --subnet "$RTC_SUBNET_BASE" --dev rtct > "$RTC_STATE_DIR/relay.out" 2> "$RTC_STATE_DIR/relay.log" < /dev/null &
  for _ in $(seq 50); do grep -q ready "$RTC_STATE_DIR/relay.out" 2>/dev/null && break; sleep 0.1; done
  grep -q ready "$RTC_STATE_DIR/relay.out" || { cat "$RTC_STATE_DIR/relay.log" >&2; false; }
fi
for ((i = 0; i < hosts; i++)); do
  h=$(rtc_host "$i")
  ip netns add "$h"
  quiet_ns "$h"
  ip -n "$h" link set lo up
  if [ "$latency_us" != 0 ]; then
    ip -n "$RTC_SW" link set "rtct$i" netns "$h"
    ip -n "$h" link set "rtct$i" name eth0
    ip -n "$h" link set eth0 mtu "$mtu"
    ip -n "$h" link set eth0 up
  else
    ip link add "p$i" netns "$RTC_SW" type veth peer name eth0 netns "$h"
    for end in "$RTC_SW p$i" "$h eth0"; do
      set -- $end
      ip -n "$1" link set dev "$2" gso_max_size "$gso_bytes"
      ip -n "$1" link set dev "$2" up
      shape "$1" "$2"
    done
    ip -n "$RTC_SW" link set "p$i" master br0
  fi
  ip -n "$h" addr add "$(rtc_addr "$i")/24" dev eth0
  # `ip netns exec` shows /etc/netns/<ns>/hosts as /etc/hosts: host names resolve inside.
  mkdir -p "/etc/netns/$h"
  cp "$hostsfile" "/etc/netns/$h/hosts"
done

{ for ((i = 0; i < hosts; i++)); do echo "$(rtc_host $i) slots=1"; done; } > "$RTC_STATE_DIR/hostfile"
cat > "$RTC_STATE_DIR/state" <<EOF
RTC_HOSTS=$hosts
RTC_RATE='$rate'
RTC_RATE_BITS=$rate_bits
RTC_LATENCY_US=$latency_us
RTC_SETTINGS='$settings'
EOF
trap - ERR
if [ "$latency_us" != 0 ]; then
  link="latency $latency_us us one way, MTU $mtu, through netem_relay"
else
  link="burst $burst_bytes B, gso $gso_bytes B"
fi
echo "cluster: up: $hosts hosts $(rtc_host 0) … $(rtc_host $((hosts - 1))) at $(rtc_addr 0) … $(rtc_addr $((hosts - 1))), $rate per direction ($rate_bits bit/s), $link"
echo "cluster: run MPI with: tools/cluster/mpirun.sh -np $hosts PROGRAM [ARGS]; check with tools/cluster/check.sh; remove with tools/cluster/down.sh"
