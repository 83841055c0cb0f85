# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the scripts that source it
# Shared by start-multinode.sh and stop-multinode.sh (sourced, not run): the names, addresses,
# ports and folders of the multi-node test cluster. Every one differs from the single-node test
# cluster's (cluster-common.sh): its own folder, ports, munged socket, cluster name and host names.
mn_dir=${MESHTRAIN_MN_DIR:-/tmp/meshtrain-multinode}
mn_port=${MESHTRAIN_MN_PORT:-16827}   # slurmctld; each node's slurmd listens on the next port
mn_nodes=${MESHTRAIN_MN_NODES:-4}
mn_racks=${MESHTRAIN_MN_RACKS:-2}
mn_cpus=${MESHTRAIN_MN_CPUS:-2}       # CPUs per node as Slurm counts them (config_overrides)
mn_subnet=${MESHTRAIN_MN_SUBNET:-10.231.0}
mn_bridge=mtmn-br0
mn_ctl=mtmn-ctl                       # slurmctld's host name, at $mn_subnet.1 on the bridge
mn_prefix=mtmn-n                      # nodes mtmn-n1 ... mtmn-nN at $mn_subnet.(10+i)
mn_conf=$mn_dir/etc/slurm.conf
mn_munge_socket=$mn_dir/munge-socket/munge.socket
mn_partition=multinode

mn_node() { echo "$mn_prefix$1"; }
mn_addr() { echo "$mn_subnet.$((10 + $1))"; }
mn_rack_of() { echo $(( ($1 - 1) * mn_racks / mn_nodes + 1 )); }   # nodes split evenly over racks, in order
mn_veth() { echo "mtmn-v$1"; }

# pid from a pid file when alive and running the named program, else nothing.
mn_live_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$2" ] && echo "$pid"
  return 0
}

# Starts node i's slurmd inside the node's network namespace, with the node's host name and the
# cluster's hosts file in a mount namespace of its own. Not `ip netns exec`: it remounts /sys, and
# slurmd 22.05 then finds no cgroup mount and exits.
mn_start_slurmd() {
  local n
  n=$(mn_node "$1")
  nsenter --net="/run/netns/$n" unshare --uts --mount --propagation private \
    sh -c "mount --bind '$mn_dir/etc/hosts' /etc/hosts && hostname $n && exec slurmd -f '$mn_conf' -N $n" </dev/null >/dev/null 2>&1
}

# Waits up to $2 seconds until sinfo shows node i idle; status 1 if it does not.
mn_wait_idle() {
  local t state
  for ((t = 0; t < $2 * 5; t++)); do
    state=$(SLURM_CONF=$mn_conf sinfo -h -n "$(mn_node "$1")" -o %t 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    sleep 0.2
  done
  return 1
}
