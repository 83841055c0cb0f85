#include "data/tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/byte_level_bpe_tokenizer.hpp"
#include "data/sentencepiece_tokenizer.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw DataError(p.string() + ": cannot read tokenizer file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A tiktoken rank file is text: every line "<base64> <decimal rank>".
bool looks_like_tiktoken(const std::string& b) {
  const size_t end = std::min(b.find('\n'), b.size());
  const size_t sp = b.find(' ');
  return end > 0 && sp != std::string::npos && sp < end && sp > 0 &&
         b.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == sp &&
         b.find_first_not_of("0123456789", sp + 1) == end;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) const {
  std::vector<int32_t> ids = encode(text);
  if (adds_bos()) ids.insert(ids.begin(), bos_id());
  ids.push_back(eos_id());
  return ids;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_hf_assets_tokenizer(path);
  const std::string bytes = read_file(path);
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') {
    const fs::path cfg = fs::path(path).parent_path() / "tokenizer_config.json";
    return ByteLevelBpeTokenizer::from_tokenizer_json(bytes, fs::is_regular_file(cfg, ec) ? read_file(cfg) : "", path);
  }
  if (looks_like_tiktoken(bytes)) return ByteLevelBpeTokenizer::from_tiktoken(bytes, path);
  return SentencePieceTokenizer::from_model_bytes(bytes, path);
}

std::unique_ptr<Tokenizer> load_hf_assets_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(dir + ": not a folder (--hf-assets-path)");
  const fs::path json = fs::path(dir) / "tokenizer.json", model = fs::path(dir) / "tokenizer.model";
  if (fs::is_regular_file(json, ec)) return load_tokenizer(json.string());
  if (fs::is_regular_file(model, ec)) return load_tokenizer(model.string());
  throw DataError(dir + ": no tokenizer.json or tokenizer.model in the folder (--hf-assets-path)");
}

}  // namespace meshtrain
