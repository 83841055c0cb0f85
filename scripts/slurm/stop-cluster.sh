#!/usr/bin/env bash
# Stops the test cluster start-cluster.sh started: cancels its jobs (waiting for their steps to
# end, so no rank outlives the cluster), then stops slurmd, slurmctld and munged by the pids in
# their pid files (checked to still be those programs). Logs stay in $MESHTRAIN_SLURM_DIR/log.
#
#   scripts/slurm/stop-cluster.sh                 stop whatever of the test cluster runs
#   scripts/slurm/stop-cluster.sh --state FILE    only if FILE (start-cluster.sh --state) says
#                                                 that call started it (started=1)
# Exit status 0 when nothing of it runs any more, 1 when a daemon survived SIGKILL.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=cluster-common.sh
. "$here/cluster-common.sh"
export SLURM_CONF=$cluster_conf

state=""
case "$#:${1:-}" in
  0: | 1:--force) ;;
  2:--state) state=$2 ;;
  *) echo "usage: stop-cluster.sh [--force | --state FILE]" >&2; exit 2 ;;
esac
if [ -n "$state" ]; then
  if ! grep -qx 'started=1' "$state" 2>/dev/null; then
    echo "stop-cluster.sh: nothing to stop ($state: this test run did not start the cluster)"
    exit 0
  fi
fi

if [ -n "$(slurmctld_pid)" ]; then
  jobs=$(squeue -h -o %A 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    echo "stop-cluster.sh: cancelling jobs" $jobs
    # shellcheck disable=SC2086 # one job id per word
    scancel $jobs 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
      [ -z "$(squeue -h -o %A 2>/dev/null || true)" ] && break
      sleep 0.1
    done
  fi
fi

status=0
# Stops the named daemons (SIGTERM together, SIGKILL after 30 s) and waits for them to exit.
stop_daemons() {
  local daemon pid pids=() names=() i
  for daemon in "$@"; do
    pid=$("${daemon}_pid")
    [ -n "$pid" ] || continue
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid") names+=("$daemon")
  done
  for i in "${!pids[@]}"; do
    wait_gone 30 "${pids[$i]}" && continue
    echo "stop-cluster.sh: ${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for 30 s; sending SIGKILL" >&2
    kill -KILL "${pids[$i]}" 2>/dev/null || true
    wait_gone 5 "${pids[$i]}" || { echo "stop-cluster.sh: ${names[$i]} (pid ${pids[$i]}) is still running" >&2; status=1; }
  done
}
stop_daemons slurmd slurmctld
# munged last: the Slurm daemons authenticate their last messages through it.
stop_daemons munged
rm -f "$owner_file"
[ -z "$state" ] || write_state "$state" status=stopped "reason=stopped by stop-cluster.sh"
[ "$status" -eq 0 ] && echo "stop-cluster.sh: stopped the test cluster ($cluster_dir)"
exit "$status"
