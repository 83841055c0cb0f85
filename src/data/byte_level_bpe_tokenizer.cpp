#include "data/byte_level_bpe_tokenizer.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <boost/archive/iterators/binary_from_base64.hpp>
#include <boost/archive/iterators/transform_width.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "data/bpe_model.hpp"
#include "data/byte_level.hpp"
#include "data/regex_splitter.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer pattern, used by ByteLevel when `use_regex` is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's pattern (Meta's tokenizer.py), for tiktoken rank files.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool normalized = false;
};

// Leftmost-longest search for added tokens (Hugging Face's AddedVocabulary uses an Aho-Corasick
// automaton with the same semantics). Added tokens are few and start with rare bytes ('<'), so a
// first-byte table with candidates sorted longest first is enough.
class AddedTokenMatcher {
 public:
  void add(const AddedToken& t) {
    if (t.content.empty()) return;
    auto& v = by_first_[static_cast<unsigned char>(t.content[0])];
    v.push_back(t);
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.content.size() > b.content.size(); });
  }
  bool empty() const {
    return std::all_of(by_first_.begin(), by_first_.end(), [](const auto& v) { return v.empty(); });
  }
  // Calls gap(text) for text between matches and token(id) for each match, in order.
  template <class Gap, class Token>
  void split(std::string_view text, Gap&& gap, Token&& token) const {
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto& cands = by_first_[static_cast<unsigned char>(text[i])];
      if (cands.empty()) continue;
      for (const AddedToken& t : cands) {
        if (text.compare(i, t.content.size(), t.content) != 0) continue;
        if (i > start) gap(text.substr(start, i - start));
        token(t.id);
        start = i + t.content.size();
        i = start - 1;
        break;
      }
    }
    if (start < text.size()) gap(text.substr(start));
  }

 private:
  std::array<std::vector<AddedToken>, 256> by_first_;
};

struct ByteLevelStage {
  bool add_prefix_space = false;
  std::optional<RegexSplitter> gpt2;  // set when use_regex
};
using PreTokenizerStage = std::variant<RegexSplitter, ByteLevelStage>;

[[noreturn]] void refuse(const std::string& source, const std::string& what) {
  throw DataError(source + ": " + what + " is not implemented yet");
}

const json& member(const json& j, const char* key, const std::string& source, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw DataError(source + ": " + where + " has no \"" + key + "\"");
  return j.at(key);
}

bool flag(const json& j, const char* key, bool dflt = false) {
  return j.is_object() && j.contains(key) && j.at(key).is_boolean() ? j.at(key).get<bool>() : dflt;
}

std::string base64_decode(const std::string& s, const std::string& where) {
  using namespace boost::archive::iterators;
  if (s.empty() || s.size() % 4 != 0 || s.find_first_not_of(
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != std::string::npos)
    throw DataError(where + ": not a base64 token");
  const size_t pad = s.size() - std::min(s.find('='), s.size());
  std::string body = s.substr(0, s.size() - pad);
  using It = transform_width<binary_from_base64<std::string::const_iterator>, 8, 6>;
  std::string out(It(body.cbegin()), It(body.cend()));
  out.resize(s.size() / 4 * 3 - pad);
  return out;
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...} or null.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const json& v = cfg.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

}  // namespace

struct ByteLevelBpeTokenizer::Impl {
  std::string source, type;
  std::vector<TokenizerFile> files;
  std::optional<BytePairEncoder> bpe;
  bool nfc = false;
  AddedTokenMatcher raw_added, normalized_added;
  std::vector<std::string> added_content;  // id -> content ("" when not an added token)
  std::vector<PreTokenizerStage> pre;
  std::vector<int32_t> prefix, suffix;     // the post-processor's special tokens
  int32_t bos = -1, eos = -1;
  int64_t vocab = 0;

  void add_added(const AddedToken& t) {
    if (size_t(t.id) >= added_content.size()) added_content.resize(size_t(t.id) + 1);
    added_content[size_t(t.id)] = t.content;
    (t.normalized && nfc ? normalized_added : raw_added).add(t);
    vocab = std::max<int64_t>(vocab, int64_t(t.id) + 1);
  }

  int32_t token_id(const std::string& content) const {
    for (size_t i = 0; i < added_content.size(); ++i)
      if (!added_content[i].empty() && added_content[i] == content) return int32_t(i);
    return bpe->find(content);
  }

