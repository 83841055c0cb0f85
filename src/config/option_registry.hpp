#pragma once
/// @file The option registry: every deck key once, with its type, default, allowed values and a
/// one-line meaning, bound to its JobConfig field. It drives deck and command-line parsing, type
/// and range checks, `meshtrain deck reference`, doc/deck-reference.md and deck.resolved.toml
/// (DESIGN.md data flow step 1). The entries themselves are in option_table.cpp.
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/job_config.hpp"

namespace meshtrain {

/// Scalar type of an option (an option may also be a flat array of one of these).
enum class OptionType { kString, kInt, kFloat, kBool };
/// "string", "integer", "float" or "boolean". Throws nothing.
const char* option_type_name(OptionType t);

/// How a value is written: in a deck strings must be TOML literals ("..." or '...'); on the
/// command line bare text is a string too (`--job.description=smoke test`).
enum class ValueSyntax { kDeck, kCommandLine };

/// A parsed value of one key. Scalars fill `text` and the field of their type; arrays fill
/// `items` (one scalar each) and `text`.
struct OptionValue {
  std::string text;  ///< the value as written, with string quotes removed and escapes decoded
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::vector<OptionValue> items;  ///< array options only
};

/// What meshtrain does with the value of a key TorchTitan also has (doc/torchtitan-compat.md).
enum class Outcome {
  kHonoured,  ///< meshtrain does what the key asks
  kNotice,    ///< accepted; one notice line says why it has no effect here
  kRefused,   ///< `meshtrain train` and `deck check` stop with this one-line reason
};

/// The outcome of one value of one key, with its reason (empty when honoured).
struct Verdict {
  Outcome outcome = Outcome::kHonoured;
  std::string why;  ///< "meshtrain's kernels are always fused (no torch.compile)", ...
};

/// A bad value: what() is "what is wrong (rule)", without the key's location (the caller
/// prefixes `FILE:LINE: [section] key: `).
class OptionValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// One deck key.
struct Option {
  std::string section, key;
  OptionType type = OptionType::kString;
  bool array = false;                ///< a flat array [a, b] of `type`
  std::string default_text;          ///< as shown in the reference; "(flavor)" / "(unset)" for optionals
  std::string allowed;               ///< human-readable rule, e.g. "> 0", "linear | sqrt | cosine"
  std::string doc;                   ///< one-line meaning
  std::vector<std::string> choices;  ///< strings: the allowed values (empty = any)
  std::optional<double> min, max;    ///< numeric bounds
  bool min_exclusive = false, max_exclusive = false;
  std::vector<int64_t> also_allowed;  ///< integers allowed outside [min, max] (e.g. -1 = fill)
  /// Extra rule on a scalar: returns "" when the value is fine, else the rule broken.
  std::function<std::string(const OptionValue&)> rule;
  /// Stores a parsed value into its JobConfig field. Throws nothing.
  std::function<void(JobConfig&, const OptionValue&)> set;
  /// The field's current value as TOML text; "" when an optional field is unset. Throws nothing.
  std::function<std::string(const JobConfig&)> get;

  /// Array of arrays (TorchTitan's list[list[str]]): each item is itself a flat array of `type`.
  bool nested = false;
  /// An array that also takes one bare string in a deck (TorchTitan's `list[str] | str`).
  bool scalar_too = false;

  /// TorchTitan v0.2.2's default of this key as TOML ("None" for its unset optionals); "" when
  /// TorchTitan has no such key (a meshtrain-only key).
  std::string torchtitan_default;
  /// A TorchTitan key with no meshtrain field: its value is kept in JobConfig::torchtitan (for
  /// its verdict and deck.resolved.toml) and nothing else reads it.
  bool torchtitan_only = false;
  /// The compat table's outcome column: what meshtrain does with each value of the key.
  std::string torchtitan_outcome;
  /// The outcome of one value (nullptr: always honoured). load_job_config() applies it to the
  /// value each key ends up with; notices land in JobConfig::notices, refusals in
  /// JobConfig::refusals (thrown by validate()).
  std::function<Verdict(const OptionValue&)> verdict;

  /// "section.key"; a section may itself be dotted ("quantize.linear.float8"). Throws nothing.
  std::string dotted() const { return section + "." + key; }
  /// "integer", "array of integer", "array of array of string" or "array of string or string".
  /// Throws nothing.
  std::string type_name() const;
  /// "" when `v` (each item, for arrays) satisfies the range, choices and rule; else the rule
  /// broken, e.g. "must be > 0". Throws nothing.
  std::string check(const OptionValue& v) const;
};

/// `v` (a value of `o`) as TOML text that parse_option_value(o, ..., kDeck) reads back: strings
/// quoted, arrays bracketed. Throws nothing.
std::string option_value_toml(const Option& o, const OptionValue& v);

/// Parses `raw` (blanks around it ignored) as a value of option `o` and checks its range.
/// @throws OptionValueError "expected integer, got abc", "value 0 is out of range (must be > 0)",
///         "unterminated string ...", "malformed array ..." and the like.
OptionValue parse_option_value(const Option& o, const std::string& raw, ValueSyntax syntax);

/// All options, grouped by section in reference order. Throws nothing.
const std::vector<Option>& option_registry();
/// The option named "section.key", or nullptr. Throws nothing.
const Option* find_option(const std::string& dotted);
/// Splits "section.key" at its last dot (sections may contain dots, keys do not) into
/// {"section", "key"}; {"", dotted} when there is no dot. Throws nothing.
std::pair<std::string, std::string> split_dotted(const std::string& dotted);
/// "[section] key: " for "section.key" (the prefix of every message about a key). Throws nothing.
std::string key_label(const std::string& dotted);
/// The registered "section.key" a user most likely meant by the unknown `dotted`: the same key
/// in another section if there is one, else the nearest key of the same section by edit
/// distance, else the nearest "section.key" overall. Throws nothing.
std::string nearest_option(const std::string& dotted);
/// Section names in reference order. Throws nothing.
std::vector<std::string> option_sections();
/// The registered section nearest to `section` by edit distance. Throws nothing.
std::string nearest_section(const std::string& section);

}  // namespace meshtrain
