#include "config/option_registry.hpp"

#include <algorithm>
#include <utility>

#include "config/option_table.hpp"
#include "config/toml_value.hpp"
#include "config/torchtitan_keys.hpp"

namespace meshtrain {

const char* option_type_name(OptionType t) {
  switch (t) {
    case OptionType::kString: return "string";
    case OptionType::kInt: return "integer";
    case OptionType::kFloat: return "float";
    case OptionType::kBool: return "boolean";
  }
  return "?";
}

std::string Option::type_name() const {
  if (!array) return option_type_name(type);
  const std::string t = std::string("array of ") + (nested ? "array of " : "") + option_type_name(type);
  return scalar_too ? t + " or " + option_type_name(type) : t;
}

std::string Option::check(const OptionValue& v) const {
  if (array) {
    Option inner = *this;  // a nested option's items are flat arrays, a flat one's are scalars
    (nested ? inner.nested : inner.array) = false;
    for (const OptionValue& item : v.items)
      if (std::string r = inner.check(item); !r.empty()) return r;
    return "";
  }
  if (type == OptionType::kString) {
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v.text) == choices.end())
      return "must be one of " + allowed;
  } else if (type == OptionType::kInt || type == OptionType::kFloat) {
    const bool exempt = type == OptionType::kInt &&
                        std::find(also_allowed.begin(), also_allowed.end(), v.i) != also_allowed.end();
    const double x = type == OptionType::kInt ? double(v.i) : v.f;
    if (!exempt && ((min && (x < *min || (min_exclusive && x == *min))) || (max && (x > *max || (max_exclusive && x == *max)))))
      return "must be " + allowed;
  }
  return rule ? rule(v) : "";
}

namespace {

OptionValue parse_scalar(const Option& o, const std::string& raw, ValueSyntax syntax) {
  OptionValue v;
  v.text = raw;
  const std::string got = ", got " + (raw.empty() ? std::string("nothing") : raw);
  switch (o.type) {
    case OptionType::kString:
      if (toml::looks_like_string(raw)) {
        try {
          v.text = toml::parse_string(raw);
        } catch (const std::invalid_argument& e) {
          throw OptionValueError(e.what());
        }
      } else if (syntax == ValueSyntax::kDeck) {
        throw OptionValueError("expected a quoted string" + got + " (TOML strings are \"...\")");
      }
      break;
    case OptionType::kInt: {
      const auto i = toml::parse_int(raw);
      if (!i) throw OptionValueError("expected integer" + got);
      v.i = *i;
      break;
    }
    case OptionType::kFloat: {
      const auto f = toml::parse_float(raw);
      if (!f) throw OptionValueError("expected float" + got + " (a finite number such as 3e-4 or 0.1)");
      v.f = *f;
      break;
    }
    case OptionType::kBool: {
      const auto b = toml::parse_bool(raw);
      if (!b) throw OptionValueError("expected boolean true or false" + got);
      v.b = *b;
      break;
    }
  }
  return v;
}

// The command line also takes an array as bare comma-separated items: --s.k=a,b.
std::vector<std::string> split_bare_list(const std::string& raw) {
  return toml::split_array("[" + raw + "]");
}

}  // namespace

OptionValue parse_option_value(const Option& o, const std::string& raw_in, ValueSyntax syntax) {
  const std::string raw = toml::trim(raw_in);
  OptionValue v;
  if (o.array) {
    std::vector<std::string> items;
    const bool bracketed = !raw.empty() && raw.front() == '[';
    try {
      if (bracketed) items = toml::split_array(raw, o.nested);
      else if (o.scalar_too && toml::looks_like_string(raw)) items = {raw};  // `fqns = "experts"`
      else if (syntax == ValueSyntax::kCommandLine && !o.nested) items = split_bare_list(raw);
      else throw OptionValueError("expected " + o.type_name() + ", got " + (raw.empty() ? "nothing" : raw) + " (arrays are [a, b])");
    } catch (const OptionValueError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw OptionValueError(e.what());
    }
    Option inner = o;
    inner.nested = false;
    for (const std::string& item : items)
      v.items.push_back(o.nested ? parse_option_value(inner, item, ValueSyntax::kDeck) : parse_scalar(o, item, syntax));
    v.text = raw;
  } else {
    if (!raw.empty() && raw.front() == '[')
      throw OptionValueError("expected " + o.type_name() + ", got " + raw + " (arrays are not allowed here)");
    v = parse_scalar(o, raw, syntax);
  }
  if (const std::string rule = o.check(v); !rule.empty()) {
    const bool choice = o.type == OptionType::kString;
    throw OptionValueError("value " + (choice && !o.array && !toml::looks_like_string(raw) ? toml::quote(v.text) : raw) +
                           (choice ? " is not allowed (" : " is out of range (") + rule + ")");
  }
  return v;
}