  void pre_tokenize(size_t stage, std::string_view text, std::vector<int32_t>& out) const {
    if (stage == pre.size()) {
      bpe->encode_word(text, out);
      return;
    }
    if (const auto* re = std::get_if<RegexSplitter>(&pre[stage])) {
      re->split(text, [&](std::string_view p) { pre_tokenize(stage + 1, p, out); });
      return;
    }
    const auto& bl = std::get<ByteLevelStage>(pre[stage]);
    std::string prefixed;
    if (bl.add_prefix_space && (text.empty() || text[0] != ' ')) {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    if (bl.gpt2)
      bl.gpt2->split(text, [&](std::string_view p) { pre_tokenize(stage + 1, p, out); });
    else
      pre_tokenize(stage + 1, text, out);
  }

  void encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
    if (normalized_added.empty())
      pre_tokenize(0, text, out);
    else
      normalized_added.split(
          text, [&](std::string_view g) { pre_tokenize(0, g, out); }, [&](int32_t id) { out.push_back(id); });
  }

  void encode_piece(std::string_view text, std::vector<int32_t>& out) const {
    if (!nfc || std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      encode_normalized(text, out);  // ASCII is its own NFC
      return;
    }
    utf8proc_uint8_t* buf = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), utf8proc_ssize_t(text.size()),
                                &buf, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) throw DataError(std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
    const std::unique_ptr<utf8proc_uint8_t, void (*)(void*)> hold(buf, std::free);
    encode_normalized(std::string_view(reinterpret_cast<const char*>(buf), size_t(n)), out);
  }

  std::vector<int32_t> encode_plain(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    raw_added.split(
        text, [&](std::string_view g) { encode_piece(g, out); }, [&](int32_t id) { out.push_back(id); });
    return out;
  }

  void parse_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string t = member(n, "type", source, "normalizer").get<std::string>();
    if (t == "NFC") {
      nfc = true;
    } else if (t == "Sequence") {
      for (const json& s : member(n, "normalizers", source, "normalizer Sequence")) parse_normalizer(s);
    } else {
      refuse(source, "the normalizer \"" + t + "\" (meshtrain reads none and NFC)");
    }
  }

  void parse_pre_tokenizer(const json& p) {
    if (p.is_null()) return;
    const std::string t = member(p, "type", source, "pre_tokenizer").get<std::string>();
    if (t == "Sequence") {
      for (const json& s : member(p, "pretokenizers", source, "pre_tokenizer Sequence")) parse_pre_tokenizer(s);
    } else if (t == "Split") {
      const json& pat = member(p, "pattern", source, "Split pre-tokenizer");
      std::string regex;
      if (pat.contains("Regex")) {
        regex = pat.at("Regex").get<std::string>();
      } else if (pat.contains("String")) {  // a literal string: escape it for the regex engine
        for (const char c : pat.at("String").get<std::string>()) {
          if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) regex += '\\';
          regex += c;
        }
      } else {
        throw DataError(source + ": Split pre-tokenizer pattern is neither Regex nor String");
      }
      const std::string behavior = p.value("behavior", std::string("Isolated"));
      RegexSplitter::Behavior b;
      if (behavior == "Isolated")
        b = RegexSplitter::Behavior::kIsolated;
      else if (behavior == "Removed")
        b = RegexSplitter::Behavior::kRemoved;
      else
        refuse(source, "the Split pre-tokenizer behavior \"" + behavior + "\"");
      pre.emplace_back(std::in_place_type<RegexSplitter>, regex, b, flag(p, "invert"), source);
    } else if (t == "ByteLevel") {
      ByteLevelStage s;
      s.add_prefix_space = flag(p, "add_prefix_space");
      if (flag(p, "use_regex", true)) s.gpt2.emplace(kGpt2Pattern, RegexSplitter::Behavior::kIsolated, false, source);
      pre.emplace_back(std::move(s));
    } else {
      refuse(source, "the pre-tokenizer \"" + t + "\" (meshtrain reads Split, ByteLevel and Sequence)");
    }
  }

  void parse_post_processor(const json& p) {
    if (p.is_null()) return;
    const std::string t = member(p, "type", source, "post_processor").get<std::string>();
    if (t == "ByteLevel") return;  // only trims offsets, which token ids do not carry
    if (t == "Sequence") {
      for (const json& s : member(p, "processors", source, "post_processor Sequence")) parse_post_processor(s);
      return;
    }
    if (t != "TemplateProcessing")
      refuse(source, "the post-processor \"" + t + "\" (meshtrain reads ByteLevel, TemplateProcessing and Sequence)");
    bool seen_sequence = false;
    for (const json& item : member(p, "single", source, "TemplateProcessing")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = member(member(item, "SpecialToken", source, "template item"), "id", source,
                                      "template SpecialToken").get<std::string>();
      const json& st = member(member(p, "special_tokens", source, "TemplateProcessing"), name.c_str(), source,
                              "TemplateProcessing special_tokens");
      for (const json& id : member(st, "ids", source, "template special token " + name))
        (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
    }
  }

  void check_decoder(const json& d) const {
    if (d.is_null()) return;
    const std::string t = member(d, "type", source, "decoder").get<std::string>();
    if (t == "Sequence") {
      for (const json& s : member(d, "decoders", source, "decoder Sequence")) check_decoder(s);
    } else if (t != "ByteLevel") {
      refuse(source, "the decoder \"" + t + "\" (meshtrain reads ByteLevel)");
    }
  }
};

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ByteLevelBpeTokenizer::~ByteLevelBpeTokenizer() = default;

