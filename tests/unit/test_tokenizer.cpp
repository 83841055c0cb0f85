#define BOOST_TEST_MODULE tokenizer
#include <boost/test/unit_test.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "data/byte_level.hpp"
#include "data/byte_level_bpe_tokenizer.hpp"
#include "data/bpe_model.hpp"
#include "data/regex_splitter.hpp"
#include "util/errors.hpp"

using namespace meshtrain;
using json = nlohmann::json;

namespace {

// A byte-level vocabulary: the 256 bytes (id = byte) and `merged` pieces after them.
std::vector<BytePairEncoder::Entry> byte_vocab(const std::vector<std::string>& merged) {
  std::vector<BytePairEncoder::Entry> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(std::string(1, char(b)), b);
  for (size_t i = 0; i < merged.size(); ++i) v.emplace_back(merged[i], int32_t(256 + i));
  return v;
}

// The textbook rule, written independently: merge the lowest-ranked adjacent pair (leftmost
// among equals) until none is left.
std::vector<std::string> naive_bpe(const std::string& word, const std::vector<BytePairEncoder::Merge>& merges) {
  std::vector<std::string> parts;
  for (char c : word) parts.emplace_back(1, c);
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) rank.emplace(merges[r], r);
  for (;;) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = rank.find({parts[i], parts[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == SIZE_MAX) return parts;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
}

// tokenizer.json of a byte-level BPE with `merges`, the given pre-tokenizer / normalizer /
// post-processor, and added tokens <s> (1000) and </s> (1001).
json toy_tokenizer(const std::vector<BytePairEncoder::Merge>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, char(b)))] = b;
  json m = json::array();
  int id = 256;
  for (const auto& [l, r] : merges) {
    vocab[bytes_to_byte_level(l + r)] = id++;
    m.push_back(bytes_to_byte_level(l) + " " + bytes_to_byte_level(r));
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"ignore_merges", false}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", json::array({{{"id", 1000}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 1001}, {"content", "</s>"}, {"special", true}},
                                        {{"id", 1002}, {"content", "</s>x"}, {"special", false}}})}};
}

const json kConfig = {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}};

void expect_refused(const json& j, const std::string& what) {
  BOOST_CHECK_EXCEPTION(ByteLevelBpeTokenizer::from_tokenizer_json(j.dump(), kConfig.dump(), "t/tokenizer.json"),
                        DataError, [&](const DataError& e) {
                          const std::string m = e.what();
                          BOOST_TEST_INFO(m);
                          return m.find("t/tokenizer.json") == 0 && m.find(what) != std::string::npos;
                        });
}

}  // namespace

BOOST_AUTO_TEST_CASE(byte_level_alphabet_round_trips_every_byte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  BOOST_TEST(*byte_level_to_bytes(bytes_to_byte_level(all)) == all);
  BOOST_TEST(bytes_to_byte_level(" ") == "\xC4\xA0");  // U+0120 'Ġ', GPT-2's space
  BOOST_TEST(bytes_to_byte_level("A") == "A");
  BOOST_TEST(!byte_level_to_bytes("\xE4\xBD\xA0").has_value());  // a CJK character is outside the alphabet
}

BOOST_AUTO_TEST_CASE(bpe_merges_lowest_rank_leftmost_first_short_and_long_words) {
  const std::vector<BytePairEncoder::Merge> merges = {{"a", "a"}, {"b", "c"}, {"aa", "aa"}, {"a", "bc"}, {"aaaa", "bc"},
                                                      {"c", "a"}, {"bc", "bc"}};
  std::vector<std::string> merged;
  for (const auto& [l, r] : merges) merged.push_back(l + r);
  const auto bpe = BytePairEncoder::from_merges(byte_vocab(merged), merges, false, "toy");
  std::mt19937 rng(7);
  for (int n : {1, 2, 3, 7, 40, 255, 256, 257, 300, 1000}) {  // both sides of the 256-byte switch to the heap
    for (int trial = 0; trial < 20; ++trial) {
      std::string w;
      for (int i = 0; i < n; ++i) w += "abc"[rng() % 3];
      std::vector<int32_t> ids;
      bpe.encode_word(w, ids);
      std::vector<std::string> got;
      for (int32_t id : ids) got.push_back(*bpe.token_bytes(id));
      BOOST_TEST(got == naive_bpe(w, merges), "word of " << n << " bytes: " << w.substr(0, 40));
    }
  }
  std::vector<int32_t> ids;
  bpe.encode_word(std::string(301, 'a'), ids);  // 150 x "aa" + "a" -> 75 x "aaaa" + "a"
  BOOST_TEST(ids.size() == 76u);
  BOOST_TEST(ids.back() == 'a');
}

BOOST_AUTO_TEST_CASE(tiktoken_ranks_give_the_same_merges_and_whole_word_rule) {
  // Ranks: bytes, then "ab" (256), "abc" (257), "abcd" (258). "abcd" is found whole; "xabcd" merges.
  const auto bpe = BytePairEncoder::from_ranks(byte_vocab({"ab", "abc", "abcd"}), "ranks");
  std::vector<int32_t> ids;
  bpe.encode_word("abcd", ids);
  BOOST_TEST(ids == std::vector<int32_t>({258}));
  ids.clear();
  bpe.encode_word("xabcd", ids);
  BOOST_TEST(ids == std::vector<int32_t>({'x', 258}));
  BOOST_CHECK_THROW(BytePairEncoder::from_ranks({{"a", 0}}, "ranks"), DataError);  // bytes missing
}

