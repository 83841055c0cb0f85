#!/usr/bin/env bash
# Tears down what start-multinode.sh made, leaving nothing behind: cancels the cluster's jobs,
# kills every process inside the node namespaces (slurmd, job steps), stops slurmctld and
# munged, deletes the namespaces, links and bridge, and unmounts /run/netns when no namespace is
# left. Logs stay in $MESHTRAIN_MN_DIR/log. Safe to run when nothing runs.
#   scripts/slurm/stop-multinode.sh
set -uo pipefail
export PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=multinode-common.sh
. "$here/multinode-common.sh"
export SLURM_CONF=$mn_conf
ctl=$(mn_live_pid "$mn_dir/run/slurmctld.pid" slurmctld)
if [ -n "$ctl" ]; then
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  [ -z "$jobs" ] || scancel $jobs 2>/dev/null
fi
for ((i = 1; i <= 64; i++)); do
  n=$(mn_node $i)
  [ -e "/run/netns/$n" ] || continue
  pids=$(ip netns pids "$n" 2>/dev/null)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
  ip netns delete "$n" 2>/dev/null
  ip link delete "$(mn_veth $i)" 2>/dev/null
done
for daemon in slurmctld munged; do
  pid=$(mn_live_pid "$mn_dir/run/$daemon.pid" "$daemon")
  [ -z "$pid" ] && continue
  kill -TERM "$pid" 2>/dev/null
  for ((t = 0; t < 100; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
done
ip link delete "$mn_bridge" 2>/dev/null
# `ip netns add` mounted /run/netns (and bound each namespace there); unmount it once empty.
if [ -d /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ] && mountpoint -q /run/netns; then
  umount /run/netns 2>/dev/null
fi
[ -d /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ] && rmdir /run/netns 2>/dev/null
echo "stop-multinode.sh: stopped ($mn_dir)"
exit 0
