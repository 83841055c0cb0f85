#!/usr/bin/env bash
# Starts a real single-node Slurm cluster on this machine for the jobs/ tests (ctest label
# `slurm`): munged, slurmctld and slurmd from Debian's munge and slurm-wlm, started directly (no
# systemd), with their own config, ports, munge key and state under $MESHTRAIN_SLURM_DIR (default
# /tmp/meshtrain-slurm). Idempotent: when our daemons already run with this config it only waits
# for the node; when some of them run, or with another config, it restarts them.
#
#   scripts/slurm/start-cluster.sh [--state FILE]
#   export SLURM_CONF=/tmp/meshtrain-slurm/etc/slurm.conf; sinfo; sbatch ...
#
# The node: named `hostname -s`, the machine's sockets and threads per core but at least
# $MESHTRAIN_SLURM_CPUS (default 8) CPUs (SlurmdParameters=config_overrides), so 4-8 rank jobs
# fit on a 2-core machine; no cgroups (proctrack/linuxproc, task/none); MpiDefault=pmix;
# JobRequeue=1; $MESHTRAIN_SLURM_GPUS (default 8, 0 for none) placeholder GPUs: gres.conf names
# links to /dev/null, no GPU is behind them. They exist so the GPU scripts' own
# `#SBATCH --gpus-per-node=8` and `srun --gpus-per-task=1` are granted as written and those jobs
# reach meshtrain, whose device check then stops them.
#
# Exit status (the state FILE gets the same as key=value lines: status, reason, started,
# SLURM_CONF, node, partition, cpus, gpus):
#   0   the node is up (started=1: this call started the daemons, or adopted ones an earlier call
#       with the same FILE started; 0: someone else's, which stop-cluster.sh then leaves running)
#   77  this machine cannot run it: not root, Slurm or munge not installed, srun without pmix
#   1   the daemons did not come up (the reason and their log's tail on stderr)
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=cluster-common.sh
. "$here/cluster-common.sh"
# shellcheck source-path=SCRIPTDIR source=conf-common.sh
. "$here/conf-common.sh"

