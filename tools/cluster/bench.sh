#!/bin/bash
# Allreduce on the emulated cluster: for each N, brings up N hosts at the given rate, measures one
# link's TCP throughput (check.sh), then runs allreduce_bench with our ring and reducer and
# OpenMPI's MPI_Allreduce (its default choice, then with its ring forced), one rank per host, or
# K per host (--per-host K: N/K hosts, ranks K·i … K·i+K-1 on host i, shared memory between them;
# with --map-by node, rank r on host r mod N/K instead, as a cyclic launcher places them).
# Tears the cluster down at the end (also on failure or Ctrl-C).
#
# Usage: tools/cluster/bench.sh [--rate 1gbit] [--latency 0] [--np "2 4 8"] [--sizes 1M,4M,16M,64M]
#          [--budget 1] [--min-reps 3] [--bin build/bin/allreduce_bench] [--out DIR]
#          [--algos ring,reducer,openmpi] [--extra "ARGS for allreduce_bench"]
#          [--per-host K] [--map-by node]
#
# Writes DIR/results.csv: the RESULT lines of every run (the forced-ring OpenMPI column is named
# openmpi-ring) and one `LINK,N,bytes_per_s` line per N; feed it to tools/costmodel.py.
set -euo pipefail
. "$(dirname "$0")/common.sh"
rate=1gbit latency=0 nps="2 4 8" sizes=1M,4M,16M,64M budget=1 minreps=3 algos=ring,reducer,openmpi extra=""
bin=build/bin/allreduce_bench out="" per_host=1 map_by=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=$2 ;; --latency) latency=$2 ;; --np) nps=$2 ;; --sizes) sizes=$2 ;; --budget) budget=$2 ;;
    --min-reps) minreps=$2 ;; --bin) bin=$2 ;; --out) out=$2 ;; --algos) algos=$2 ;;
    --extra) extra=$2 ;; --per-host) per_host=$2 ;; --map-by) map_by=$2 ;;
    *) rtc_die "unknown argument '$1'" ;;
  esac
  shift 2
done
rtc_need_root
[ -x "$bin" ] || rtc_die "$bin not found: build it (cmake --build BUILD --target allreduce_bench) or pass --bin"
bin=$(realpath "$bin")
# Every argument checked before anything is torn down or written: a typo must not cost a cluster
# that was up, nor an earlier run's results.
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || rtc_die "--per-host needs a positive integer (got '$per_host')"
[ -z "$map_by" ] || [ "$map_by" = node ] || [ "$map_by" = slot ] || rtc_die "--map-by takes node or slot (got '$map_by')"
for n in $nps; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || rtc_die "--np takes positive rank counts (got '$n')"
  [ $((n % per_host)) = 0 ] || rtc_die "-np $n is not a multiple of --per-host $per_host"
done
out=${out:-scaling-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
T="$RTC_TOOLS_DIR"
trap '"$T/down.sh" >/dev/null 2>&1 || true' EXIT
"$T/down.sh" >/dev/null

# Written aside and moved over results.csv at the end: a run that fails leaves the earlier
# results whole (and its own partial ones in results.csv.partial).
res="$out/results.csv.partial"
: > "$res"
launch=("$T/mpirun.sh")
[ "$per_host" = 1 ] || launch+=(--per-host "$per_host")
place=()
[ -z "$map_by" ] || place=(--map-by "$map_by")
for n in $nps; do
  hosts=$((n / per_host))
  "$T/up.sh" --hosts "$hosts" --rate "$rate" --latency "$latency" > "$out/up_np$n.txt"
  head -1 "$out/up_np$n.txt"
  if [ "$hosts" -ge 2 ]; then
    "$T/check.sh" | tee "$out/check_np$n.txt"
    echo "LINK,$n,$(awk '/^link_bytes_per_s/ {print $2}' "$out/check_np$n.txt")" >> "$res"
  fi
  echo "# np=$n: $algos"
  # shellcheck disable=SC2086
  "${launch[@]}" -np "$n" "${place[@]}" "$bin" --algos "$algos" --sizes "$sizes" --budget "$budget" \
    --min-reps "$minreps" $extra | tee -a "$res"
  if [[ ",$algos," == *,openmpi,* ]]; then
    echo "# np=$n: openmpi with its ring forced (coll_tuned_allreduce_algorithm 4)"
    # shellcheck disable=SC2086
    "${launch[@]}" -np "$n" "${place[@]}" --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 \
      "$bin" --algos openmpi --sizes "$sizes" --budget "$budget" --min-reps "$minreps" $extra |
      sed 's/^RESULT,openmpi,/RESULT,openmpi-ring,/' | tee -a "$res"
  fi
  "$T/down.sh" >/dev/null
done
mv "$res" "$out/results.csv"
echo "# results in $out/results.csv"
