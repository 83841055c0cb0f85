# shellcheck shell=bash
# Sourced by the jobs/*.sbatch scripts: runs the training step with srun and survives the loss of
# nodes inside the allocation (submit with `sbatch --no-kill`, which keeps the allocation when a
# node fails). When the step fails and Slurm marks nodes of the allocation as down, the step is
# relaunched on the nodes still up, from the latest checkpoint, elastically: fewer ranks, the same
# global batch (gradient accumulation; a smaller local batch when the global batch does not divide
# otherwise) and the same data order. Below a minimum of nodes the job is requeued instead, and
# after a maximum of relaunches it stops: it never loops forever. Knobs (environment):
#   MESHTRAIN_MIN_NODES        fewest nodes to go on with (default 1); fewer: requeue
#   MESHTRAIN_MAX_RELAUNCHES   node-failure relaunches per job run (default 3)
#   MESHTRAIN_NODE_DOWN_WAIT   seconds to wait for Slurm to mark a failed node down (default 90;
#                              Slurm's SlurmdTimeout decides when it does)
#   MESHTRAIN_STARTUP_RELAUNCHES  relaunches of a step that failed before its first training step
#                              with every node up (default 1; 0 turns them off)
# A step that fails with no node down (a crash, a bad deck) is not relaunched: its status is the
# job's. One exception: a step whose ranks died during start-up — before the launch trained a
# step, with every node still up, and not by one of meshtrain's own exits (2, 4, 5) — is launched
# again at once on the same nodes, MESHTRAIN_STARTUP_RELAUNCHES times at most. Nothing was trained,
# so nothing is lost; the reason is Open MPI 4.1's TCP start-up race (jobs/README.md): about one
# 8-rank launch across 4 nodes in 100 loses a rank inside MPI_Init, in a plain MPI program too.
# A crash that repeats is still the job's failure.
#
# usage: set mt_deck_check=(meshtrain deck check --deck DECK) and mt_check_args=(OVERRIDES...), then
#   mt_check_deck NTASKS                       (a bad deck stops the job script here)
#   mt_train_resilient PER_NODE "$mt_output" SRUN_OPTIONS... -- COMMAND...
# where COMMAND's words may contain {NTASKS}, replaced by the step's task count. The function
# returns the step's status (0 done, 2 bad input, 4 preempted, 5 non-finite, other: failed).

# Nodes of `list` (hostnames, one per line) that Slurm considers alive.
mt_nodes_up() {
  local n state
  for n in "$@"; do
    state=$(scontrol show node -o "$n" 2>/dev/null | sed -n 's/.* State=\([^ ]*\).*/\1/p')
    case "$state" in
      "" | *DOWN* | *NOT_RESPONDING* | *FAIL* | *DRAIN* | *POWER*) ;;
      *) echo "$n" ;;
    esac
  done
}

# The batch arguments for TASKS ranks that keep the global batch G: the deck check decides
# (dp, and whether G divides local × dp); the local batch shrinks when it must.
mt_batch_args() {
  local tasks=$1 global=$2 local_batch=$3
  shift 3
  local l
  for ((l = local_batch; l >= 1; l--)); do
    if "${mt_deck_check[@]}" --world-size "$tasks" "$@" --training.global_batch_size="$global" \
      --training.local_batch_size="$l" >/dev/null 2>&1; then
      echo "--training.global_batch_size=$global --training.local_batch_size=$l"
      return 0
    fi
  done
  return 1
}

