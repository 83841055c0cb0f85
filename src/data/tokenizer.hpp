#pragma once
/// @file Tokenizer: the interface `meshtrain data prepare` encodes corpora with, and the loader
/// that picks an implementation from a file or a Hugging Face assets folder.
///
/// Implementations: SentencePieceTokenizer (a SentencePiece .model, trained here or loaded) and
/// ByteLevelBpeTokenizer (Hugging Face tokenizer.json with a byte-level BPE model, as Llama 3,
/// Qwen3 and most current models ship; or a tiktoken rank file). Encoders keep caches, so one
/// object must not be used by two threads at once.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

/// A file a tokenizer was loaded from, kept verbatim in the token store (doc/data-format.md).
struct TokenizerFile {
  std::string name;   ///< e.g. "tokenizer.json", "tokenizer_config.json", "model"
  std::string bytes;  ///< the file's contents
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Token ids of `text` (valid UTF-8) as the tokenizer's own encode gives them, including any
  /// special tokens its post-processor adds; special-token strings inside the text become their
  /// ids (Hugging Face's default). @throws DataError when the text cannot be encoded.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// Ids of `text` without the post-processor's special tokens (for decode round trips).
  virtual std::vector<int32_t> encode_plain(std::string_view text) const = 0;
  /// One training document: encode(text) with bos_id() in front when adds_bos(), and eos_id()
  /// at the end (TorchTitan's HuggingFaceTokenizer.encode(text, add_bos=True, add_eos=True)).
  std::vector<int32_t> encode_document(std::string_view text) const;
  /// Text of `ids`, special tokens included as their strings. @throws DataError on an unknown id.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// Number of ids: one more than the largest id (added tokens included).
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eos_id() const = 0;
  /// Id of the beginning-of-sequence token, or -1 when the tokenizer has none.
  virtual int32_t bos_id() const = 0;
  /// Whether encode_document puts bos_id() in front: the tokenizer has a bos and its
  /// post-processor does not already add it (TorchTitan's hf_adds_bos test).
  virtual bool adds_bos() const = 0;
  /// "sentencepiece", "tokenizer.json" or "tiktoken".
  virtual std::string type() const = 0;
  /// The files this tokenizer was built from, to record in the token store.
  virtual std::vector<TokenizerFile> files() const = 0;
};

/// Loads `path` by its format: a SentencePiece model (protobuf), a tiktoken rank file (lines of
/// base64 token and rank), or a Hugging Face tokenizer.json (with tokenizer_config.json beside it
/// when present). @throws DataError naming the file when it is unreadable or of none of these
/// formats, and for what a tokenizer.json asks that is not implemented yet.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

/// Loads the tokenizer of a Hugging Face model folder (TorchTitan's [model] hf_assets_path):
/// tokenizer.json + tokenizer_config.json, else tokenizer.model (SentencePiece or tiktoken).
/// @throws DataError naming the folder when it holds no tokenizer.
std::unique_ptr<Tokenizer> load_hf_assets_tokenizer(const std::string& dir);

}  // namespace meshtrain