std::unique_ptr<ByteLevelBpeTokenizer> ByteLevelBpeTokenizer::from_tokenizer_json(const std::string& text,
                                                                                  const std::string& config_text,
                                                                                  const std::string& source) {
  auto m = std::make_unique<Impl>();
  m->source = source;
  m->type = "tokenizer.json";
  m->files = {{"tokenizer.json", text}};
  json j, cfg;
  try {
    j = json::parse(text);
    if (!config_text.empty()) {
      cfg = json::parse(config_text);
      m->files.push_back({"tokenizer_config.json", config_text});
    }
  } catch (const json::exception& e) {
    throw DataError(source + ": not valid JSON (" + e.what() + ")");
  }
  try {
    const json& model = member(j, "model", source, "tokenizer.json");
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") refuse(source, "the model type \"" + type + "\" (meshtrain reads byte-level BPE)");
    if (flag(model, "byte_fallback")) refuse(source, "BPE byte_fallback (SentencePiece-style BPE; give the .model file)");
    if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() != 0.0)
      refuse(source, "BPE dropout");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && model.at(k).is_string() && !model.at(k).get<std::string>().empty())
        refuse(source, std::string("BPE ") + k);
    m->parse_normalizer(j.value("normalizer", json()));
    // Vocabulary and merges, spelled in the byte-level alphabet, become raw bytes.
    std::vector<BytePairEncoder::Entry> vocab;
    for (const auto& [spelling, id] : member(model, "vocab", source, "model").items()) {
      const auto bytes = byte_level_to_bytes(spelling);
      if (!bytes) refuse(source, "the vocabulary entry \"" + spelling + "\" outside the byte-level alphabet (a BPE without ByteLevel)");
      vocab.emplace_back(*bytes, id.get<int32_t>());
    }
    std::vector<BytePairEncoder::Merge> merges;
    for (const json& mg : member(model, "merges", source, "model")) {
      std::string l, r;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw DataError(source + ": merge \"" + s + "\" is not two symbols");
        l = s.substr(0, sp), r = s.substr(sp + 1);
      } else {
        l = mg.at(0).get<std::string>(), r = mg.at(1).get<std::string>();
      }
      const auto lb = byte_level_to_bytes(l), rb = byte_level_to_bytes(r);
      if (!lb || !rb) throw DataError(source + ": merge \"" + l + " " + r + "\" is outside the byte-level alphabet");
      merges.emplace_back(*lb, *rb);
    }
    m->bpe.emplace(BytePairEncoder::from_merges(vocab, merges, flag(model, "ignore_merges"), source));
    m->vocab = m->bpe->id_limit();
    for (const json& a : j.value("added_tokens", json::array())) {
      for (const char* k : {"single_word", "lstrip", "rstrip"})
        if (flag(a, k)) refuse(source, std::string("added token \"") + a.value("content", "") + "\" with " + k);
      m->add_added({a.at("content").get<std::string>(), a.at("id").get<int32_t>(), flag(a, "normalized")});
    }
    m->parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    m->parse_post_processor(j.value("post_processor", json()));
    m->check_decoder(j.value("decoder", json()));
  } catch (const json::exception& e) {
    throw DataError(source + ": unexpected tokenizer.json structure (" + e.what() + ")");
  }
  // bos / eos as TorchTitan's HuggingFaceTokenizer infers them: tokenizer_config.json first.
  auto id_of = [&](const std::optional<std::string>& s) { return s ? m->token_id(*s) : -1; };
  m->bos = id_of(config_token(cfg, "bos_token"));
  m->eos = id_of(config_token(cfg, "eos_token"));
  if (config_token(cfg, "eos_token") && m->eos < 0)
    throw DataError(source + ": tokenizer_config.json's eos_token \"" + *config_token(cfg, "eos_token") + "\" is not a token");
  if (cfg.is_null()) {
    if (!m->prefix.empty()) m->bos = m->prefix.front();
    if (m->bos < 0) m->bos = m->token_id("<|begin_of_text|>");
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>"})
      if (m->eos < 0) m->eos = m->token_id(name);
  }
  if (m->eos < 0)
    throw DataError(source + ": no end-of-document token (tokenizer_config.json's eos_token); meshtrain ends every "
                             "document with one");
  return std::unique_ptr<ByteLevelBpeTokenizer>(new ByteLevelBpeTokenizer(std::move(m)));
}

