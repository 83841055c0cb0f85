#!/usr/bin/env bash
# [model] hf_assets_path, end to end: `meshtrain data prepare --hf-assets-path DIR` tokenizes with
# DIR/tokenizer.model, a run records the folder in its resolved deck, and `meshtrain ckpt export`
# copies the folder's tokenizer files next to model.safetensors (byte for byte, nothing else).
# usage: hf_assets.sh MESHTRAIN_BIN MPIRUN PYTHON DECK_DIR WORKDIR CORPUS_DIR TOKEN_STORE
# (TOKEN_STORE was prepared from CORPUS_DIR with --vocab-size; its SentencePiece model becomes
# the assets folder's tokenizer.model.)
set -uo pipefail
bin=$1
mpirun=$2
python=$3
dir=$4
work=$5
corpus=$6
store=$7
rm -rf "$work" && mkdir -p "$work/assets" "$work/json_only"
fails=0

check() {  # check NAME CONDITION-EXIT-STATUS
  if [ "$2" -ne 0 ]; then
    echo "FAIL $1"
    sed 's/^/    /' "$work/log"
    fails=$((fails + 1))
  else
    echo "ok   $1"
  fi
}

# An assets folder as Hugging Face ships one: a SentencePiece tokenizer.model and its config.
"$python" - "$store" "$work/assets/tokenizer.model" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    open(sys.argv[2], "wb").write(f["tokenizer/model"][()].tobytes())
PY
printf '{"model_max_length": 64, "tokenizer_class": "LlamaTokenizer"}\n' > "$work/assets/tokenizer_config.json"
printf '{"bos_token_id": 1, "eos_token_id": 2}\n' > "$work/assets/generation_config.json"
printf '{"version": "1.0"}\n' > "$work/json_only/tokenizer.json"

# data prepare reads the folder's tokenizer.model: the same tokens as the store it came from.
"$bin" data prepare --input "$corpus" --output "$work/store.h5" --hf-assets-path "$work/assets" >"$work/log" 2>&1
rc=$?
"$python" - "$store" "$work/store.h5" >>"$work/log" 2>&1 <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
for split in ("train", "validation"):
    assert np.array_equal(a[split]["tokens"][()], b[split]["tokens"][()]), split
assert a["tokenizer/model"][()].tobytes() == b["tokenizer/model"][()].tobytes()
PY
check "data prepare --hf-assets-path tokenizes with the folder's tokenizer.model" $((rc | $?))
for c in "json_only:json_only/tokenizer.json: tokenizer.json has no \"model\"" \
         "missing:: not a folder"; do
  name=${c%%:*} want=${c#*:}
  "$bin" data prepare --input "$corpus" --output "$work/bad.h5" --hf-assets-path "$work/$name" >"$work/log" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$want" "$work/log" && [ ! -e "$work/bad.h5" ]
  check "data prepare --hf-assets-path $name: refused" $?
done
"$bin" data prepare --input "$corpus" --output "$work/bad.h5" --hf-assets-path "$work/assets" --vocab-size 300 >"$work/log" 2>&1
[ $? -eq 2 ] && grep -qF "give exactly one of --vocab-size N, --tokenizer FILE or --hf-assets-path DIR" "$work/log"
check "data prepare: --hf-assets-path and --vocab-size together refused" $?

# A run with the folder: no notice about it, and the folder in the resolved deck.
cd "$dir" || exit 1
OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe --quiet -np 2 "$bin" train --deck llama3_debug.toml \
  --model.hf_assets_path="$work/assets" --training.dataset_path="$work/store.h5" --training.steps=2 \
  --training.seq_len=64 --training.local_batch_size=2 --job.dump_folder="$work/run" >"$work/log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && ! grep -q 'hf_assets_path' "$work/log" &&
  grep -qF "hf_assets_path = \"$work/assets\"" "$work/run/deck.resolved.toml"
check "a run records hf_assets_path (no notice: the folder exists)" $?

# Export copies the tokenizer files the folder has, and only those.
"$bin" ckpt export --format safetensors --output "$work/export" "$work/run/model_final.h5" >"$work/log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -qF "tokenizer.model, tokenizer_config.json, generation_config.json (from $work/assets)" "$work/log" &&
  cmp -s "$work/assets/tokenizer.model" "$work/export/tokenizer.model" &&
  cmp -s "$work/assets/tokenizer_config.json" "$work/export/tokenizer_config.json" &&
  cmp -s "$work/assets/generation_config.json" "$work/export/generation_config.json" &&
  [ ! -e "$work/export/tokenizer.json" ] && [ -s "$work/export/model.safetensors" ] &&
  [ -z "$(find "$work/export" -name '*.tmp')" ]
check "ckpt export copies the run's tokenizer files" $?
"$bin" ckpt export --format safetensors --output "$work/export2" --hf-assets-path "$work/json_only" "$work/run/model_final.h5" >"$work/log" 2>&1
[ $? -eq 0 ] && cmp -s "$work/json_only/tokenizer.json" "$work/export2/tokenizer.json" && [ ! -e "$work/export2/tokenizer.model" ]
check "ckpt export --hf-assets-path DIR overrides the deck's folder" $?
"$bin" ckpt export --format safetensors --output "$work/export3" --hf-assets-path "$work/nowhere" "$work/run/model_final.h5" >"$work/log" 2>&1
[ $? -eq 2 ] && grep -qF -- "--hf-assets-path $work/nowhere: not a folder" "$work/log" && [ ! -e "$work/export3" ]
check "ckpt export --hf-assets-path of a missing folder: refused before writing" $?
mv "$work/assets" "$work/assets.moved"
"$bin" ckpt export --format safetensors --output "$work/export4" "$work/run/model_final.h5" >"$work/log" 2>&1
[ $? -eq 0 ] && grep -qF "tokenizer files not copied: [model] hf_assets_path \"$work/assets\" of the checkpoint's deck is not a folder here" "$work/log" &&
  [ -s "$work/export4/model.safetensors" ] && [ ! -e "$work/export4/tokenizer.model" ]
check "ckpt export of a run whose assets folder is gone: exported, and says the tokenizer was not copied" $?

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "hf_assets_path works for data prepare, training and export"
