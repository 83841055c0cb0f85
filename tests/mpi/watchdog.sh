#!/usr/bin/env bash
# Watchdog tests: (1) a collective that misses its deadline aborts the whole job with exit 3 and a
# message naming the collective and group; (2) a rank killed with SIGKILL mid-training takes the
# whole 4-rank job down within train_timeout_seconds + 10 s (no hang, no orphaned ranks).
# usage: watchdog.sh PROBE_BIN MESHTRAIN_BIN DECK DATA WORKDIR
set -uo pipefail
probe=$1 bin=$2 deck=$3 data=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
fails=0 pass=0
report() { if [ "$1" = ok ]; then echo "ok   $2"; pass=$((pass + 1)); else echo "FAIL $2"; fails=$((fails + 1)); fi; }

start=$(date +%s)
timeout 60 mpirun --allow-run-as-root --oversubscribe --quiet -np 2 "$probe" >"$work/probe.out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 15 ] &&
   grep -q "watchdog: all_reduce (host scalars) on dimension 'world' group 0 " "$work/probe.out"; then
  report ok "missed deadline aborts the job (rc $rc after ${took} s): $(grep watchdog "$work/probe.out" | head -1)"
else
  report fail "missed deadline: rc $rc after ${took} s"; sed 's/^/    /' "$work/probe.out"
fi

timeout_s=5
mpirun --allow-run-as-root --oversubscribe -np 4 "$bin" train --deck "$deck" --training.dataset="$data" \
  --parallelism.data_parallel_replicate_degree=4 --training.steps=100000 --training.global_batch_size=8 \
  --metrics.log_freq=1 --validation.enable=false --comm.train_timeout_seconds=$timeout_s \
  --job.dump_folder="$work/run" >"$work/train.out" 2>&1 &
launcher=$!
for _ in $(seq 1 600); do  # wait until training steps are being logged
  grep -q '^step 3/' "$work/train.out" 2>/dev/null && break
  sleep 0.1
done
victim=$(pgrep -f -- "--job.dump_folder=$work/run" | grep -v "^$launcher\$" | while read -r p; do
  [ "$(ps -o comm= -p "$p")" = meshtrain ] && echo "$p"; done | tail -1)
if [ -z "$victim" ]; then
  report fail "no training rank found to kill"; kill "$launcher" 2>/dev/null
else
  killed_at=$(date +%s)
  kill -9 "$victim"
  deadline=$((timeout_s + 10))
  while kill -0 "$launcher" 2>/dev/null && [ $(( $(date +%s) - killed_at )) -le $deadline ]; do sleep 0.2; done
  if kill -0 "$launcher" 2>/dev/null; then
    report fail "job still running $deadline s after SIGKILL of rank pid $victim"; kill -9 "$launcher"
  else
    wait "$launcher"; rc=$?
    left=$(pgrep -f -- "--job.dump_folder=$work/run" | wc -l)
    took=$(( $(date +%s) - killed_at ))
    if [ "$rc" -ne 0 ] && [ "$left" -eq 0 ]; then
      report ok "SIGKILL of one of 4 ranks ends the job in ${took} s with status $rc, no rank left"
    else
      report fail "after SIGKILL: status $rc, $left processes left"
    fi
  fi
fi
echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