std::unique_ptr<ByteLevelBpeTokenizer> ByteLevelBpeTokenizer::from_tiktoken(const std::string& bytes,
                                                                            const std::string& source) {
  auto m = std::make_unique<Impl>();
  m->source = source;
  m->type = "tiktoken";
  m->files = {{"tokenizer.model", bytes}};
  std::vector<BytePairEncoder::Entry> ranks;
  size_t line_no = 0;
  for (size_t pos = 0; pos < bytes.size();) {
    size_t end = bytes.find('\n', pos);
    if (end == std::string::npos) end = bytes.size();
    const std::string line = bytes.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    const std::string where = source + ":" + std::to_string(line_no);
    if (sp == std::string::npos || line.find_first_not_of("0123456789", sp + 1) != std::string::npos || sp + 1 == line.size())
      throw DataError(where + ": expected \"<base64 token> <rank>\"");
    ranks.emplace_back(base64_decode(line.substr(0, sp), where), int32_t(std::stol(line.substr(sp + 1))));
  }
  if (ranks.empty()) throw DataError(source + ": no ranks in the tiktoken file");
  m->bpe.emplace(BytePairEncoder::from_ranks(ranks, source));
  m->vocab = m->bpe->id_limit();
  m->pre.emplace_back(std::in_place_type<RegexSplitter>, kLlama3Pattern, RegexSplitter::Behavior::kIsolated, false, source);
  const int32_t n = int32_t(m->vocab);
  std::vector<std::string> specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                       "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                                       "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                                       "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; specials.size() < 256; ++i) specials.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  for (size_t i = 0; i < specials.size(); ++i) m->add_added({specials[i], n + int32_t(i), false});
  m->bos = n, m->eos = n + 1;
  return std::unique_ptr<ByteLevelBpeTokenizer>(new ByteLevelBpeTokenizer(std::move(m)));
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode_plain(std::string_view text) const { return impl_->encode_plain(text); }

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids = impl_->prefix;
  const auto body = impl_->encode_plain(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id >= 0 && size_t(id) < impl_->added_content.size() && !impl_->added_content[size_t(id)].empty()) {
      out += impl_->added_content[size_t(id)];
    } else if (const std::string* b = impl_->bpe->token_bytes(id)) {
      out += *b;
    } else {
      throw DataError(impl_->source + ": cannot decode token id " + std::to_string(id) + " (not in the vocabulary)");
    }
  }
  return out;
}

int64_t ByteLevelBpeTokenizer::vocab_size() const { return impl_->vocab; }
int32_t ByteLevelBpeTokenizer::eos_id() const { return impl_->eos; }
int32_t ByteLevelBpeTokenizer::bos_id() const { return impl_->bos; }
bool ByteLevelBpeTokenizer::adds_bos() const {
  return impl_->bos >= 0 && std::find(impl_->prefix.begin(), impl_->prefix.end(), impl_->bos) == impl_->prefix.end();
}
std::string ByteLevelBpeTokenizer::type() const { return impl_->type; }
std::vector<TokenizerFile> ByteLevelBpeTokenizer::files() const { return impl_->files; }

}  // namespace meshtrain
