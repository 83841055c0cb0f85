#pragma once
/// @file Writes the HDF5 token store (layout: doc/data-format.md).
#include <string>

#include "data/token_store.hpp"
#include "data/tokenizer.hpp"

namespace meshtrain {

/// Statistics of a written store.
struct TokenStoreSummary {
  int64_t train_docs = 0, validation_docs = 0, train_tokens = 0, validation_tokens = 0, vocab_size = 0;
};

/// Encodes `docs` with `tok`, puts each document in train or validation by a hash of its index
/// (a deterministic split with about `validation_fraction` of the documents in validation, at
/// least one in each), and writes `path` via `path.tmp` + rename (nothing half-written on error).
/// Tokens are stored as uint16 when vocab_size ≤ 65536, else uint32.
/// @throws DataError naming the file when fewer than 2 documents are given or writing fails.
TokenStoreSummary write_token_store(const std::string& path, const std::vector<Document>& docs, const Tokenizer& tok,
                                    double validation_fraction, const std::string& source_description);

/// True when document `index` goes to the validation split (fraction in [0, 1]).
bool is_validation_document(int64_t index, double validation_fraction);

}  // namespace meshtrain