mt_train_resilient() {
  local per_node=$1 out=$2
  shift 2
  local srun_opts=() cmd=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do srun_opts+=("$1"); shift; done
  shift
  cmd=("$@")
  local nodes=()
  mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null)
  if [ ${#nodes[@]} -ne "${SLURM_NNODES:-0}" ]; then  # no Slurm to ask (jobs/run-local.sh): one plain step
    local tasks=${SLURM_NTASKS:-$((SLURM_NNODES * per_node))}
    srun "${srun_opts[@]}" "${cmd[@]//\{NTASKS\}/$tasks}"
    return
  fi
  local relaunches=0 startup_relaunches=0 status batch=() overlap=() t_fail="" steps_before=0 steps_at_launch
  local metrics="$out/metrics.jsonl"
  while :; do
    local n=${#nodes[@]} tasks=$((${#nodes[@]} * per_node)) list
    list=$(IFS=,; echo "${nodes[*]}")
    local step_cmd=("${cmd[@]//\{NTASKS\}/$tasks}") watcher=""
    if [ -n "$t_fail" ]; then  # report when the relaunched step has trained its first step
      ( while sleep 0.5; do
          [ "$(grep -c '"loss"' "$metrics" 2>/dev/null || echo 0)" -gt "$steps_before" ] || continue
          awk -v a="$(date +%s.%N)" -v b="$t_fail" \
            'BEGIN { printf "node failure: training again %.1f s after the last step before the failure\n", a - b }' >&2
          break
        done ) &
      watcher=$!
    fi
    status=0
    steps_at_launch=$(grep -c '"loss"' "$metrics" 2>/dev/null || echo 0)
    srun "${srun_opts[@]}" "${overlap[@]}" --nodes="$n" --nodelist="$list" --ntasks="$tasks" --ntasks-per-node="$per_node" \
      "${step_cmd[@]}" "${batch[@]}" || status=$?
    [ -z "$watcher" ] || { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; }
    case "$status" in 0 | 2 | 4 | 5) return "$status" ;; esac
    # Died in start-up (nothing trained by this launch, every node still up): launch it again.
    if [ "$(grep -c '"loss"' "$metrics" 2>/dev/null || echo 0)" -eq "$steps_at_launch" ] &&
      [ "$startup_relaunches" -lt "${MESHTRAIN_STARTUP_RELAUNCHES:-1}" ]; then
      local alive=()
      mapfile -t alive < <(mt_nodes_up "${nodes[@]}")
      if [ ${#alive[@]} -eq "$n" ]; then
        startup_relaunches=$((startup_relaunches + 1))
        echo "start-up failure: the step failed (status $status) before training a step, with every node up;" \
          "launching it again on the same nodes ($startup_relaunches of MESHTRAIN_STARTUP_RELAUNCHES=${MESHTRAIN_STARTUP_RELAUNCHES:-1})" >&2
        continue
      fi
    fi
    # The step failed. A lost node shows in Slurm once slurmd misses SlurmdTimeout; wait for it.
    t_fail=$(stat -c %.9Y "$metrics" 2>/dev/null || date +%s.%N)
    steps_before=$(grep -c '"loss"' "$metrics" 2>/dev/null || echo 0)
    local up=() waited
    for ((waited = 0; waited < ${MESHTRAIN_NODE_DOWN_WAIT:-90}; waited++)); do
      mapfile -t up < <(mt_nodes_up "${nodes[@]}")
      [ ${#up[@]} -lt "$n" ] && break
      sleep 1
    done
    if [ ${#up[@]} -ge "$n" ]; then
      echo "the training step failed (status $status) and every node of the allocation is up: not a node failure, not relaunched" >&2
      return "$status"
    fi
    local lost
    lost=$(comm -23 <(printf '%s\n' "${nodes[@]}" | sort) <(printf '%s\n' "${up[@]}" | sort) | tr '\n' ' ')
    local ranks=""  # the failed step's ranks on the lost nodes, from the run's layout.csv
    for l in $lost; do
      ranks+=$(awk -F, -v h="$l" 'NR > 1 && $2 == h { printf "%s%s", sep, $1; sep = "," }' "$out/layout.csv" 2>/dev/null)" "
    done
    echo "node failure: lost ${lost}(ranks ${ranks% }; step status $status); ${#up[@]} of $n nodes still up" >&2
    if [ ${#up[@]} -lt "${MESHTRAIN_MIN_NODES:-1}" ]; then
      echo "node failure: fewer than MESHTRAIN_MIN_NODES=${MESHTRAIN_MIN_NODES:-1} nodes left; requeueing the job" >&2
      scontrol requeue "$SLURM_JOB_ID" && return 0
      return "$status"
    fi
    relaunches=$((relaunches + 1))
    if [ "$relaunches" -gt "${MESHTRAIN_MAX_RELAUNCHES:-3}" ]; then
      echo "node failure: MESHTRAIN_MAX_RELAUNCHES=${MESHTRAIN_MAX_RELAUNCHES:-3} relaunches used; stopping" >&2
      return "$status"
    fi
    nodes=("${up[@]}")
    tasks=$((${#nodes[@]} * per_node))
    local b
    if ! b=$(mt_batch_args "$tasks" "$mt_global_batch" "$mt_local_batch" "${mt_check_args[@]//\{NTASKS\}/$tasks}"); then
      echo "node failure: no local batch size keeps the global batch $mt_global_batch on $tasks ranks; requeueing" >&2
      scontrol requeue "$SLURM_JOB_ID" && return 0
      return "$status"
    fi
    read -r -a batch <<< "$b"
    # The failed step stays RUNNING in slurmctld while its lost node's part cannot report (its
    # processes on the other nodes are gone): the new step shares its CPUs.
    overlap=(--overlap)
    echo "node failure: relaunching on ${nodes[*]} ($tasks ranks, $b) from the latest checkpoint" >&2
  done
}

# Checks the deck for TASKS ranks before any srun (mt_deck_check + mt_check_args, {NTASKS}
# replaced), prints the verdict, and keeps the global and local batch and the output folder for
# a relaunch. A bad deck ends the job script here with deck check's status (2).
mt_check_deck() {
  local tasks=$1 out status=0
  out=$("${mt_deck_check[@]}" --world-size "$tasks" "${mt_check_args[@]//\{NTASKS\}/$tasks}" 2>&1) || status=$?
  printf '%s\n' "$out"
  [ "$status" -eq 0 ] || exit "$status"
  mt_global_batch=$(sed -n 's/.*batch: global \([0-9]*\) samples = local \([0-9]*\) .*/\1/p' <<< "$out")
  mt_local_batch=$(sed -n 's/.*batch: global \([0-9]*\) samples = local \([0-9]*\) .*/\2/p' <<< "$out")
  mt_output=$(sed -n 's/.*output in \(.*\)$/\1/p' <<< "$out")
}
