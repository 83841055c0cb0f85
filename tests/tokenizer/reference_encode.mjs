// The reference side of the tokenizer comparison (compare_tokenizers.py): Hugging Face's own
// JavaScript tokenizers (@huggingface/tokenizers) on a tokenizer.json, or tiktoken (the Rust
// crate compiled to WebAssembly) on a tiktoken rank file with Llama 3's pattern and specials.
// usage: node reference_encode.mjs hf DIR FILE...        (DIR holds tokenizer.json + tokenizer_config.json)
//        node reference_encode.mjs tiktoken RANKS FILE...
//        node reference_encode.mjs make-tiktoken DIR OUT  (writes DIR's vocabulary as a rank file)
// Prints, per document (each file whole, then each non-empty line), {"doc", "ids", "text", "nfc"}:
// nfc is the document in Unicode NFC (String.prototype.normalize), for round-trip checks.
// With BENCH_ROUNDS=R in the environment it times encoding each file whole instead and prints
// {"bytes", "tokens", "best_seconds", "mb_per_s"} (perf/tokenize_bench.py).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const [mode, model, ...files] = process.argv.slice(2);

function documents(file) {
  const text = fs.readFileSync(file, "utf8");
  const docs = [[file, text]];
  text.split("\n").forEach((line, i) => { if (line.length) docs.push([`${file}:${i + 1}`, line]); });
  return docs;
}

// GPT-2's byte-level alphabet, to turn tokenizer.json's spellings back into bytes.
function byteDecoder() {
  const keep = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  const map = new Map();
  let next = 0x100;
  for (let b = 0; b < 256; b++) map.set(String.fromCodePoint(keep(b) ? b : next++), b);
  return map;
}

export function llama3Specials(n) {
  const names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|reserved_special_token_4|>", "<|eot_id|>"];
  for (let i = 5; names.length < 256; i++) names.push(`<|reserved_special_token_${i}|>`);
  return Object.fromEntries(names.map((s, i) => [s, n + i]));
}
const LLAMA3_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

if (mode === "make-tiktoken") {
  const vocab = JSON.parse(fs.readFileSync(path.join(model, "tokenizer.json"), "utf8")).model.vocab;
  const dec = byteDecoder();
  const lines = Object.entries(vocab).sort((a, b) => a[1] - b[1])
    .map(([s, id]) => `${Buffer.from([...s].map((c) => dec.get(c))).toString("base64")} ${id}`);
  fs.writeFileSync(files[0], lines.join("\n") + "\n");
  process.exit(0);
}

let encode;
if (mode === "hf") {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const json = JSON.parse(fs.readFileSync(path.join(model, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(model, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const tok = new Tokenizer(json, cfg);
  encode = (t) => tok.encode(t, { add_special_tokens: false }).ids;
} else if (mode === "tiktoken") {
  const { Tiktoken } = require("tiktoken/lite");
  const ranks = fs.readFileSync(model, "utf8");
  const n = ranks.trim().split("\n").length;
  const enc = new Tiktoken(ranks, llama3Specials(n), LLAMA3_PATTERN);
  encode = (t) => Array.from(enc.encode(t, "all"));
} else {
  console.error("usage: node reference_encode.mjs hf|tiktoken|make-tiktoken MODEL FILE...");
  process.exit(2);
}
if (process.env.BENCH_ROUNDS) {  // perf/tokenize_bench.py: each file whole, best of the rounds
  const texts = files.map((f) => fs.readFileSync(f, "utf8"));
  const bytes = files.reduce((s, f) => s + fs.statSync(f).size, 0);
  let best = Infinity, tokens = 0;
  for (let r = 0; r < Number(process.env.BENCH_ROUNDS); r++) {
    const t0 = process.hrtime.bigint();
    tokens = 0;
    for (const t of texts) tokens += encode(t).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  process.stdout.write(JSON.stringify({ bytes, tokens, best_seconds: best, mb_per_s: bytes / 1e6 / best }) + "\n");
  process.exit(0);
}
for (const f of files)
  for (const [doc, text] of documents(f))
    process.stdout.write(JSON.stringify({ doc, ids: encode(text), text, nfc: text.normalize("NFC") }) + "\n");
