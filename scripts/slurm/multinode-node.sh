#!/usr/bin/env bash
# Breaks or mends one node of the multi-node test cluster (start-multinode.sh), for the node
# failure tests:
#   multinode-node.sh kill I      SIGKILL every process of node I (slurmd, job steps): a crashed node
#   multinode-node.sh cut I       take node I's link down; its processes keep running, unreachable
#   multinode-node.sh restore I   like a reboot: what still runs there is killed, link up, a fresh
#                                 slurmd, and wait (60 s at most) until Slurm shows the node idle
# Exit status 0 on success, 1 otherwise (the reason on stderr).
set -uo pipefail
export PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=multinode-common.sh
. "$here/multinode-common.sh"
[ $# -eq 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || { echo "usage: multinode-node.sh kill|cut|restore I" >&2; exit 2; }
n=$(mn_node "$2")
[ -e "/run/netns/$n" ] || { echo "multinode-node.sh: no node $n (is the cluster up?)" >&2; exit 1; }
case "$1" in
  kill)
    pids=$(ip netns pids "$n")
    [ -z "$pids" ] || kill -KILL $pids ;;
  cut) ip link set "$(mn_veth "$2")" down ;;
  restore)
    # Like a reboot: whatever still runs there (a cut node's slurmd and stale step daemons) goes,
    # and a fresh slurmd registers at once instead of at its next ping of the controller.
    pids=$(ip netns pids "$n")
    [ -z "$pids" ] || kill -KILL $pids
    ip link set "$(mn_veth "$2")" up
    mn_start_slurmd "$2" || { echo "multinode-node.sh: slurmd of $n did not start" >&2; exit 1; }
    mn_wait_idle "$2" 60 || { echo "multinode-node.sh: $n not idle after 60 s" >&2; exit 1; } ;;
  *) echo "usage: multinode-node.sh kill|cut|restore I" >&2; exit 2 ;;
esac