std::string option_value_toml(const Option& o, const OptionValue& v) {
  if (o.array) {
    Option inner = o;
    (o.nested ? inner.nested : inner.array) = false;
    std::string out = "[";
    for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + option_value_toml(inner, v.items[i]);
    return out + "]";
  }
  switch (o.type) {
    case OptionType::kString: return toml::quote(v.text);
    case OptionType::kInt: return std::to_string(v.i);
    case OptionType::kFloat: return toml::format_float(v.f);
    case OptionType::kBool: return v.b ? "true" : "false";
  }
  return v.text;
}

std::pair<std::string, std::string> split_dotted(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  if (dot == std::string::npos) return {"", dotted};
  return {dotted.substr(0, dot), dotted.substr(dot + 1)};
}

std::string key_label(const std::string& dotted) {
  const auto [section, key] = split_dotted(dotted);
  return section.empty() ? key + ": " : "[" + section + "] " + key + ": ";
}

const std::vector<Option>& option_registry() {
  static const std::vector<Option> r = [] {
    std::vector<Option> o = build_option_table();
    add_torchtitan_keys(o);
    return o;
  }();
  return r;
}

const Option* find_option(const std::string& dotted) {
  for (const Option& o : option_registry())
    if (o.dotted() == dotted) return &o;
  return nullptr;
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool is_abbreviation(const std::string& typed, const std::string& name) {
  if (typed.empty() || name.empty() || typed[0] != name[0]) return false;
  size_t j = 0;
  for (char c : name)
    if (j < typed.size() && typed[j] == c) ++j;
  return j == typed.size();
}

// Abbreviations first ("dp_shard" -> "data_parallel_shard_degree", "ckpt" -> "checkpoint"),
// then edit distance.
std::pair<int, size_t> suggestion_cost(const std::string& typed, const std::string& name) {
  return {is_abbreviation(typed, name) ? 0 : 1, edit_distance(typed, name)};
}

}  // namespace

std::string nearest_option(const std::string& dotted) {
  const auto [section, key] = split_dotted(dotted);
  // A known key in the wrong section is the likeliest slip (e.g. lr under [training]).
  for (const Option& o : option_registry())
    if (o.key == key) return o.dotted();
  // A misspelt key usually keeps its section.
  const auto sections = option_sections();
  const bool known_section = std::find(sections.begin(), sections.end(), section) != sections.end();
  std::string best;
  std::pair<int, size_t> best_cost{2, 0};
  for (const Option& o : option_registry()) {
    if (known_section && o.section != section) continue;
    const auto cost = known_section ? suggestion_cost(key, o.key) : suggestion_cost(dotted, o.dotted());
    if (best.empty() || cost < best_cost) best_cost = cost, best = o.dotted();
  }
  return best;
}

std::vector<std::string> option_sections() {
  std::vector<std::string> s;
  for (const Option& o : option_registry())
    if (s.empty() || s.back() != o.section) s.push_back(o.section);
  return s;
}

std::string nearest_section(const std::string& section) {
  std::string best;
  std::pair<int, size_t> best_cost{2, 0};
  for (const std::string& s : option_sections())
    if (const auto cost = suggestion_cost(section, s); best.empty() || cost < best_cost) best_cost = cost, best = s;
  return best;
}

}  // namespace meshtrain
