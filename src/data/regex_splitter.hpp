#pragma once
/// @file RegexSplitter: the Split pre-tokenizer of Hugging Face tokenizers (and tiktoken's
/// pattern), run by PCRE2 with its JIT compiler.
///
/// tokenizer.json patterns are written for Oniguruma, the engine Hugging Face's Rust tokenizers
/// compile them with. PCRE2 reads the same syntax for what these patterns use (Unicode
/// properties \p{L} \p{N}, inline case-insensitive groups, lookahead (?!\S), counted repeats)
/// with one difference in meaning that matters: Oniguruma's \s is Unicode's White_Space
/// property (it includes U+0085 and excludes U+180E), PCRE2's is not quite. The pattern is
/// therefore rewritten with \s and \S spelled out as White_Space before compiling. Constructs
/// whose meanings differ further (\w, \b, \G, \X, POSIX brackets) are refused with "not
/// implemented yet" rather than matched differently.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace meshtrain {

class RegexSplitter {
 public:
  /// How matches and the text between them become pieces (Hugging Face's SplitDelimiterBehavior).
  enum class Behavior { kIsolated, kRemoved };

  /// Compiles `pattern` (Oniguruma syntax; with `invert` the pieces are the matches' complement).
  /// @throws DataError prefixed by `source` when the pattern does not compile or uses a construct
  ///         named above.
  RegexSplitter(const std::string& pattern, Behavior behavior, bool invert, const std::string& source);
  RegexSplitter(RegexSplitter&&) noexcept;
  ~RegexSplitter();

  /// Calls `piece` with each non-empty piece of `text` (valid UTF-8, checked by the caller), in order.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

  /// The pattern as compiled (after the \s rewrite); for tests and messages.
  const std::string& compiled_pattern() const { return compiled_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string compiled_;
};

/// `pattern` with Oniguruma's \s / \S written out as explicit White_Space classes.
/// @throws DataError prefixed by `source` for the constructs RegexSplitter refuses.
std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& source);

}  // namespace meshtrain
