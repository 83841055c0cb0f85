#!/usr/bin/env bash
# The TorchTitan-style decks of this folder through the real binary (doc/torchtitan-compat.md):
# each lays out on its preset's GPU count as written; `deck check` refuses what meshtrain cannot
# honour with one line naming the deck line (first the Hugging Face dataset name, then the
# features not implemented yet), each refusal is lifted by a command-line override, and then the
# deck resolves with one well-formed notice line per key that has no effect here.
# usage: check_decks.sh MESHTRAIN_BIN DECK_DIR WORKDIR
set -uo pipefail
bin=$1
dir=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
cd "$dir" || exit 1
fails=0
store=--training.dataset_path=tiny.h5  # deck check does not open the store

fail() {
  echo "FAIL $*"
  sed 's/^/    /' "$work/out" "$work/err"
  fails=$((fails + 1))
}

# refused DECK WORLD WANT [OVERRIDES...]: deck check exits 2 with one stderr line containing WANT.
refused() {
  local deck=$1 world=$2 want=$3
  shift 3
  "$bin" deck check --deck "$deck" --world-size "$world" "$@" >"$work/out" 2>"$work/err"
  local rc=$? lines
  lines=$(grep -c . "$work/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$work/err"; then
    fail "$deck refused ($*): rc=$rc, $lines stderr lines, want: $want"
  else
    echo "ok   $deck refused: $(cat "$work/err")"
  fi
}

# resolves DECK WORLD NOTICES [OVERRIDES...]: deck check exits 0 for WORLD ranks and prints
# exactly NOTICES notice lines, each `notice: DECK:LINE: [section] key: why`.
resolves() {
  local deck=$1 world=$2 notices=$3
  shift 3
  "$bin" deck check --deck "$deck" --world-size "$world" "$@" >"$work/out" 2>"$work/err"
  local rc=$? got bad
  got=$(grep -c '^notice: ' "$work/out")
  bad=$(grep '^notice: ' "$work/out" | grep -cvE "^notice: $deck:[0-9]+: \[[a-z_.0-9]+\] [a-z_0-9]+: .+")
  if [ "$rc" -ne 0 ] || ! grep -q "^$deck: valid for $world ranks" "$work/out" || [ "$got" -ne "$notices" ] ||
     [ "$bad" -ne 0 ] || [ -s "$work/err" ]; then
    fail "$deck resolves ($*): rc=$rc, $got notices (want $notices), $bad malformed"
  else
    echo "ok   $deck resolves on $world ranks with $got notices"
  fi
}

# lays_out DECK WORLD: `meshtrain layout` accepts the deck as written.
lays_out() {
  "$bin" layout --deck "$1" --world-size "$2" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q "world $2 ranks" "$work/out"; then
    fail "$1 lays out on $2 ranks: rc=$rc"
  else
    echo "ok   $1 lays out on $2 ranks"
  fi
}

# The line of the first line of DECK matching PATTERN (grep -E).
line_of() { grep -nE "$2" "$1" | head -1 | cut -d: -f1; }

c4='is a Hugging Face dataset name (TorchTitan downloads it); meshtrain trains from a pre-tokenized token store: prepare one with `meshtrain data prepare'

# llama3 debug (8 GPUs): only the dataset name stands in the way.
lays_out llama3_debug.toml 8
refused llama3_debug.toml 8 "llama3_debug.toml:$(line_of llama3_debug.toml '^dataset =' ): [training] dataset: \"c4_test\" $c4"
resolves llama3_debug.toml 8 9 $store
resolves llama3_debug_all_sections.toml 8 30 $store
# llama3 8B (64 A100, per-operator checkpointing): only the dataset.
lays_out llama3_8b.toml 64
refused llama3_8b.toml 64 "llama3_8b.toml:$(line_of llama3_8b.toml '^dataset =' ): [training] dataset: \"c4\" $c4"
resolves llama3_8b.toml 64 7 $store
# llama3 70B (64 A100, tp 8).
lays_out llama3_70b.toml 64
refused llama3_70b.toml 64 "llama3_70b.toml:$(line_of llama3_70b.toml '^dataset =' ): [training] dataset: \"c4\" $c4"
resolves llama3_70b.toml 64 7 $store
# llama3 405B (128 H100, tp 8): float8 linears (the cpu device only emulates them: emulate = true,
# also under tp 8); its asynchronous tensor parallelism is honoured (tp 8, sequence parallel), gets
# one more notice (no effect) with tp 1, and is refused, naming the key, without sequence parallelism.
lays_out llama3_405b.toml 128
refused llama3_405b.toml 128 "llama3_405b.toml:$(line_of llama3_405b.toml '^converters' ): [model] converters: the cpu device has no FP8 GEMMs, so float8 training there is only an emulation"
refused llama3_405b.toml 128 "llama3_405b.toml:$(line_of llama3_405b.toml '^dataset =' ): [training] dataset: \"c4\" $c4" --quantize.linear.float8.emulate=true
resolves llama3_405b.toml 128 5 --quantize.linear.float8.emulate=true $store
resolves llama3_405b.toml 128 8 --model.converters= $store
resolves llama3_405b.toml 128 6 --quantize.linear.float8.emulate=true $store --parallelism.tensor_parallel_degree=1
refused llama3_405b.toml 128 "llama3_405b.toml:$(line_of llama3_405b.toml '^enable_async_tensor_parallel' ): [parallelism] enable_async_tensor_parallel: true needs sequence parallelism" --quantize.linear.float8.emulate=true $store --parallelism.enable_sequence_parallel=false
# On the cuda device the preset runs as it is (FP8 GEMMs, the FP8 all-gather of FSDP shards with
# its precomputed scale): only the dataset needs overriding; without the all-gather, precompute
# has no effect (a notice).
resolves llama3_405b.toml 128 5 $store --training.device=cuda
resolves llama3_405b.toml 128 6 $store --training.device=cuda --quantize.linear.float8.enable_fsdp_float8_all_gather=false
# qwen3 0.6B and 1.7B (8 GPUs, per-operator checkpointing): only the dataset.
for d in qwen3_0.6b.toml qwen3_1.7b.toml; do
  lays_out $d 8
  refused $d 8 "$d:$(line_of $d '^dataset =' ): [training] dataset: \"c4\" $c4"
  resolves $d 8 7 $store
done
# qwen3 32B (8 H100): full checkpointing.
lays_out qwen3_32b.toml 8
resolves qwen3_32b.toml 8 7 $store
# qwen3 debug (the debugmodel flavor in the Qwen3 presets' layout).
lays_out qwen3_debug.toml 8
refused qwen3_debug.toml 8 "qwen3_debug.toml:$(line_of qwen3_debug.toml '^dataset =' ): [training] dataset: \"c4_test\" $c4"
resolves qwen3_debug.toml 8 6 $store
# qwen3 MoE debug (8 GPUs, ep 1, per-operator checkpointing): only the dataset, like the dense presets.
lays_out qwen3_moe_debug.toml 8
refused qwen3_moe_debug.toml 8 "qwen3_moe_debug.toml:$(line_of qwen3_moe_debug.toml '^dataset =' ): [training] dataset: \"c4_test\" $c4"
resolves qwen3_moe_debug.toml 8 7 $store
# The other Mixture-of-Experts models: refused by layout and deck check alike, naming the key.
for spec in "deepseek_v3_debug.toml:deepseek_v3_debug.toml:$(line_of deepseek_v3_debug.toml '^name' ):"' [model] name: Mixture-of-Experts model '"'"'deepseek_v3'"'"' (TorchTitan) is not implemented yet'; do
  deck=${spec%%:*}
  want=${spec#*:}
  refused "$deck" 8 "$want" $store
  "$bin" layout --deck "$deck" --world-size 8 >"$work/out" 2>"$work/err"
  if [ $? -ne 2 ] || ! grep -qF -- "$want" "$work/err"; then fail "$deck layout refused"; else echo "ok   $deck layout refused"; fi
done

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "every TorchTitan-style deck lays out, refuses what it must and resolves"
