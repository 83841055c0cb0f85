#!/usr/bin/env bash
# jobs/lib/node_failure.sh's decisions, with stand-ins for srun, scontrol and `meshtrain deck
# check` (no Slurm needed; the real thing runs in tests/cluster): a failed step with a node down
# is relaunched on the rest with the same global batch; below MESHTRAIN_MIN_NODES the job is
# requeued; MESHTRAIN_MAX_RELAUNCHES bounds the relaunches; a failure with every node up is not
# relaunched unless nothing was trained yet (start-up: once, MESHTRAIN_STARTUP_RELAUNCHES);
# planned exits (2, 4, 5) pass through.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/out"
# srun: logs its arguments, exits with the next status of $work/srun_status (one per line);
# after a failing call it marks the node named in $work/fail_node down. With TRAINS=1 each call
# first trains a step (a loss record in the run's metrics.jsonl), so a failure is not in start-up.
cat > "$work/bin/srun" <<'SH'
#!/usr/bin/env bash
echo "srun $*" >> "$W/calls"
[ "${TRAINS:-0}" = 1 ] && echo '{"step": 1, "loss": 1.0}' >> "$W/out/metrics.jsonl"
status=$(head -1 "$W/srun_status"); sed -i 1d "$W/srun_status"
[ "$status" -ne 0 ] && [ -s "$W/fail_node" ] && { head -1 "$W/fail_node" >> "$W/down"; sed -i 1d "$W/fail_node"; }
exit "$status"
SH
cat > "$work/bin/scontrol" <<'SH'
#!/usr/bin/env bash
case "$1 $2" in
  "show hostnames") echo n1; echo n2; echo n3 ;;
  "show node") if grep -qx "$4" "$W/down" 2>/dev/null; then echo "NodeName=$4 State=DOWN+NOT_RESPONDING x"; else echo "NodeName=$4 State=ALLOCATED x"; fi ;;
  "requeue "*) echo "requeue $2" >> "$W/calls" ;;
esac
SH
# deck check: valid when the global batch divides local x ranks.
cat > "$work/bin/deck_check" <<'SH'
#!/usr/bin/env bash
for a in "$@"; do case "$a" in --world-size) next=ws ;; *) [ "${next:-}" = ws ] && n=$a; next= ;; esac
  case "$a" in --training.global_batch_size=*) g=${a#*=} ;; --training.local_batch_size=*) l=${a#*=} ;; esac; done
[ $((g % (l * n))) -eq 0 ]
SH
chmod +x "$work/bin/"*
export PATH="$work/bin:$PATH" W=$work SLURM_JOB_ID=42 SLURM_JOB_NODELIST="n[1-3]" SLURM_NNODES=3
. "$root/jobs/lib/node_failure.sh"
mt_deck_check=(deck_check)
mt_check_args=()
mt_global_batch=12 mt_local_batch=2
pass=0 fails=0
run() {  # run NAME EXPECTED_STATUS "srun statuses" "nodes that fail, in order" [ENV=VALUE...] ; then greps
  local name=$1 want=$2 statuses=$3 failing=$4
  shift 4
  rm -f "$work/calls" "$work/down" "$work/out/metrics.jsonl"
  printf '%s\n' $statuses > "$work/srun_status"
  printf '%s\n' $failing > "$work/fail_node"
  (export MESHTRAIN_NODE_DOWN_WAIT=2 "$@"; mt_train_resilient 2 "$work/out" --mpi=pmix -- train --ntasks={NTASKS}) \
    > "$work/log" 2>&1
  got=$?
  if [ "$got" -eq "$want" ]; then echo "ok   $name (status $got)"; pass=$((pass + 1)); return 0; fi
  echo "FAIL $name: status $got, expected $want"; sed 's/^/    /' "$work/log" "$work/calls"; fails=$((fails + 1)); return 1
}
expect_calls() {  # expect_calls NAME PATTERN...: every pattern is a line of the calls log, in order
  local name=$1 i=0
  shift
  local lines
  mapfile -t lines < "$work/calls"
  for p in "$@"; do
    while [ $i -lt ${#lines[@]} ] && ! grep -qE -- "$p" <<< "${lines[$i]}"; do i=$((i + 1)); done
    if [ $i -ge ${#lines[@]} ]; then echo "FAIL $name: no call matching '$p'"; sed 's/^/    /' "$work/calls" "$work/log"; fails=$((fails + 1)); return; fi
    i=$((i + 1))
  done
  echo "ok   $name"; pass=$((pass + 1))
}
run "relaunch after a node failure" 0 "3 0" "n2" &&
  expect_calls "  on n1,n3: 4 ranks, global batch 12 kept with local batch 1 (12 % (2 x 4) != 0)" \
    "^srun --mpi=pmix --nodes=3 --nodelist=n1,n2,n3 --ntasks=6 --ntasks-per-node=2 train --ntasks=6$" \
    "^srun --mpi=pmix --overlap --nodes=2 --nodelist=n1,n3 --ntasks=4 --ntasks-per-node=2 train --ntasks=4 --training.global_batch_size=12 --training.local_batch_size=1$"
run "requeue below MESHTRAIN_MIN_NODES" 0 "3" "n2" MESHTRAIN_MIN_NODES=3 && expect_calls "  requeued, no relaunch" "^srun .*--nodes=3" "^requeue 42$"
run "MESHTRAIN_MAX_RELAUNCHES bounds the relaunches" 3 "3 3 3" "n2 n3 n1" MESHTRAIN_MAX_RELAUNCHES=1 &&
  expect_calls "  one relaunch, then stop" "^srun .*--nodes=3" "^srun .*--overlap --nodes=2"
[ "$(grep -c '^srun' "$work/calls")" -eq 2 ] || { echo "FAIL more than one relaunch"; fails=$((fails + 1)); }
run "a failure after training with every node up is not relaunched" 1 "1" "" TRAINS=1 &&
  [ "$(grep -c '^srun' "$work/calls")" -eq 1 ] &&
  grep -q "not a node failure" "$work/log" && { echo "ok     said so"; pass=$((pass + 1)); }
run "a start-up failure (nothing trained, every node up) is launched again" 0 "139 0" "" &&
  [ "$(grep -c '^srun --mpi=pmix --nodes=3 --nodelist=n1,n2,n3 --ntasks=6' "$work/calls")" -eq 2 ] &&
  grep -q "^start-up failure: the step failed (status 139)" "$work/log" && { echo "ok     on the same nodes, said so"; pass=$((pass + 1)); }
run "a start-up failure that repeats ends the job" 139 "139 139 0" "" && [ "$(grep -c '^srun' "$work/calls")" -eq 2 ] &&
  grep -q "not a node failure" "$work/log" && { echo "ok     after one relaunch"; pass=$((pass + 1)); }
run "MESHTRAIN_STARTUP_RELAUNCHES=0 turns it off" 139 "139 0" "" MESHTRAIN_STARTUP_RELAUNCHES=0 &&
  [ "$(grep -c '^srun' "$work/calls")" -eq 1 ] && { echo "ok     one launch"; pass=$((pass + 1)); }
run "a node lost in start-up takes the node-failure path" 0 "3 0" "n2" &&
  expect_calls "  relaunched on n1,n3" "^srun .*--nodes=3" "^srun .*--overlap --nodes=2 --nodelist=n1,n3"
for s in 2 4 5; do run "planned exit $s passes through" "$s" "$s" ""; done
echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
