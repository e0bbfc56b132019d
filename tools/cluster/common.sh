# Shared definitions of the emulated cluster scripts (sourced, not run).
#
# Layout: one network namespace per host (rtc-h0 … rtc-h<N-1>, address 10.77.0.<i+1>/24 on its
# eth0) and one switch namespace (rtc-sw) holding a bridge with one veth port per host. Each link
# is shaped by a token bucket (tc tbf) on both ends: the host's eth0 (upload) and the switch port
# towards it (download), so every host has a full-duplex link of the chosen rate, like a port of a
# non-blocking switch.

RTC_PREFIX=${RTC_PREFIX:-rtc}
RTC_SW="${RTC_PREFIX}-sw"
RTC_STATE_DIR=${RTC_STATE_DIR:-/run/ringtrain-cluster}
RTC_SUBNET_BASE=${RTC_SUBNET_BASE:-10.77.0}
RTC_SUBNET="${RTC_SUBNET_BASE}.0/24"
RTC_TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

rtc_die() { echo "cluster: error: $*" >&2; exit 1; }
rtc_host() { echo "${RTC_PREFIX}-h$1"; }              # namespace = MPI host name of host i
rtc_addr() { echo "${RTC_SUBNET_BASE}.$(($1 + 1))"; }  # address of host i
# The hosts share this machine's hostname and /tmp, and Open MPI names its session directories
# (/tmp/ompi.<hostname>.<uid>/...) by hostname: daemons starting at once on two emulated hosts
# then race to create the same directories and write the same topology file, and one of them
# fails (mkdir "File exists", or a crash in hwloc). Each host gets a temporary directory of its
# own, as separate machines have, through TMPDIR (where Open MPI puts its session directory).
rtc_tmpdir() {  # HOST: creates and prints the host's TMPDIR
  local d="$RTC_STATE_DIR/tmp/$1"
  mkdir -p "$d" && echo "$d"
}

rtc_need_root() {
  [ "$(id -u)" = 0 ] || rtc_die "must run as root (network namespaces and tc need CAP_NET_ADMIN)"
  command -v ip >/dev/null || rtc_die "'ip' (iproute2) not found"
  command -v tc >/dev/null || rtc_die "'tc' (iproute2) not found"
}

# Rate in tc's units → bits per second on stdout (integer). bit/kbit/mbit/gbit/tbit are bits per
# second (SI), bps/kbps/mbps/gbps bytes per second, as in tc(8).
rtc_parse_rate() {
  local s="${1,,}" num unit mult
  [[ "$s" =~ ^([0-9]+([.][0-9]+)?)([a-z]*)$ ]] ||
    rtc_die "bad rate '$1' (examples: 1gbit, 100mbit, 125mbps)"
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
  case "$unit" in
    bit|"") mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;;
    tbit) mult=1000000000000 ;;
    bps) mult=8 ;; kbps) mult=8000 ;; mbps) mult=8000000 ;; gbps) mult=8000000000 ;;
    *) rtc_die "bad rate unit in '$1' (use bit, kbit, mbit, gbit or bps, kbps, mbps, gbps)" ;;
  esac
  local bits
  bits=$(awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f", n * m }')
  [ "$bits" -ge 8000 ] 2>/dev/null || rtc_die "rate '$1' is too low (at least 8kbit)"
  echo "$bits"
}

# Latency → microseconds on stdout (integer). Units us, ms, s; a bare number is microseconds.
rtc_parse_latency() {
  local s="${1,,}" num unit mult
  [[ "$s" =~ ^([0-9]+([.][0-9]+)?)(us|ms|s|)$ ]] ||
    rtc_die "bad latency '$1' (examples: 0, 50us, 1ms)"
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
  case "$unit" in us|"") mult=1 ;; ms) mult=1000 ;; s) mult=1000000 ;; esac
  awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f", n * m }'
}

# Reads the state of a cluster that is up into RTC_HOSTS, RTC_RATE_BITS, RTC_LATENCY_US, RTC_RATE;
# returns 1 when none is up.
rtc_load_state() {
  [ -f "$RTC_STATE_DIR/state" ] || return 1
  # shellcheck disable=SC1091
  . "$RTC_STATE_DIR/state"
}

rtc_need_up() {
  rtc_load_state || rtc_die "no emulated cluster is up (start one with tools/cluster/up.sh --hosts N --rate R)"
  ip netns list | grep -qw "$(rtc_host 0)" ||
    rtc_die "state file $RTC_STATE_DIR/state exists but namespace $(rtc_host 0) does not: run tools/cluster/down.sh, then up.sh"
}
