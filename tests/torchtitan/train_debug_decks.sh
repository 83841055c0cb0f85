#!/usr/bin/env bash
# The TorchTitan-style decks with a debug shape train 2 steps on 2 ranks (mpirun) once given a
# token store, shrunk to test size on the command line. Without the store their TorchTitan
# dataset name ("c4_test") is refused on every rank with one line and nothing is written.
# usage: train_debug_decks.sh MESHTRAIN_BIN MPIRUN DECK_DIR WORKDIR TOKEN_STORE
set -uo pipefail
bin=$1
mpirun=$2
dir=$3
work=$4
store=$5
rm -rf "$work" && mkdir -p "$work"
cd "$dir" || exit 1
fails=0
small=(--training.steps=2 --training.seq_len=64 --training.local_batch_size=2)

fail() {
  echo "FAIL $*"
  sed 's/^/    /' "$work/log"
  fails=$((fails + 1))
}

run() { OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe --quiet -np 2 "$bin" train "$@" >"$work/log" 2>&1; }

for spec in llama3_debug.toml: qwen3_debug.toml: \
            "llama3_debug_all_sections.toml:--validation.seq_len=64 --validation.local_batch_size=2 --lr_scheduler.total_steps=2"; do
  deck=${spec%%:*}
  read -r -a extra <<<"${spec#*:}"
  out="$work/${deck%.toml}"
  # Refused without a token store: one line (printed once, not per rank), status 2, no output.
  run --deck "$deck" "${small[@]}" "${extra[@]}" --job.dump_folder="$out"
  rc=$?
  if [ "$rc" -ne 2 ] || [ "$(grep -c . "$work/log")" -ne 1 ] || [ -e "$out" ] ||
     ! grep -qE "^$deck:[0-9]+: \[training\] dataset: \"c4_test\" is a Hugging Face dataset name" "$work/log"; then
    fail "$deck without a token store: rc=$rc"
  else
    echo "ok   $deck refused without a token store: $(cut -c1-120 "$work/log")..."
  fi
  # Trains with one.
  run --deck "$deck" --training.dataset_path="$store" "${small[@]}" "${extra[@]}" --job.dump_folder="$out"
  rc=$?
  notices=$(grep -c '^notice: ' "$work/log")
  once=$(grep -c "^notice: $deck:[0-9]*: \[training\] dataset: \"c4_test\" is only a name here" "$work/log")
  if [ "$rc" -ne 0 ] || ! grep -q '"step":2' "$out/metrics.jsonl" 2>/dev/null || [ "$once" -ne 1 ] ||
     ! grep -q '^\[compile\]' "$out/deck.resolved.toml" 2>/dev/null; then
    fail "$deck trains 2 steps: rc=$rc, dataset notice printed $once times"
  else
    echo "ok   $deck trains 2 steps on 2 ranks ($notices notices, each once; loss $(grep -o '"loss":[0-9.]*' "$out/metrics.jsonl" | tail -1 | cut -d: -f2))"
  fi
done

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "the TorchTitan-style debug decks train"
