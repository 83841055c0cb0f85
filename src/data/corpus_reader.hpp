#pragma once
/// @file Reads a text corpus: each input file is one document.
#include <string>
#include <vector>

namespace meshtrain {

struct Document {
  std::string source;  ///< file path
  std::string text;    ///< UTF-8
};

/// Reads every path in `inputs`: a regular file is one document, a directory contributes all
/// regular files directly inside it, sorted by name.
/// @throws DataError naming the path: missing or unreadable, not UTF-8 (with the byte offset),
///         containing NUL bytes (binary), or no non-empty document at all.
std::vector<Document> read_corpus(const std::vector<std::string>& inputs);

}  // namespace meshtrain
