#include "data/regex_splitter.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

// Unicode's White_Space property (PropList.txt), Oniguruma's \s in a Unicode encoding.
constexpr const char* kWhiteSpaceMembers =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

std::string oniguruma_to_pcre2(const std::string& p, const std::string& source) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's' || e == 'S') {
        if (in_class && e == 'S')
          throw DataError(source + ": \\S inside a character class is not implemented yet");
        if (in_class)
          out += kWhiteSpaceMembers;
        else
          out += std::string(e == 's' ? "[" : "[^") + kWhiteSpaceMembers + "]";
        ++i;
        continue;
      }
      if (std::string_view("wWbBGXhHRK").find(e) != std::string_view::npos)
        throw DataError(source + ": the regex escape \\" + std::string(1, e) +
                        " is not implemented yet (its Oniguruma meaning differs from PCRE2's)");
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (in_class && c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':')
        throw DataError(source + ": POSIX bracket expressions in the regex are not implemented yet");
      throw DataError(source + ": nested character classes in the regex are not implemented yet");
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is a member
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  bool jit = false;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  ~Impl() {
    if (match) pcre2_match_data_free(match);
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, Behavior behavior, bool invert, const std::string& source)
    : impl_(std::make_unique<Impl>()), compiled_(oniguruma_to_pcre2(pattern, source)) {
  int err = 0;
  PCRE2_SIZE at = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_.data()), compiled_.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw DataError(source + ": the pre-tokenizer regex does not compile at offset " + std::to_string(at) + ": " +
                    reinterpret_cast<const char*>(msg));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
  impl_->match = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  impl_->context = pcre2_match_context_create(nullptr);
  if (impl_->jit) {  // lookaheads over long whitespace runs need more than the 32 KiB default stack
    impl_->stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(impl_->context, nullptr, impl_->stack);
  }
  impl_->behavior = behavior;
  impl_->invert = invert;
}

RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
  const Impl& m = *impl_;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const bool keep_matches = m.behavior == Behavior::kIsolated || m.invert;
  const bool keep_gaps = m.behavior == Behavior::kIsolated || !m.invert;
  size_t pos = 0, gap = 0;
  while (pos <= text.size()) {
    const int rc = m.jit ? pcre2_jit_match(m.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, m.match, m.context)
                         : pcre2_match(m.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, m.match, m.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw DataError(std::string("pre-tokenizer regex failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.match);
    const size_t b = ov[0], e = ov[1];
    if (e == b) {  // an empty match splits nothing; step over one character
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (b > gap && keep_gaps) piece(text.substr(gap, b - gap));
    if (keep_matches) piece(text.substr(b, e - b));
    gap = pos = e;
  }
  if (gap < text.size() && keep_gaps) piece(text.substr(gap));
}

}  // namespace meshtrain