state=""
if [ $# -eq 2 ] && [ "$1" = --state ]; then
  state=$2
elif [ $# -ne 0 ]; then
  echo "usage: start-cluster.sh [--state FILE]" >&2
  exit 2
fi
[ -z "$state" ] || { mkdir -p "$(dirname "$state")" && state=$(cd "$(dirname "$state")" && pwd)/$(basename "$state"); }
[ -z "$state" ] || rm -f "$state"
export SLURM_CONF=$cluster_conf

skip() {
  echo "start-cluster.sh: SKIPPED: $*" >&2
  write_state "$state" status=skip "reason=$*"
  exit 77
}
fail() {
  echo "start-cluster.sh: FAILED: $*" >&2
  for log in munged slurmctld slurmd; do
    [ "$launched" = 1 ] && [ -s "$cluster_dir/log/$log.log" ] && { echo "--- $cluster_dir/log/$log.log (tail)" >&2; tail -n 15 "$cluster_dir/log/$log.log" >&2; }
  done
  # Leave nothing half-started behind (the fixture's cleanup only stops a cluster that came up).
  [ "$launched" = 0 ] || "$here/stop-cluster.sh" --force >/dev/null 2>&1 || true
  write_state "$state" status=failed "reason=$*"
  exit 1
}
launched=0

[ "$(id -u)" -eq 0 ] || skip "not root (slurmd must run as root to start job steps as the submitting user)"
missing=()
for p in munged mungekey munge slurmctld slurmd sbatch srun scontrol sinfo squeue scancel; do
  command -v "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || skip "not installed: ${missing[*]} (Debian: apt-get install slurm-wlm munge)"
# Root writes and signals pids from there: refuse a folder (or a link) another user could have prepared.
if [ -e "$cluster_dir" ] || [ -L "$cluster_dir" ]; then
  [ -d "$cluster_dir" ] && [ ! -L "$cluster_dir" ] && [ "$(stat -c %u "$cluster_dir")" = "$(id -u)" ] ||
    fail "MESHTRAIN_SLURM_DIR=$cluster_dir: exists but is not a folder owned by $(id -un) (remove it or choose another)"
fi
[ "$cluster_port" -gt 0 ] 2>/dev/null && [ "$cluster_port" -lt 65535 ] ||
  fail "MESHTRAIN_SLURM_PORT=$cluster_port: must be a port number below 65535 (slurmd takes the next one)"

# The node as slurmd sees the hardware, widened to the slot count the tests need.
hw=$(slurmd -C | head -1)
hw_field() { sed -n "s/.* $1=\\([0-9]*\\).*/\\1/p" <<< "$hw"; }
sockets=$(hw_field SocketsPerBoard) threads=$(hw_field ThreadsPerCore) memory=$(hw_field RealMemory)
[ -n "$sockets" ] && [ -n "$threads" ] && [ -n "$memory" ] || fail "cannot read the node's hardware from 'slurmd -C': $hw"
[[ "${MESHTRAIN_SLURM_CPUS:-8}" =~ ^[1-9][0-9]*$ ]] || fail "MESHTRAIN_SLURM_CPUS=$MESHTRAIN_SLURM_CPUS: must be a positive whole number"
want=$(( ${MESHTRAIN_SLURM_CPUS:-8} > $(nproc) ? ${MESHTRAIN_SLURM_CPUS:-8} : $(nproc) ))
cores=$(( (want + sockets * threads - 1) / (sockets * threads) ))
cpus=$(( sockets * cores * threads ))
gpus=${MESHTRAIN_SLURM_GPUS:-8}
[[ "$gpus" =~ ^[0-9]+$ ]] || fail "MESHTRAIN_SLURM_GPUS=$gpus: must be a whole number of placeholder GPUs"

new_conf=$(mktemp)
trap 'rm -f "$new_conf" "$new_conf.gres"' EXIT
gres_line=""
if [ "$gpus" -gt 0 ]; then
  gres_line=" Gres=gpu:$gpus"
  printf 'NodeName=%s Name=gpu File=%s/gpu/gpu[0-%d]\n' "$cluster_node" "$cluster_dir" $((gpus - 1)) > "$new_conf.gres"
fi
cat > "$new_conf" <<EOF
# Written by scripts/slurm/start-cluster.sh: a single-node test cluster for jobs/*.sbatch.
ClusterName=meshtrain-test
SlurmctldHost=$cluster_node(127.0.0.1)
SlurmctldPort=$cluster_port
SlurmdPort=$((cluster_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$munge_socket,cred_expire=10
StateSaveLocation=$cluster_dir/spool/ctld
SlurmdSpoolDir=$cluster_dir/spool/d
SlurmctldPidFile=$cluster_dir/run/slurmctld.pid
SlurmdPidFile=$cluster_dir/run/slurmd.pid
SlurmctldLogFile=$cluster_dir/log/slurmctld.log
SlurmdLogFile=$cluster_dir/log/slurmd.log
PlugStackConfig=$cluster_dir/etc/plugstack.conf
$(slurm_test_conf_common)
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=600
JobRequeue=1
# Test jobs should start as soon as they are eligible, not at the next 60 s scheduling pass.
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
GresTypes=gpu
NodeName=$cluster_node NodeAddr=127.0.0.1 CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$memory$gres_line State=UNKNOWN
PartitionName=$cluster_partition Nodes=$cluster_node Default=YES MaxTime=INFINITE State=UP
EOF
[ -f "$new_conf.gres" ] || : > "$new_conf.gres"

up_state() {
  write_state "$state" status=up "started=$1" "SLURM_CONF=$cluster_conf" "node=$cluster_node" \
    "partition=$cluster_partition" "cpus=$cpus" "gpus=$gpus"
}

# Waits until sinfo shows the node ready for jobs; a node Slurm refused (inval, drain) fails at once.
wait_node() {
  local t reason
  for ((i = 0; i < 300; i++)); do
    [ -n "$(slurmctld_pid)" ] || fail "slurmctld exited"
    [ -n "$(slurmd_pid)" ] || fail "slurmd exited"
    t=$(sinfo -h -n "$cluster_node" -p "$cluster_partition" -o %t 2>/dev/null || true)
    case "$t" in
      idle | mix | alloc) return 0 ;;
      inval* | drain* | drng*)
        reason=$(scontrol show node "$cluster_node" 2>/dev/null | sed -n 's/.*Reason=\(.*\)/\1/p')
        fail "node $cluster_node is '$t': ${reason:-no reason given}" ;;
    esac
    sleep 0.2
  done
  fail "node $cluster_node not ready after 60 s (sinfo state '${t:-no answer}')"
}

running=0
[ -n "$(munged_pid)" ] && [ -n "$(slurmctld_pid)" ] && [ -n "$(slurmd_pid)" ] && running=1
if [ "$running" = 1 ] && cmp -s "$new_conf" "$cluster_conf" && cmp -s "$new_conf.gres" "$cluster_dir/etc/gres.conf" &&
   sinfo -h >/dev/null 2>&1; then
  wait_node
  owner=$(cat "$owner_file" 2>/dev/null || true)
  started=0
  [ -n "$state" ] && [ "$owner" = "$state" ] && started=1
  up_state "$started"
  echo "start-cluster.sh: already running (SLURM_CONF=$cluster_conf, node $cluster_node, $cpus CPUs)"
  exit 0
fi
if [ -n "$(munged_pid)$(slurmctld_pid)$(slurmd_pid)" ]; then
  echo "start-cluster.sh: restarting the test cluster's daemons (config changed or some not running)"
  "$here/stop-cluster.sh" --force >/dev/null
fi

mkdir -p "$cluster_dir"/{etc,spool/ctld,spool/d,log,run,gpu}
chmod 755 "$cluster_dir"
# munged wants its key private and its socket folder searchable by everyone.
mkdir -p "$cluster_dir/munge" "$cluster_dir/munge-socket"
chmod 700 "$cluster_dir/munge"
chmod 755 "$cluster_dir/munge-socket"
[ -s "$cluster_dir/munge/munge.key" ] || mungekey --create --keyfile="$cluster_dir/munge/munge.key"
cp "$new_conf" "$cluster_conf"
cp "$new_conf.gres" "$cluster_dir/etc/gres.conf"
: > "$cluster_dir/etc/plugstack.conf"
rm -f "$cluster_dir"/gpu/gpu*
for ((g = 0; g < gpus; g++)); do ln -s /dev/null "$cluster_dir/gpu/gpu$g"; done
chmod 644 "$cluster_conf" "$cluster_dir/etc/gres.conf"

srun --mpi=list 2>&1 | grep -qw pmix || skip "srun lists no pmix MPI plugin (srun --mpi=list); the jobs launch with srun --mpi=pmix"

for log in munged slurmctld slurmd; do : > "$cluster_dir/log/$log.log"; done
launched=1
why=$(start_test_munged "$cluster_dir" "$munge_socket") || fail "$why"
# -c: a fresh controller forgets the jobs of an earlier test cluster.
slurmctld -c -f "$cluster_conf" </dev/null >/dev/null 2>&1 || fail "slurmctld did not start"
slurmd -N "$cluster_node" -f "$cluster_conf" </dev/null >/dev/null 2>&1 || fail "slurmd did not start"
echo "${state:-manual}" > "$owner_file"
wait_node
up_state 1
echo "start-cluster.sh: started (SLURM_CONF=$cluster_conf, node $cluster_node, $cpus CPUs, $gpus placeholder GPUs)"
