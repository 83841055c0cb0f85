#include "data/corpus_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
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

bool blank(const std::string& t) { return t.find_first_not_of(" \t\r\n") == std::string::npos; }

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Document read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot read input file");
  std::ostringstream ss;
  ss << in.rdbuf();
  Document d{path, ss.str()};
  bool nul = false;
  const size_t bad = first_invalid_utf8(d.text, &nul);
  if (bad != std::string::npos)
    throw DataError(path + ": byte " + std::to_string(bad) + (nul ? " is NUL (binary file?)" : " is not valid UTF-8") +
                    "; inputs must be UTF-8 text");
  return d;
}

// Line source over a plain file from a byte position, or over a whole gzip file.
class LineReader {
 public:
  LineReader(const CorpusFile& f, uint64_t start) : path_(f.path) {
    if (f.kind == CorpusFile::Kind::kJsonLinesGzip) {
      gz_ = gzopen(f.path.c_str(), "rb");
      if (!gz_) throw DataError(f.path + ": cannot open gzip file");
      gzbuffer(gz_, 1 << 18);
    } else {
      in_.open(f.path, std::ios::binary);
      if (!in_) throw DataError(f.path + ": cannot read input file");
      in_.seekg(std::streamoff(start));
    }
    pos_ = start;
  }
  ~LineReader() {
    if (gz_) gzclose(gz_);
  }
  uint64_t position() const { return pos_; }  // byte offset of the next line (uncompressed for gzip)
  bool next(std::string& line) {
    line.clear();
    if (!gz_) {
      if (!std::getline(in_, line)) return false;
      pos_ += line.size() + (in_.eof() ? 0 : 1);
      return true;
    }
    char buf[1 << 16];
    bool any = false;
    while (gzgets(gz_, buf, sizeof buf)) {
      any = true;
      line += buf;
      if (!line.empty() && line.back() == '\n') {
        line.pop_back();
        break;
      }
    }
    int err = 0;
    const char* msg = gzerror(gz_, &err);
    if (err != Z_OK && err != Z_STREAM_END) throw DataError(path_ + ": gzip stream is corrupt (" + msg + ")");
    pos_ += line.size() + 1;
    return any;
  }

 private:
  std::string path_;
  std::ifstream in_;
  gzFile gz_ = nullptr;
  uint64_t pos_ = 0;
};

// Line number (1-based) of the line starting at byte `at` of a plain file: only needed for an
// error message, so it is counted then.
int64_t line_number(const std::string& path, uint64_t at) {
  std::ifstream in(path, std::ios::binary);
  int64_t line = 1;
  char buf[1 << 16];
  uint64_t done = 0;
  while (done < at && in.read(buf, std::streamsize(std::min<uint64_t>(sizeof buf, at - done))), in.gcount() > 0) {
    line += std::count(buf, buf + in.gcount(), '\n');
    done += uint64_t(in.gcount());
    if (done >= at) break;
  }
  return line;
}

// The document text of one JSON line; throws std::string describing what is wrong.
std::string json_text(const std::string& line, const std::string& key) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    throw "not valid JSON (" + what + ")";
  }
  if (!j.is_object()) throw std::string("not a JSON object");
  const auto it = j.find(key);
  if (it == j.end()) throw "no field \"" + key + "\" (--text-key)";
  if (!it->is_string()) throw "field \"" + key + "\" is not a string";
  return it->get<std::string>();
}

int64_t read_json_lines(const CorpusFile& f, uint64_t a, uint64_t b, const CorpusOptions& opt,
                        const std::function<void(Document&&)>& doc) {
  const bool gz = f.kind == CorpusFile::Kind::kJsonLinesGzip;
  uint64_t start = gz ? 0 : a;
  int64_t line_no = gz ? 1 : 0;  // 0: not yet known (counted when an error needs it)
  if (!gz && a > 0) {            // the line containing byte a-1 belongs to the previous range
    std::ifstream in(f.path, std::ios::binary);
    in.seekg(std::streamoff(a - 1));
    std::string rest;
    std::getline(in, rest);
    start = a - 1 + rest.size() + 1;
  } else if (!gz) {
    line_no = 1;
  }
  if (!gz && start >= b) return 0;
  LineReader r(f, start);
  std::string line;
  int64_t skipped = 0;
  for (uint64_t at = r.position(); (gz || at < b) && r.next(line); at = r.position()) {
    const int64_t this_line = line_no ? line_no : (line_no = line_number(f.path, at));
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (blank(line)) continue;
    try {
      std::string text = json_text(line, opt.text_key);
      if (!blank(text)) doc(Document{f.path + ":" + std::to_string(this_line), std::move(text)});
    } catch (const std::string& what) {
      if (!opt.skip_bad_lines)
        throw DataError(f.path + ":" + std::to_string(this_line) + ": " + what +
                        " (each line must be a JSON object with a string field; --skip-bad-lines skips such lines)");
      ++skipped;
    }
  }
  return skipped;
}

}  // namespace

std::vector<CorpusFile> list_corpus(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw DataError("no --input given");
  std::vector<fs::path> paths;
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
      paths.insert(paths.end(), files.begin(), files.end());
    } else {
      paths.emplace_back(in);
    }
  }
  std::vector<CorpusFile> files;
  uint64_t offset = 0;
  for (const auto& p : paths) {
    CorpusFile f;
    f.path = p.string();
    f.kind = ends_with(f.path, ".jsonl")                                   ? CorpusFile::Kind::kJsonLines
             : ends_with(f.path, ".jsonl.gz") || ends_with(f.path, ".json.gz") ? CorpusFile::Kind::kJsonLinesGzip
                                                                           : CorpusFile::Kind::kText;
    std::error_code ec;
    f.bytes = fs::file_size(p, ec);
    if (ec) throw DataError(f.path + ": cannot read input file (" + ec.message() + ")");
    f.offset = offset;
    offset += f.bytes;
    files.push_back(f);
  }
  return files;
}

int64_t for_each_document(const std::vector<CorpusFile>& files, uint64_t begin, uint64_t end,
                          const CorpusOptions& options, const std::function<void(Document&&)>& doc) {
  int64_t skipped = 0;
  for (const CorpusFile& f : files) {
    const bool whole = f.kind != CorpusFile::Kind::kJsonLines;  // one unit, owned by its first byte
    if (whole) {
      if (f.offset < begin || f.offset >= end) continue;
      if (f.kind == CorpusFile::Kind::kText) {
        Document d = read_text(f.path);
        if (!blank(d.text)) doc(std::move(d));
      } else {
        skipped += read_json_lines(f, 0, f.bytes, options, doc);
      }
      continue;
    }
    const uint64_t a = std::max(begin, f.offset), b = std::min(end, f.offset + f.bytes);
    if (a < b) skipped += read_json_lines(f, a - f.offset, b - f.offset, options, doc);
  }
  return skipped;
}

std::vector<Document> read_corpus(const std::vector<std::string>& inputs, const CorpusOptions& options) {
  const auto files = list_corpus(inputs);
  std::vector<Document> docs;
  for_each_document(files, 0, UINT64_MAX, options, [&](Document&& d) { docs.push_back(std::move(d)); });
  if (docs.empty()) {
    std::string list;
    for (const auto& i : inputs) list += (list.empty() ? "" : ", ") + i;
    throw DataError(list + ": no non-empty documents in the input");
  }
  return docs;
}

}  // namespace meshtrain
