#define BOOST_TEST_MODULE corpus_reader
#include <boost/test/unit_test.hpp>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "data/corpus_reader.hpp"
#include "util/errors.hpp"
#include "scratch_dir.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

fs::path dir() {
  return meshtrain::testing::scratch_dir("meshtrain_test_corpus");
}

std::string write(const std::string& name, const std::string& text) {
  const fs::path p = dir() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

std::string write_gz(const std::string& name, const std::string& text) {
  const fs::path p = dir() / name;
  gzFile g = gzopen(p.c_str(), "wb");
  gzwrite(g, text.data(), unsigned(text.size()));
  gzclose(g);
  return p.string();
}

std::vector<std::string> texts(const std::vector<CorpusFile>& files, uint64_t b, uint64_t e, CorpusOptions o = {}) {
  std::vector<std::string> out;
  for_each_document(files, b, e, o, [&](Document&& d) { out.push_back(d.text); });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(json_lines_plain_and_gzip_in_corpus_order) {
  const auto a = write("a.jsonl", "{\"text\": \"first\"}\n\n{\"text\": \"second\", \"id\": 2}\r\n{\"text\": \"  \"}\n");
  const auto b = write_gz("b.jsonl.gz", "{\"text\": \"third \\u00e9\"}\n{\"text\": \"fourth\"}");
  const auto c = write("c.txt", "a text file is one document\n");
  const auto files = list_corpus({a, b, c});
  BOOST_TEST(int(files[1].kind) == int(CorpusFile::Kind::kJsonLinesGzip));
  BOOST_TEST(texts(files, 0, UINT64_MAX) ==
             std::vector<std::string>({"first", "second", "third \xC3\xA9", "fourth", "a text file is one document\n"}));
  CorpusOptions o;
  o.text_key = "content";
  BOOST_CHECK_EXCEPTION(texts(files, 0, UINT64_MAX, o), DataError, [&](const DataError& e) {
    return std::string(e.what()).find(a + ":1: no field \"content\"") == 0;
  });
}

BOOST_AUTO_TEST_CASE(any_split_of_the_bytes_visits_every_document_once_in_order) {
  std::string lines;
  for (int i = 0; i < 57; ++i) lines += "{\"text\": \"doc " + std::to_string(i) + std::string(size_t(i % 7), 'x') + "\"}\n";
  const auto files = list_corpus({write("p.jsonl", lines), write("q.txt", "tail doc"), write("r.jsonl", lines)});
  const uint64_t total = files.back().offset + files.back().bytes;
  const auto all = texts(files, 0, total);
  BOOST_TEST(all.size() == 115u);
  for (uint64_t parts : {2, 3, 5, 8, 64}) {
    std::vector<std::string> joined;
    for (uint64_t r = 0; r < parts; ++r)
      for (auto& t : texts(files, total * r / parts, total * (r + 1) / parts)) joined.push_back(t);
    BOOST_TEST(joined == all, parts << " parts");
  }
}

BOOST_AUTO_TEST_CASE(bad_lines_name_file_and_line_or_are_skipped_and_counted) {
  const auto f = write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"cut\n[1, 2]\n{\"text\": 5}\n{\"text\": \"\xff\"}\n{\"text\": \"ok2\"}\n");
  const auto files = list_corpus({f});
  BOOST_CHECK_EXCEPTION(texts(files, 0, UINT64_MAX), DataError, [&](const DataError& e) {
    BOOST_TEST_INFO(e.what());
    return std::string(e.what()).find(f + ":2: not valid JSON") == 0;
  });
  // From the middle of the file (a second rank's share) the line number is still right.
  BOOST_CHECK_EXCEPTION(texts(files, 20, UINT64_MAX), DataError, [&](const DataError& e) {
    return std::string(e.what()).find(f + ":3: not a JSON object") == 0;
  });
  CorpusOptions skip;
  skip.skip_bad_lines = true;
  std::vector<std::string> got;
  const int64_t skipped = for_each_document(files, 0, UINT64_MAX, skip, [&](Document&& d) { got.push_back(d.text); });
  BOOST_TEST(skipped == 4);
  BOOST_TEST(got == std::vector<std::string>({"ok", "ok2"}));
  BOOST_CHECK_THROW(list_corpus({(dir() / "missing.jsonl").string()}), DataError);
}
