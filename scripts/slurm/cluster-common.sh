# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the scripts that source it
# Shared by start-cluster.sh and stop-cluster.sh (sourced, not run): where the single-node test
# cluster keeps its files, and the helpers both scripts need. Everything lives under one folder
# ($MESHTRAIN_SLURM_DIR, default /tmp/meshtrain-slurm) with its own ports and its own munged
# socket, so a Slurm already configured in /etc/slurm on this machine is neither read nor touched:
# clients reach the test cluster only through SLURM_CONF=$cluster_conf.

cluster_dir=${MESHTRAIN_SLURM_DIR:-/tmp/meshtrain-slurm}
# slurmctld listens on this port, slurmd on the next one; away from Slurm's defaults (6817/6818)
# so a site cluster on the same machine keeps its ports.
cluster_port=${MESHTRAIN_SLURM_PORT:-16817}
cluster_conf=$cluster_dir/etc/slurm.conf
cluster_node=$(hostname -s)
cluster_partition=meshtrain
munge_socket=$cluster_dir/munge-socket/munge.socket
# Which fixture started the running daemons (its state file path, or "manual"): a later fixture
# with the same state file adopts them (a crashed test run left them up), any other leaves them.
owner_file=$cluster_dir/run/owner

# pid of a daemon of ours from its pid file if that process is alive and is the named program,
# else nothing (a stale pid file, or a pid reused by another program).
live_pid() {
  local pidfile=$1 comm=$2 pid
  [ -r "$pidfile" ] || return 0
  pid=$(cat "$pidfile" 2>/dev/null || true)
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$comm" ] && echo "$pid"
  return 0
}

munged_pid() { live_pid "$cluster_dir/run/munged.pid" munged; }
slurmctld_pid() { live_pid "$cluster_dir/run/slurmctld.pid" slurmctld; }
slurmd_pid() { live_pid "$cluster_dir/run/slurmd.pid" slurmd; }

# Waits up to $1 seconds for pid $2 to exit; status 1 if it is still there.
wait_gone() {
  local limit=$1 pid=$2 i
  for ((i = 0; i < limit * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}

# Writes the state file the ctest fixtures read: key=value lines (status, reason, started,
# SLURM_CONF, node, partition). No file argument: nothing written.
write_state() {
  local file=$1
  shift
  [ -n "$file" ] || return 0
  mkdir -p "$(dirname "$file")"
  printf '%s\n' "$@" > "$file.tmp"
  mv "$file.tmp" "$file"
}
