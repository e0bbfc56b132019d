#!/bin/bash
# Launches an MPI job onto the emulated cluster, one rank per host (rank i on host rtc-h<i>), or
# K per host with --per-host K (ranks K·i … K·i+K-1 on host i; add --map-by node for round-robin):
#
#   tools/cluster/mpirun.sh [--print] [--per-host K] -np N [more mpirun options] PROGRAM [ARGS]
#
# mpirun itself runs inside the first host's namespace; OpenMPI starts its daemons on the other
# hosts through agent.sh (ip netns exec instead of ssh); ranks on different hosts talk TCP over the
# emulated links only, ranks on one host through shared memory (vader), as on a real node.
# --print shows the command instead of running it.
set -euo pipefail
. "$(dirname "$0")/common.sh"
rtc_need_root
rtc_need_up

print=0 per_host=1
[ "${1-}" = "--print" ] && { print=1; shift; }
if [ "${1-}" = "--per-host" ]; then
  per_host=${2-}
  [[ "$per_host" =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] ||
    rtc_die "--per-host needs a positive integer (got '$per_host')"
  shift 2
fi
[ "${1-}" = "-np" ] || [ "${1-}" = "-n" ] ||
  rtc_die "usage: tools/cluster/mpirun.sh [--print] [--per-host K] -np N [mpirun options] PROGRAM [ARGS]"
np=${2-}
[[ "$np" =~ ^[0-9]+$ ]] && [ "$np" -ge 1 ] || rtc_die "-np needs a positive integer (got '$np')"
[ "$np" -le $((RTC_HOSTS * per_host)) ] ||
  rtc_die "-np $np exceeds the $RTC_HOSTS emulated hosts × $per_host ranks per host (bring up more with down.sh + up.sh --hosts N, or raise --per-host)"
shift 2
hostfile="$RTC_STATE_DIR/hostfile"
btl=tcp,self
if [ "$per_host" -gt 1 ]; then
  hostfile="$RTC_STATE_DIR/hostfile.$per_host"
  { for ((i = 0; i < RTC_HOSTS; i++)); do echo "$(rtc_host $i) slots=$per_host"; done; } > "$hostfile"
  btl=tcp,self,vader
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TMPDIR=$(rtc_tmpdir "$(rtc_host 0)")
export TMPDIR
# --leave-session-attached: a daemon that fails after starting (a detached one would exit
# silently) is reported by mpirun, which then ends the job instead of waiting for it forever.
# The first host's hostname too (agent.sh gives the others theirs).
cmd=(ip netns exec "$(rtc_host 0)" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$(rtc_host 0)"
  mpirun -np "$np" --leave-session-attached
  --hostfile "$hostfile"
  --mca plm_rsh_agent "$RTC_TOOLS_DIR/agent.sh" --mca plm_rsh_no_tree_spawn 1
  --mca pml ob1 --mca btl "$btl"
  --mca btl_tcp_if_include "$RTC_SUBNET" --mca oob_tcp_if_include "$RTC_SUBNET"
  --bind-to none --mca mpi_yield_when_idle 1
  "$@")
if [ $print = 1 ]; then
  printf 'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=%q' "$TMPDIR"
  printf ' %q' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
