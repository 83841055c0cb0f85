// tokenizer_encode: meshtrain's side of the tokenizer comparison (compare_tokenizers.py).
// usage: tokenizer_encode TOKENIZER FILE...   (TOKENIZER: a file or a Hugging Face folder)
//        tokenizer_encode --bench ROUNDS TOKENIZER FILE...   (perf/tokenize_bench.py)
// Prints one JSON object per document: {"doc", "ids", "decoded"}, where the documents are each
// file whole and then each of its non-empty lines (more beginnings and ends of pre-tokens);
// ids are encode_plain's (no post-processor tokens) and decoded is decode(ids). With --bench it
// encodes each file whole, ROUNDS times on one thread (a freshly loaded tokenizer each time), and prints {"bytes", "tokens",
// "best_seconds", "mb_per_s"} for the fastest round.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer.hpp"
#include "util/errors.hpp"

namespace {

std::string read(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int bench(int rounds, const char* model, int n, char** files) {
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += texts.emplace_back(read(files[i])).size();
  double best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto tok = meshtrain::load_tokenizer(model);  // a fresh word cache each round: no round sees a warm one
    const auto t0 = std::chrono::steady_clock::now();
    tokens = 0;
    for (const auto& t : texts) tokens += tok->encode_plain(t).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::cout << nlohmann::json{{"bytes", bytes}, {"tokens", tokens}, {"best_seconds", best}, {"mb_per_s", bytes / 1e6 / best}}
            << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::string(argv[1]) == "--bench" && argc < 5)) {
    std::fprintf(stderr, "usage: tokenizer_encode TOKENIZER FILE...\n");
    return 2;
  }
  try {
    if (std::string(argv[1]) == "--bench") return bench(std::atoi(argv[2]), argv[3], argc - 4, argv + 4);
    const auto tok = meshtrain::load_tokenizer(argv[1]);
    for (int a = 2; a < argc; ++a) {
      std::ifstream in(argv[a], std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      std::vector<std::pair<std::string, std::string>> docs = {{argv[a], text}};
      std::istringstream lines(text);
      int n = 0;
      for (std::string line; std::getline(lines, line);)
        if (++n, !line.empty()) docs.emplace_back(std::string(argv[a]) + ":" + std::to_string(n), line);
      for (const auto& [name, t] : docs) {
        const auto ids = tok->encode_plain(t);
        nlohmann::json j = {{"doc", name}, {"ids", ids}, {"decoded", tok->decode(ids)}};
        std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
      }
    }
  } catch (const meshtrain::DataError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
