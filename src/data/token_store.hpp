#pragma once
/// @file TokenStore: read access to the HDF5 token store written by `meshtrain data prepare`
/// (layout in doc/data-format.md).
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

/// One split ("train" or "validation") of a token store, fully loaded in memory as int32
/// (Brown is ~1.3 M tokens; a later issue may memory-map larger corpora).
struct TokenSplit {
  std::vector<int32_t> tokens;        ///< [N] all documents concatenated, each ending with eos
  std::vector<uint64_t> doc_offsets;  ///< [n_docs + 1] start of each document in `tokens`
};

/// Read-only view of one token store file.
class TokenStore {
 public:
  /// Opens and reads `path` (serial HDF5 read on each rank; the file is small).
  /// @throws DataError naming the file and the dataset when it is missing, unreadable, or
  ///         inconsistent (offsets not increasing, token id >= vocab_size, empty split).
  explicit TokenStore(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t vocab_size() const { return vocab_size_; }
  const TokenSplit& split(const std::string& name) const;  ///< "train" | "validation"; @throws DataError
  const std::string& tokenizer_model() const { return tokenizer_model_; }  ///< SentencePiece model bytes
  /// The attribute eos_id: the token that ends every document (document masking reads it);
  /// -1 when the store has no such attribute (stores written before it existed).
  int64_t eos_id() const { return eos_id_; }

 private:
  std::string path_;
  int64_t vocab_size_ = 0;
  int64_t eos_id_ = -1;
  TokenSplit train_, validation_;
  std::string tokenizer_model_;
};

}  // namespace meshtrain
