// tokenizer_encode: meshtrain's side of the tokenizer comparison (compare_tokenizers.py).
// usage: tokenizer_encode TOKENIZER FILE...   (TOKENIZER: a file or a Hugging Face folder)
// Prints one JSON object per document: {"doc", "ids", "decoded"}, where the documents are each
// file whole and then each of its non-empty lines (more beginnings and ends of pre-tokens);
// ids are encode_plain's (no post-processor tokens) and decoded is decode(ids).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer.hpp"
#include "util/errors.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_encode TOKENIZER FILE...\n");
    return 2;
  }
  try {
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
