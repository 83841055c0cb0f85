#pragma once
/// @file Lexical rules of the deck's TOML subset (https://toml.io/en/v1.0.0): comments, strings,
/// integers, floats, booleans and flat arrays. Pure text functions, no registry knowledge, so the
/// deck parser and the option registry agree on one definition of each literal.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::toml {

/// `line` without a trailing `#` comment; a `#` inside a "..." or '...' string is kept.
/// Throws nothing.
std::string strip_comment(const std::string& line);

/// `s` without leading and trailing blanks (space, tab, CR). Throws nothing.
std::string trim(const std::string& s);

/// True when `text` starts like a string literal (`"` or `'`). Throws nothing.
bool looks_like_string(const std::string& text);

/// The contents of one TOML string literal spanning all of `text`: a basic string "..." with
/// the escapes \" \\ \b \t \n \f \r \uXXXX \UXXXXXXXX, or a literal string '...' taken verbatim.
/// @throws std::invalid_argument naming the problem: unterminated string, unknown escape,
///         text after the closing quote, or a newline inside the string.
std::string parse_string(const std::string& text);

/// `s` as a TOML basic string "..." with `"`, `\` and control characters escaped. With
/// `escape_hash`, `#` becomes \u0023 too (for readers that cut lines at every `#`, such as
/// Boost.Program_options' config-file parser). Throws nothing.
std::string quote(const std::string& s, bool escape_hash = false);

/// A TOML integer: optional sign, decimal digits with single `_` between digits, no leading
/// zeros; nullopt when `text` is not one or does not fit in int64. Throws nothing.
std::optional<int64_t> parse_int(const std::string& text);

/// A finite TOML float (or integer): sign, digits, optional fraction and exponent, `_` between
/// digits; nullopt for anything else, for inf / nan and for magnitudes beyond double. Throws nothing.
std::optional<double> parse_float(const std::string& text);

/// `true` or `false` (lower case, as TOML requires); nullopt otherwise. Throws nothing.
std::optional<bool> parse_bool(const std::string& text);

/// Shortest text that reads back to exactly `v` (std::to_chars, general format), always with a
/// `.` or an exponent so it stays a TOML float: "0.0008", "1e-08", "1.0". Throws nothing.
std::string format_float(double v);

/// The raw items of a one-line array `[a, b, "c, d"]` (blanks trimmed, strings still quoted, a
/// trailing comma allowed; `[]` gives no items). With `allow_nested`, an item may itself be an
/// array `[x, y]` (returned with its brackets, for TorchTitan's list[list[str]]).
/// @throws std::invalid_argument for a missing bracket, a nested array (unless allowed), an
///         unbalanced bracket, an empty item or an unterminated string.
std::vector<std::string> split_array(const std::string& text, bool allow_nested = false);

}  // namespace meshtrain::toml
