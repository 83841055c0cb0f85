#pragma once
/// @file Tokenizer: a SentencePiece BPE model (Kudo & Richardson 2018), trained here or loaded.
#include <memory>
#include <string>
#include <vector>

#include "data/corpus_reader.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshtrain {

class Tokenizer {
 public:
  /// Trains a BPE model of at most `vocab_size` pieces (byte fallback, so any UTF-8 encodes)
  /// on the documents' lines, deterministically. @throws DataError when training fails.
  static Tokenizer train(const std::vector<Document>& docs, int64_t vocab_size);
  /// Loads a serialized SentencePiece model (a .model file's bytes). @throws DataError.
  static Tokenizer from_model_bytes(const std::string& bytes, const std::string& source);
  /// Loads a .model file. @throws DataError naming the file.
  static Tokenizer from_file(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  ~Tokenizer();
  /// Token ids of `text`, followed by eos_id().
  std::vector<int32_t> encode_document(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const;
  int32_t eos_id() const;
  int32_t bos_id() const;
  const std::string& model_bytes() const { return model_; }

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string model_;
};

}  // namespace meshtrain
