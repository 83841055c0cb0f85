#!/usr/bin/env bash
# Bad input through the real binary under mpirun: each case must exit 2 with exactly one line on
# stderr naming the file/line/key, print it once (not per rank), and create no output folder.
# usage: bad_input.sh MESHTRAIN_BIN WORKDIR
set -uo pipefail
bin=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
fails=0
pass=0
deck="$work/deck.toml"
cat > "$deck" <<'DECK'
[model]
name = "llama3"
flavor = "debugmodel"
[training]
dataset = "WORK/missing.h5"
seq_len = 32
steps = 2
DECK
sed -i "s#WORK#$work#" "$deck"

# expect NAME EXPECTED_SUBSTRING -- ARGS...: runs `mpirun -np 2 meshtrain ARGS`
expect() {
  local name=$1 want=$2
  shift 3
  local out="$work/$name"
  mpirun --allow-run-as-root --oversubscribe --quiet -np 2 "$bin" "$@" --job.dump_folder="$out" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  local lines
  lines=$(grep -cv '^$' "$work/stderr")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$work/stderr" || [ -e "$out" ]; then
    echo "FAIL $name: rc=$rc, $lines stderr lines, output folder $( [ -e "$out" ] && echo created || echo absent )"
    sed 's/^/    /' "$work/stderr"
    fails=$((fails + 1))
  else
    echo "ok   $name: $(cat "$work/stderr")"
    pass=$((pass + 1))
  fi
}

expect unknown_key "did you mean '--training.seq_len'" -- train --deck "$deck" --training.seqlen=4
expect wrong_type "expected integer, got abc" -- train --deck "$deck" --training.steps=abc
expect out_of_range "[optimizer] lr: value 0 is out of range" -- train --deck "$deck" --optimizer.lr=0
expect missing_deck "cannot read deck" -- train --deck "$work/nope.toml"
expect layout "-1 cannot fill world size 2" -- train --deck "$deck" --parallelism.data_parallel_replicate_degree=3
expect pp_microbatches "[parallelism] pipeline_parallel_microbatch_size: schedule 1F1B with pp = 2 got 1 micro-batches" -- train --deck "$deck" --parallelism.pipeline_parallel_degree=2 --training.local_batch_size=1
expect pp_layers_per_stage "[parallelism] pipeline_parallel_layers_per_stage = 3" -- train --deck "$deck" --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_layers_per_stage=3
expect tp_kv_heads "n_kv_heads 1 is not divisible by tp 2 (n_kv_heads % tp == 0)" -- train --deck "$deck" --model.n_kv_heads=1 --parallelism.tensor_parallel_degree=2
expect varlen_causal '[model] attn_mask_type: attn_type "varlen" needs attn_mask_type "block_causal", got "causal"' -- train --deck "$deck" --model.attn_type=varlen --model.attn_mask_type=causal
expect missing_dataset "missing.h5: cannot open token store" -- train --deck "$deck" --parallelism.data_parallel_replicate_degree=2
printf 'not hdf5' > "$work/corrupt.h5"
expect corrupt_dataset "corrupt.h5: not an HDF5 file" -- train --deck "$deck" --parallelism.data_parallel_replicate_degree=2 --training.dataset="$work/corrupt.h5"
printf '[training]\nsteps = 1\nsteps = 2\n' > "$work/dup.toml"
expect duplicate "dup.toml:3: [training] steps: duplicate key" -- train --deck "$work/dup.toml"

# data prepare: bad corpora (serial command; no mpirun needed)
mkdir -p "$work/empty" "$work/binary"
printf 'abc\0def' > "$work/binary/doc.txt"
for c in "empty:no non-empty documents:$work/empty" "binary:is NUL (binary file?):$work/binary" "missing:input does not exist:$work/none"; do
  IFS=: read -r name want input <<<"$c"
  "$bin" data prepare --input "$input" --output "$work/out-$name.h5" --vocab-size 300 >"$work/stdout" 2>"$work/stderr"
  rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" "$work/stderr" || [ -e "$work/out-$name.h5" ] || [ -e "$work/out-$name.h5.tmp" ]; then
    echo "FAIL data_$name: rc=$rc"; sed 's/^/    /' "$work/stderr"; fails=$((fails + 1))
  else
    echo "ok   data_$name: $(cat "$work/stderr")"; pass=$((pass + 1))
  fi
done
echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
