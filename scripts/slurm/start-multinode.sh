#!/usr/bin/env bash
# Starts a real multi-node Slurm cluster on this one machine for the cluster tests (ctest label
# `cluster`): each node is a network namespace with its own address on a bridge, its own host
# name (a UTS namespace) and its own slurmd; slurmctld runs on the bridge's address; topology/tree
# puts the nodes into racks. Open MPI, launched by `srun --mpi=pmix`, sees separate hosts and talks
# TCP between them, so rank placement, node-local groups and node failures are real.
#
#   scripts/slurm/start-multinode.sh [--state FILE]
#   export SLURM_CONF=/tmp/meshtrain-multinode/etc/slurm.conf; sinfo; sbatch ...
#   scripts/slurm/stop-multinode.sh               (removes daemons, namespaces, links and mounts)
#
# MESHTRAIN_MN_NODES (default 4) nodes in MESHTRAIN_MN_RACKS (default 2) racks, named
# mtmn-n1..N at 10.231.0.11.. (MESHTRAIN_MN_SUBNET), MESHTRAIN_MN_CPUS (default 2) CPUs each;
# slurmctld `mtmn-ctl` at 10.231.0.1:16827 (MESHTRAIN_MN_PORT), slurmd on the next port in each
# namespace; everything under /tmp/meshtrain-multinode (MESHTRAIN_MN_DIR). A node whose processes
# die is DOWN about 20 s later (SlurmdTimeout=10).
#
# Exit status (FILE gets status=, reason=, SLURM_CONF=, nodes=):
#   0 up; 77 this machine cannot (not root, no CAP_NET_ADMIN, Slurm / munge / iproute2 missing,
#   srun without pmix); 1 it did not come up (reason and log tails on stderr; nothing left behind).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=multinode-common.sh
. "$here/multinode-common.sh"
# shellcheck source-path=SCRIPTDIR source=conf-common.sh
. "$here/conf-common.sh"
state=""
[ $# -eq 2 ] && [ "$1" = --state ] && state=$2
[ $# -eq 0 ] || [ -n "$state" ] || { echo "usage: start-multinode.sh [--state FILE]" >&2; exit 2; }
write_state() { [ -z "$state" ] || { mkdir -p "$(dirname "$state")"; printf '%s\n' "$@" > "$state"; }; }
skip() { echo "start-multinode.sh: SKIPPED: $*" >&2; write_state status=skip "reason=$*"; exit 77; }
fail() {
  echo "start-multinode.sh: FAILED: $*" >&2
  for log in "$mn_dir"/log/*.log; do [ -s "$log" ] && { echo "--- $log (tail)" >&2; tail -n 8 "$log" >&2; }; done
  "$here/stop-multinode.sh" >/dev/null 2>&1 || true
  write_state status=failed "reason=$*"
  exit 1
}

[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces and slurmd need root)"
for p in ip nsenter unshare munged mungekey munge slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$p" >/dev/null 2>&1 || skip "not installed: $p (Debian: apt-get install iproute2 util-linux slurm-wlm munge)"
done
srun --mpi=list 2>&1 | grep -qw pmix || true   # needs a config; checked again once ours exists
probe=mtmn-probe$$
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces (no CAP_NET_ADMIN)"
ip netns delete "$probe"
"$here/stop-multinode.sh" >/dev/null 2>&1 || true   # a crashed earlier run's leftovers

mkdir -p "$mn_dir"/{etc,spool,log,run,munge,munge-socket,tmp}
chmod 700 "$mn_dir/munge"
chmod 755 "$mn_dir" "$mn_dir/munge-socket"
[ -s "$mn_dir/munge/munge.key" ] || mungekey --create --keyfile="$mn_dir/munge/munge.key"

# The network: a bridge in this namespace, one namespace per node wired to it by a veth pair.
ip link add "$mn_bridge" type bridge || fail "cannot create bridge $mn_bridge"
ip addr add "$mn_subnet.1/24" dev "$mn_bridge"
ip link set "$mn_bridge" up
hosts=$mn_dir/etc/hosts
printf '127.0.0.1 localhost\n%s.1 %s\n' "$mn_subnet" "$mn_ctl" > "$hosts"
nodes=""
for ((i = 1; i <= mn_nodes; i++)); do
  n=$(mn_node $i)
  ip netns add "$n"
  ip link add "$(mn_veth $i)" type veth peer name eth0 netns "$n"
  ip link set "$(mn_veth $i)" master "$mn_bridge" up
  ip -n "$n" addr add "$(mn_addr $i)/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
  ip -n "$n" route add default via "$mn_subnet.1"
  mkdir -p "$mn_dir/spool/$n" "$mn_dir/tmp/$n"   # per node: slurmd's spool and PMIx's socket folders
  echo "$(mn_addr $i) $n" >> "$hosts"
  nodes+="${nodes:+,}$n"
done

# topology/tree: racks of consecutive nodes under one top switch (SLURM_TOPOLOGY_ADDR top.rackR.NODE).
{
  for ((r = 1; r <= mn_racks; r++)); do
    members=""
    for ((i = 1; i <= mn_nodes; i++)); do [ "$(mn_rack_of $i)" = "$r" ] && members+="${members:+,}$(mn_node $i)"; done
    echo "SwitchName=rack$r Nodes=$members"
  done
  echo "SwitchName=top Switches=rack[1-$mn_racks]"
} > "$mn_dir/etc/topology.conf"
hw=$(slurmd -C | head -1)
memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$hw")
cat > "$mn_conf" <<CONF
# Written by scripts/slurm/start-multinode.sh: a multi-node test cluster of network namespaces.
ClusterName=meshtrain-multinode
SlurmctldHost=$mn_ctl($mn_subnet.1)
SlurmctldPort=$mn_port
SlurmdPort=$((mn_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$mn_munge_socket,cred_expire=10
StateSaveLocation=$mn_dir/spool/ctld
SlurmdSpoolDir=$mn_dir/spool/%n
TmpFS=$mn_dir/tmp/%n
SlurmctldPidFile=$mn_dir/run/slurmctld.pid
SlurmdPidFile=$mn_dir/run/slurmd-%n.pid
SlurmctldLogFile=$mn_dir/log/slurmctld.log
SlurmdLogFile=$mn_dir/log/slurmd-%n.log
$(slurm_test_conf_common)
TopologyPlugin=topology/tree
SlurmctldTimeout=30
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=600
JobRequeue=1
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
NodeName=DEFAULT CPUs=$mn_cpus Sockets=1 CoresPerSocket=$mn_cpus ThreadsPerCore=1 RealMemory=$((memory / mn_nodes)) State=UNKNOWN
CONF
for ((i = 1; i <= mn_nodes; i++)); do echo "NodeName=$(mn_node $i) NodeAddr=$(mn_addr $i)" >> "$mn_conf"; done
echo "PartitionName=$mn_partition Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" >> "$mn_conf"
chmod 644 "$mn_conf" "$mn_dir/etc/topology.conf" "$hosts"
export SLURM_CONF=$mn_conf
srun --mpi=list 2>&1 | grep -qw pmix || skip "srun lists no pmix MPI plugin (srun --mpi=list)"

for log in munged slurmctld; do : > "$mn_dir/log/$log.log"; done
why=$(start_test_munged "$mn_dir" "$mn_munge_socket") || fail "$why"
# slurmctld checks that its host name is SlurmctldHost's: a UTS namespace of its own gives it one.
unshare --uts sh -c "hostname $mn_ctl && exec slurmctld -c -f '$mn_conf'" </dev/null >/dev/null 2>&1 ||
  fail "slurmctld did not start"
for ((i = 1; i <= mn_nodes; i++)); do
  mn_start_slurmd $i || fail "slurmd of $(mn_node $i) did not start"
done
for ((t = 0; t < 300; t++)); do
  idle=$(sinfo -h -p "$mn_partition" -t idle -o %D 2>/dev/null || true)
  [ "${idle:-0}" = "$mn_nodes" ] && break
  sleep 0.2
done
[ "${idle:-0}" = "$mn_nodes" ] || fail "$mn_nodes nodes not idle after 60 s: $(sinfo -h -p "$mn_partition" 2>&1 | tr '\n' ';')"
write_state status=up "SLURM_CONF=$mn_conf" "nodes=$nodes" "partition=$mn_partition" "racks=$mn_racks" "cpus=$mn_cpus"
echo "start-multinode.sh: $mn_nodes nodes in $mn_racks racks up (SLURM_CONF=$mn_conf)"