BOOST_AUTO_TEST_CASE(tokenizer_json_pipeline_added_tokens_template_and_decode) {
  json j = toy_tokenizer({{"a", "b"}, {"ab", "c"}});
  auto tok = ByteLevelBpeTokenizer::from_tokenizer_json(j.dump(), kConfig.dump(), "toy");
  BOOST_TEST(tok->vocab_size() == 1003);
  BOOST_TEST(tok->bos_id() == 1000);
  BOOST_TEST(tok->eos_id() == 1001);
  // GPT-2 pre-tokens: "abc", " abc", "!" ; added tokens leftmost-longest: "</s>x" beats "</s>".
  BOOST_TEST(tok->encode("abc abc!") == std::vector<int32_t>({257, ' ', 257, '!'}));
  BOOST_TEST(tok->encode("x<s>ab</s>x</s>") == std::vector<int32_t>({'x', 1000, 256, 1002, 1001}));
  BOOST_TEST(tok->decode(tok->encode("x<s>ab</s>x</s> héllo")) == "x<s>ab</s>x</s> héllo");
  BOOST_TEST(tok->encode_document("ab") == std::vector<int32_t>({1000, 256, 1001}));  // bos added, eos appended
  // A TemplateProcessing post-processor that adds bos: encode has it, documents do not get a second one.
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1000}}, {"tokens", {"<s>"}}}}}}};
  tok = ByteLevelBpeTokenizer::from_tokenizer_json(j.dump(), kConfig.dump(), "toy");
  BOOST_TEST(tok->encode("ab") == std::vector<int32_t>({1000, 256}));
  BOOST_TEST(tok->encode_plain("ab") == std::vector<int32_t>({256}));
  BOOST_TEST(tok->encode_document("ab") == std::vector<int32_t>({1000, 256, 1001}));
  BOOST_CHECK_THROW(tok->decode({5000}), DataError);
}

BOOST_AUTO_TEST_CASE(nfc_normalizer_composes_before_bpe) {
  json j = toy_tokenizer({});
  j["normalizer"] = {{"type", "NFC"}};
  const auto tok = ByteLevelBpeTokenizer::from_tokenizer_json(j.dump(), kConfig.dump(), "toy");
  BOOST_TEST(tok->decode(tok->encode("e\xCC\x81")) == "\xC3\xA9");  // e + U+0301 -> é
}

BOOST_AUTO_TEST_CASE(what_is_not_implemented_is_refused_with_one_line) {
  json j = toy_tokenizer({});
  j["normalizer"] = {{"type", "NFKC"}};
  expect_refused(j, "the normalizer \"NFKC\"");
  j = toy_tokenizer({});
  j["model"]["type"] = "WordPiece";
  expect_refused(j, "the model type \"WordPiece\"");
  j = toy_tokenizer({});
  j["model"]["byte_fallback"] = true;
  expect_refused(j, "byte_fallback");
  j = toy_tokenizer({});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  expect_refused(j, "\\w is not implemented yet");
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "MergedWithPrevious"}};
  expect_refused(j, "behavior \"MergedWithPrevious\" is not implemented yet");
  j = toy_tokenizer({});
  j["added_tokens"][0]["lstrip"] = true;
  expect_refused(j, "with lstrip is not implemented yet");
  j = toy_tokenizer({});
  j["decoder"] = {{"type", "Metaspace"}};
  expect_refused(j, "the decoder \"Metaspace\"");
  BOOST_CHECK_THROW(ByteLevelBpeTokenizer::from_tokenizer_json("{not json", "", "t/tokenizer.json"), DataError);
}

BOOST_AUTO_TEST_CASE(tiktoken_file_errors_name_the_line) {
  std::string ranks;
  for (int b = 0; b < 256; ++b) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    ranks += std::string{a[b >> 2], a[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  const auto tok = ByteLevelBpeTokenizer::from_tiktoken(ranks, "r.tiktoken");
  BOOST_TEST(tok->vocab_size() == 256 + 256);                       // Llama 3's 256 special tokens after the ranks
  BOOST_TEST(tok->encode("<|begin_of_text|>hi") == std::vector<int32_t>({256, 'h', 'i'}));
  BOOST_CHECK_EXCEPTION(ByteLevelBpeTokenizer::from_tiktoken("QQ== 0\nnot-a-line\n", "r.tiktoken"), DataError,
                        [](const DataError& e) { return std::string(e.what()).find("r.tiktoken:2:") == 0; });
}

BOOST_AUTO_TEST_CASE(oniguruma_whitespace_is_spelled_out_for_pcre2) {
  const RegexSplitter s(R"(\s+|[^\s]+)", RegexSplitter::Behavior::kIsolated, false, "p");
  std::vector<std::string> pieces;
  s.split("a\xC2\x85" "b\xE1\xA0\x8E" "c", [&](std::string_view p) { pieces.emplace_back(p); });
  // U+0085 is White_Space (Oniguruma's \s); U+180E is not (PCRE2's \h would take it).
  BOOST_TEST(pieces == std::vector<std::string>({"a", "\xC2\x85", "b\xE1\xA0\x8E" "c"}));
}
