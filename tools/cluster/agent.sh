#!/bin/bash
# OpenMPI's launch agent for the emulated cluster (in place of ssh): `agent.sh HOST COMMAND…` runs
# COMMAND inside the network namespace named HOST, through a shell, as ssh would.
set -euo pipefail
. "$(dirname "$0")/common.sh"
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done  # ssh-style options: none apply here
[ $# -ge 2 ] || { echo "cluster agent: usage: agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
[[ "$host" =~ ^[a-z]+-h[0-9]+$ ]] && ip netns list | awk '{print $1}' | grep -qx "$host" ||
  { echo "cluster agent: no emulated host '$host' (is the cluster up?)" >&2; exit 255; }
TMPDIR=$(rtc_tmpdir "$host")
export TMPDIR
# Each host also gets a hostname of its own (a UTS namespace), as separate machines have: Open MPI
# tells nodes apart, and names its shared-memory segments in /dev/shm, by hostname.
exec ip netns exec "$host" unshare --uts /bin/bash -c 'hostname "$0" && eval "$1"' "$host" "$*"
