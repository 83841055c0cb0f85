#include "config/deck_parser.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "config/option_registry.hpp"
#include "config/toml_value.hpp"
#include "config/torchtitan_keys.hpp"
#include "util/errors.hpp"

namespace po = boost::program_options;

namespace meshtrain {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& dotted, const std::string& what) {
  throw ConfigError(where + ": " + key_label(dotted) + what);
}

bool is_bare_key(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

// A TOML dotted key `a.b.c` (blanks around the dots allowed) as "a.b.c"; "" when a part is not a
// bare key.
std::string dotted_name(const std::string& text) {
  std::string out, part;
  std::istringstream in(text);
  while (std::getline(in, part, '.')) {
    part = toml::trim(part);
    if (!is_bare_key(part)) return "";
    out += (out.empty() ? "" : ".") + part;
  }
  return text.empty() || text.back() == '.' ? "" : out;
}

// A table header names a registered section or a table that holds some ([quantize] holds
// [quantize.linear.float8]); keys under the latter are dotted (`linear.float8.emulate = true`).
bool is_table(const std::string& name) {
  for (const std::string& s : option_sections())
    if (s == name || s.rfind(name + ".", 0) == 0) return true;
  return false;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The value as Boost.Program_options' config-file parser must see it: that parser cuts every
// line at the first '#', even inside a string, so strings are re-quoted with '#' escaped.
std::string po_safe(const Option& o, const OptionValue& v) {
  if (!o.array) return o.type == OptionType::kString ? toml::quote(v.text, true) : v.text;
  Option inner = o;  // the items of a nested array are flat arrays
  (o.nested ? inner.nested : inner.array) = false;
  std::string out = "[";
  for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + po_safe(inner, v.items[i]);
  return out + "]";
}

struct Scanned {
  std::map<std::string, int> lines;  // "section.key" -> deck line
  std::string normalized;            // "section.key=value" lines, for program_options
};

// The structural pass over the deck, in file order: table headers (dotted ones such as
// [quantize.linear.float8] too), key lines (dotted keys too), duplicates, and each value's type
// and range (so the first fault in the file is the one reported). It also records each key's
// line number, which program_options does not report.
Scanned scan_deck(const std::string& path, const std::string& text) {
  Scanned out;
  std::set<std::string> seen_sections;
  std::string section, line;
  std::istringstream in(text);
  for (int n = 1; std::getline(in, line); ++n) {
    if (n == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 byte-order mark
    const std::string where = path + ":" + std::to_string(n);
    const std::string s = toml::trim(toml::strip_comment(line));
    if (s.empty()) continue;
    if (s.front() == '[') {
      const std::string name = dotted_name(s.substr(1, s.size() >= 2 ? s.size() - 2 : 0));
      if (s.back() != ']' || name.empty())
        throw ConfigError(where + ": malformed section header '" + s + "' (expected [section] or [section.table])");
      if (!is_table(name)) {
        const auto known = option_sections();
        throw ConfigError(where + ": unknown section [" + name + "]; did you mean [" + nearest_section(name) +
                          "]? (sections: " + join(known) + ")");
      }
      if (!seen_sections.insert(name).second)
        throw ConfigError(where + ": section [" + name + "] appears twice (TOML defines a table once)");
      section = name;
      continue;
    }
    const size_t eq = s.find('=');
    if (eq == std::string::npos)
      throw ConfigError(where + ": malformed line '" + s + "' (expected key = value)");
    const std::string key = dotted_name(toml::trim(s.substr(0, eq))), value = toml::trim(s.substr(eq + 1));
    if (key.empty())
      throw ConfigError(where + ": malformed line '" + s + "' (a key is letters, digits, _ and -, or such names joined by dots)");
    const std::string dotted = section.empty() ? key : section + "." + key;
    if (split_dotted(dotted).first.empty()) {  // name the section only when the key exists in one
      const std::string guess = nearest_option(key), gkey = split_dotted(guess).second;
      throw ConfigError(where + ": key '" + key + "' outside any [section]" +
                        (gkey == key ? "; did you mean [" + split_dotted(guess).first + "] " + key + "?"
                                     : " (a deck starts with a [section] header)"));
    }
    const Option* o = find_option(dotted);
    if (!o) {
      const std::string guess = nearest_option(dotted);
      const auto [gsec, gkey] = split_dotted(guess);
      fail(where, dotted,
           "unknown key; did you mean '" + gkey + "'" + (gsec == split_dotted(dotted).first ? "" : " in [" + gsec + "]") +
               "?");
    }
    if (const auto [it, fresh] = out.lines.emplace(dotted, n); !fresh)
      fail(where, dotted, "duplicate key (first set on line " + std::to_string(it->second) + ")");
    if (value.empty()) fail(where, dotted, "missing value (expected key = value)");
    try {
      out.normalized += dotted + "=" + po_safe(*o, parse_option_value(*o, value, ValueSyntax::kDeck)) + "\n";
    } catch (const OptionValueError& e) {
      fail(where, dotted, e.what());
    }
  }
  return out;
}

// Every registered key as a string-valued program_options option named "section.key"; the
// registry converts the text afterwards, so the type rules live in one place.
po::options_description registry_description() {
  po::options_description desc;
  for (const Option& o : option_registry()) desc.add_options()(o.dotted().c_str(), po::value<std::string>(), o.doc.c_str());
  return desc;
}

// Turns the overrides into program_options tokens, one "--section.key=value" per key (the last
// of repeated keys wins), after checking names, the presence of a value and the value itself so
// that the first bad override is the one reported. program_options refuses "--key=" with
// nothing after '=', so an empty value travels as the separate tokens "--key" "".
std::vector<std::string> normalize_overrides(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> kv;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      throw ConfigError("command line: unexpected argument '" + a + "' (overrides are --section.key=value)");
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Option* o = find_option(name);
    if (!o) {
      const std::string what = "unknown key; did you mean '--" + nearest_option(name) + "'?";
      if (name.find('.') == std::string::npos) throw ConfigError("command line: --" + name + ": " + what);
      fail("command line", name, what);
    }
    std::string value;
    if (eq != std::string::npos) value = a.substr(eq + 1);
    else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) value = args[++i];
    else if (o->type == OptionType::kBool && !o->array) value = "true";  // a bare boolean flag
    else fail("command line", name, "missing value (--" + name + "=value)");
    try {
      parse_option_value(*o, value, ValueSyntax::kCommandLine);
    } catch (const OptionValueError& e) {
      fail("command line", name, e.what());
    }
    if (const auto it = index.find(name); it != index.end()) {
      kv[it->second].second = value;
    } else {
      index.emplace(name, kv.size());
      kv.emplace_back(name, value);
    }
  }
  std::vector<std::string> tokens;
  for (const auto& [name, value] : kv) {
    if (value.empty()) {
      tokens.push_back("--" + name);
      tokens.push_back("");
    } else {
      tokens.push_back("--" + name + "=" + value);
    }
  }
  return tokens;
}

std::string read_deck(const std::string& path) {
  if (path.empty()) throw ConfigError("no deck given (--deck FILE)");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(path + ": cannot read deck (Is a directory)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read deck (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": cannot read deck (read error)");
  return text.str();
}

}  // namespace

JobConfig load_job_config(const std::string& deck_path, const std::vector<std::string>& overrides) {
  return load_job_config_text(read_deck(deck_path), deck_path, overrides);
}

JobConfig load_job_config_text(const std::string& text, const std::string& deck_path,
                               const std::vector<std::string>& overrides) {
  const Scanned scanned = scan_deck(deck_path, text);
  const po::options_description desc = registry_description();

  po::variables_map deck_vm, cli_vm;
  try {
    std::istringstream normalized(scanned.normalized);
    po::store(po::parse_config_file(normalized, desc, /*allow_unregistered=*/false), deck_vm);
  } catch (const po::error& e) {  // unreachable after the scan; kept so nothing escapes untyped
    throw ConfigError(deck_path + ": " + e.what());
  }
  try {
    const auto style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                       po::command_line_style::long_allow_next;
    po::store(po::command_line_parser(normalize_overrides(overrides)).options(desc).style(style).run(), cli_vm);
  } catch (const po::error& e) {
    throw ConfigError("command line: " + std::string(e.what()));
  }

  JobConfig cfg;
  cfg.deck_path = deck_path;
  std::vector<std::pair<int, std::string>> set_keys;  // {deck line, or after every line for the command line, key}
  for (const Option& o : option_registry()) {
    const std::string name = o.dotted();
    const bool from_cli = cli_vm.count(name) > 0;
    if (!from_cli && !deck_vm.count(name)) continue;
    const std::string where = from_cli ? "command line" : deck_path + ":" + std::to_string(scanned.lines.at(name));
    const std::string& text = (from_cli ? cli_vm : deck_vm)[name].as<std::string>();
    try {
      o.set(cfg, parse_option_value(o, text, from_cli ? ValueSyntax::kCommandLine : ValueSyntax::kDeck));
    } catch (const OptionValueError& e) {
      fail(where, name, e.what());
    }
    cfg.origins.emplace_back(name, where);
    set_keys.emplace_back(from_cli ? std::numeric_limits<int>::max() : scanned.lines.at(name), name);
  }
  std::stable_sort(set_keys.begin(), set_keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> order;
  for (const auto& [line, name] : set_keys) order.push_back(name);
  apply_torchtitan_keys(cfg, order);
  return cfg;
}

std::string resolved_deck_toml(const JobConfig& cfg) {
  std::ostringstream out;
  out << "# Resolved deck: every key with the value used, written by meshtrain from "
      << (cfg.deck_path.empty() ? std::string("the defaults") : cfg.deck_path)
      << " and the command-line overrides.\n# Re-run with: meshtrain train --deck <this file>\n";
  std::string section;
  for (const Option& o : option_registry()) {
    const std::string v = o.get(cfg);
    if (o.torchtitan_only && v.empty()) continue;  // only the TorchTitan keys the run set
    if (o.section != section) {
      section = o.section;
      out << "\n[" << section << "]\n";
    }
    if (v.empty()) out << "# " << o.key << " = " << o.default_text << "\n";  // unset optional
    else out << o.key << " = " << v << "\n";
  }
  return out.str();
}

}  // namespace meshtrain
