#pragma once
/// @file ByteLevelBpeTokenizer: Hugging Face tokenizer.json files with a byte-level BPE model
/// (Llama 3, Qwen3, Mistral-Nemo, GPT-2 and most current models) and tiktoken rank files,
/// token for token equal to Hugging Face tokenizers on what it accepts.
///
/// Encoding follows Hugging Face tokenizers' pipeline:
///  1. added tokens (special or not) are cut out of the raw text, leftmost-longest first — those
///     marked `normalized` are looked for after normalization instead;
///  2. each remaining piece is normalized (none, or NFC by utf8proc);
///  3. pre-tokenized: Split (a regex, RegexSplitter) and ByteLevel (the GPT-2 byte alphabet,
///     optionally its own regex and a prefix space), in the order the Sequence lists them;
///  4. each pre-token's raw bytes go through BytePairEncoder;
///  5. the post-processor (ByteLevel: nothing to add; TemplateProcessing: its special tokens
///     around the single-sequence template) adds its ids.
/// Decoding concatenates the tokens' raw bytes (added tokens as their content).
///
/// What a tokenizer.json asks for and this class does not do (another model type, byte fallback,
/// dropout, other normalizers / pre-tokenizers / post-processors / decoders, lstrip/rstrip/
/// single_word added tokens) is refused with one line naming the component.
#include <memory>
#include <string>

#include "data/tokenizer.hpp"

namespace meshtrain {

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  /// From the contents of tokenizer.json and tokenizer_config.json (`config` may be empty; then
  /// bos/eos fall back to the post-processor's template and the special tokens named
  /// <|begin_of_text|> / <|end_of_text|> or <|endoftext|>). `source` prefixes every error.
  /// @throws DataError naming `source` and the component that is malformed or not implemented.
  static std::unique_ptr<ByteLevelBpeTokenizer> from_tokenizer_json(const std::string& json, const std::string& config,
                                                                    const std::string& source);
  /// From a tiktoken rank file (lines "<base64 token> <rank>"). Such files carry no pattern and
  /// no special tokens; Llama 3's are used (its pre-tokenizer regex, and 256 special tokens after
  /// the ranks: <|begin_of_text|> = bos, <|end_of_text|> = eos, <|reserved_special_token_0..3|>,
  /// <|start_header_id|>, <|end_header_id|>, <|reserved_special_token_4|>, <|eot_id|>, then
  /// <|reserved_special_token_5..250|>), as Meta's tokenizer.py defines them.
  /// @throws DataError naming `source` and the line when a line is malformed.
  static std::unique_ptr<ByteLevelBpeTokenizer> from_tiktoken(const std::string& bytes, const std::string& source);

  ~ByteLevelBpeTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_plain(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eos_id() const override;
  int32_t bos_id() const override;
  bool adds_bos() const override;
  std::string type() const override;
  std::vector<TokenizerFile> files() const override;

  struct Impl;

 private:
  explicit ByteLevelBpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain
