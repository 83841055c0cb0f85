#pragma once
/// @file The option registry: every deck key once, with its type, default, allowed values and a
/// one-line meaning. It drives deck and command-line parsing, type and range checks,
/// `meshtrain deck reference` and doc/deck-reference.md (DESIGN.md data flow step 1).
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace meshtrain {

enum class OptionType { kString, kInt, kFloat, kBool };
const char* option_type_name(OptionType t);

/// A parsed scalar value of one key.
struct OptionValue {
  std::string text;   ///< as written (quotes removed for strings)
  int64_t i = 0;
  double f = 0;
  bool b = false;
};

struct Option {
  std::string section, key;
  OptionType type;
  std::string default_text;          ///< as shown in the reference ("(flavor)" for overrides)
  std::string allowed;               ///< human-readable rule, e.g. "> 0", "linear | sqrt | cosine"
  std::string doc;                   ///< one-line meaning
  std::vector<std::string> choices;  ///< for strings: the allowed values (empty = any)
  std::optional<double> min, max;    ///< inclusive numeric bounds
  bool min_exclusive = false;
  std::vector<int64_t> also_allowed;  ///< integers allowed outside [min, max] (e.g. -1 = fill)
  std::function<void(JobConfig&, const OptionValue&)> set;
  std::function<std::string(const JobConfig&)> get;  ///< current value as TOML text; "" = unset

  std::string dotted() const { return section + "." + key; }
  /// Empty when v satisfies the type's range / choices, else the rule broken.
  std::string check(const OptionValue& v) const;
};

/// All options, grouped by section in reference order.
const std::vector<Option>& option_registry();
/// The option named "section.key", or nullptr.
const Option* find_option(const std::string& dotted);
/// The registered "section.key" closest to `dotted` by edit distance (for "did you mean").
std::string nearest_option(const std::string& dotted);
/// Section names in reference order.
std::vector<std::string> option_sections();

}  // namespace meshtrain
