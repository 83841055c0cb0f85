#pragma once
/// @file Reads a corpus: plain text files (each file one document) and JSON Lines files
/// (`.jsonl`, `.jsonl.gz`, `.json.gz`: one JSON object per line, the document in a string field),
/// whole or as one rank's share of the bytes for parallel preparation.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshtrain {

struct Document {
  std::string source;  ///< file path (with ":LINE" for JSON Lines)
  std::string text;    ///< UTF-8
};

/// One input file of a corpus.
struct CorpusFile {
  enum class Kind { kText, kJsonLines, kJsonLinesGzip };
  std::string path;
  Kind kind = Kind::kText;
  uint64_t bytes = 0;   ///< size on disk
  uint64_t offset = 0;  ///< first byte in the concatenation of all the corpus's files
};

/// How JSON Lines are read.
struct CorpusOptions {
  std::string text_key = "text";  ///< the field that holds a document's text
  bool skip_bad_lines = false;    ///< skip (and count) bad lines instead of failing
};

/// Lists the files of `inputs` in order: a regular file is itself, a directory contributes the
/// regular files directly inside it, sorted by name. The kind comes from the name (.jsonl,
/// .jsonl.gz, .json.gz; anything else is text).
/// @throws DataError naming the path when it is missing or a directory cannot be listed.
std::vector<CorpusFile> list_corpus(const std::vector<std::string>& inputs);

/// Calls `doc` with every non-blank document whose first byte lies in [begin, end) of the
/// files' concatenation, in corpus order (a gzip file is one unit, owned by the range holding
/// its first byte). Splitting [0, total) into consecutive ranges visits every document exactly
/// once, whatever the number of ranges. Returns the number of bad JSON Lines skipped.
/// @throws DataError naming FILE:LINE for a bad JSON line (not an object, no string field
///         `text_key`, invalid JSON or UTF-8) unless skip_bad_lines, and naming the file (and
///         byte offset) for an unreadable, non-UTF-8 or binary (NUL) text file.
int64_t for_each_document(const std::vector<CorpusFile>& files, uint64_t begin, uint64_t end,
                          const CorpusOptions& options, const std::function<void(Document&&)>& doc);

/// Every document of `inputs` (text and JSON Lines) in memory.
/// @throws DataError as for_each_document, and when no document is non-blank.
std::vector<Document> read_corpus(const std::vector<std::string>& inputs, const CorpusOptions& options = {});

}  // namespace meshtrain
