#pragma once
/// @file SentencePieceTokenizer: a SentencePiece BPE model (Kudo & Richardson 2018), trained here
/// or loaded from a .model file.
#include <memory>
#include <string>
#include <vector>

#include "data/corpus_reader.hpp"
#include "data/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshtrain {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Trains a BPE model of at most `vocab_size` pieces (byte fallback, so any UTF-8 encodes)
  /// on the documents' lines, deterministically. @throws DataError when training fails.
  static std::unique_ptr<SentencePieceTokenizer> train(const std::vector<Document>& docs, int64_t vocab_size);
  /// Loads a serialized SentencePiece model (a .model file's bytes). @throws DataError naming `source`.
  static std::unique_ptr<SentencePieceTokenizer> from_model_bytes(const std::string& bytes, const std::string& source);

  ~SentencePieceTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_plain(std::string_view text) const override { return encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eos_id() const override;
  int32_t bos_id() const override;
  /// SentencePiece stores separate documents by eos only (the format's first version).
  bool adds_bos() const override { return false; }
  std::string type() const override { return "sentencepiece"; }
  std::vector<TokenizerFile> files() const override { return {{"model", model_}}; }
  const std::string& model_bytes() const { return model_; }

 private:
  SentencePieceTokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string model_;
};

}  // namespace meshtrain
