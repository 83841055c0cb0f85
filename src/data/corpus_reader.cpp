#include "data/corpus_reader.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/errors.hpp"

namespace fs = std::filesystem;

namespace meshtrain {

namespace {

// Offset of the first byte that breaks UTF-8 (RFC 3629) or is NUL; npos when the text is valid.
size_t first_invalid_utf8(const std::string& s, bool* nul) {
  *nul = false;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0) {
      *nul = true;
      return i;
    }
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + size_t(len) > n) return i;
    for (int k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + size_t(k)]) >> 6) != 0x2) return i;
    i += size_t(len);
  }
  return std::string::npos;
}

Document read_one(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw DataError(p.string() + ": cannot read input file");
  std::ostringstream ss;
  ss << in.rdbuf();
  Document d{p.string(), ss.str()};
  bool nul = false;
  const size_t bad = first_invalid_utf8(d.text, &nul);
  if (bad != std::string::npos)
    throw DataError(p.string() + ": byte " + std::to_string(bad) + (nul ? " is NUL (binary file?)" : " is not valid UTF-8") +
                    "; inputs must be UTF-8 text");
  return d;
}

}  // namespace

std::vector<Document> read_corpus(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw DataError("no --input given");
  std::vector<Document> docs;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) throw DataError(in + ": input does not exist");
    if (fs::is_directory(st)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file()) files.push_back(e.path());
      if (ec) throw DataError(in + ": cannot list directory (" + ec.message() + ")");
      std::sort(files.begin(), files.end());
      for (const auto& f : files) docs.push_back(read_one(f));
    } else {
      docs.push_back(read_one(in));
    }
  }
  docs.erase(std::remove_if(docs.begin(), docs.end(),
                            [](const Document& d) { return d.text.find_first_not_of(" \t\r\n") == std::string::npos; }),
             docs.end());
  if (docs.empty()) {
    std::string list;
    for (const auto& i : inputs) list += (list.empty() ? "" : ", ") + i;
    throw DataError(list + ": no non-empty documents in the input");
  }
  return docs;
}

}  // namespace meshtrain
