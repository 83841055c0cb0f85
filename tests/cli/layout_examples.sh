#!/usr/bin/env bash
# Prints the worked layout examples of doc/layout.md from the real `meshtrain layout` command
# (the doc's generated part must equal this output; ctest layout_doc_is_current checks it).
# usage: layout_examples.sh MESHTRAIN_BIN SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
example() {  # DECK TITLE WORLD OVERRIDES...
  local deck=$1 title=$2 world=$3
  shift 3
  echo
  echo "### $title"
  echo
  echo '```'
  echo "\$ meshtrain layout --deck $deck --world-size $world $*"
  (cd "$src" && "$bin" layout --deck "$deck" --world-size "$world" --csv "$tmp/l.csv" "$@") |
    grep -v '^per-rank coordinates'
  if [ "$world" -le 16 ]; then
    echo
    awk -F, '{ printf "%-5s %-9s %-5s %-5s %-11s %-3s %-13s %-9s %-3s %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }' "$tmp/l.csv"
  fi
  echo '```'
}
common=(--training.global_batch_size=-1 --topology.ranks_per_node=4)
example inputs/llama3_debug.toml "dp_shard 2 × tp 4 on 8 ranks (2 nodes of 4)" 8 "${common[@]}" --parallelism.tensor_parallel_degree=4
example inputs/llama3_debug.toml "dp_shard 2 × cp 2 × tp 2 on 8 ranks" 8 "${common[@]}" --parallelism.context_parallel_degree=2 --parallelism.tensor_parallel_degree=2
example inputs/llama3_debug.toml "pp 4 × dp_shard 2 on 8 ranks" 8 "${common[@]}" --parallelism.pipeline_parallel_degree=4
example inputs/llama3_debug.toml "dp_shard 2 × tp 2 × pp 2 on 8 ranks" 8 "${common[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.pipeline_parallel_degree=2
example inputs/llama3_70b_tp4_fsdp8.toml "Multi-rack: Llama 3 70B, TP 4 × FSDP 8 on 32 GPUs, 8 per node, 2 nodes per rack" 32 \
  --topology inputs/topology/h100_2nodes_per_rack.conf
example inputs/mixtral_8x7b_tp4_ep2_fsdp8.toml "Mixtral 8x7B: tp 4 × dp_shard 8 with ep 2 on 32 ranks (4 nodes of 8)" 32 --topology inputs/topology/h100_2nodes_per_rack.conf
