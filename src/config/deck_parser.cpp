#include "config/deck_parser.hpp"

#include <boost/program_options.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "config/option_registry.hpp"
#include "util/errors.hpp"

namespace po = boost::program_options;

namespace meshtrain {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Removes a trailing # comment that is not inside a quoted string.
std::string strip_comment(const std::string& s) {
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '"') in_str = !in_str;
    if (s[i] == '#' && !in_str) return s.substr(0, i);
  }
  return s;
}

[[noreturn]] void fail(const std::string& where, const std::string& dotted, const std::string& what) {
  const size_t dot = dotted.find('.');
  std::string head = where + ": ";
  if (dot != std::string::npos) head += "[" + dotted.substr(0, dot) + "] " + dotted.substr(dot + 1) + ": ";
  throw ConfigError(head + what);
}

// Converts raw text to a typed value for option `o`; `quoted_strings` demands TOML quoting
// (deck), the command line accepts bare strings.
OptionValue convert(const Option& o, const std::string& raw_in, bool quoted_strings, const std::string& where) {
  const std::string raw = trim(raw_in);
  OptionValue v;
  auto got = [&] { return ", got " + (raw.empty() ? std::string("nothing") : raw); };
  if (!raw.empty() && raw.front() == '[')
    fail(where, o.dotted(), std::string("expected ") + option_type_name(o.type) + got() + " (arrays are not allowed here)");
  switch (o.type) {
    case OptionType::kString:
      if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') v.text = raw.substr(1, raw.size() - 2);
      else if (quoted_strings) fail(where, o.dotted(), "expected a quoted string" + got() + " (TOML strings are \"...\")");
      else v.text = raw;
      break;
    case OptionType::kInt: {
      auto [p, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), v.i);
      if (ec != std::errc() || p != raw.data() + raw.size() || raw.empty())
        fail(where, o.dotted(), "expected integer" + got());
      v.text = raw;
      break;
    }
    case OptionType::kFloat: {
      errno = 0;
      char* end = nullptr;
      v.f = std::strtod(raw.c_str(), &end);
      if (raw.empty() || end != raw.c_str() + raw.size() || errno == ERANGE || raw.front() == '"')
        fail(where, o.dotted(), "expected float" + got());
      v.text = raw;
      break;
    }
    case OptionType::kBool:
      if (raw != "true" && raw != "false") fail(where, o.dotted(), "expected boolean true or false" + got());
      v.b = raw == "true";
      v.text = raw;
      break;
  }
  const std::string rule = o.check(v);
  if (!rule.empty()) fail(where, o.dotted(), "value " + raw + " is out of range (" + rule + ")");
  return v;
}

// The structural pass over the deck: sections, key lines, duplicates, flat arrays. Returns
// "section.key" -> line number. Boost.Program_options then extracts the values.
std::map<std::string, int> scan_deck(const std::string& path, std::istream& in) {
  std::map<std::string, int> lines;
  std::set<std::string> sections;
  std::string section, line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    const std::string s = trim(strip_comment(line));
    if (s.empty()) continue;
    if (s.front() == '[') {
      if (s.back() != ']' || s.size() < 3) throw ConfigError(where + ": malformed section header '" + s + "' (expected [section])");
      section = trim(s.substr(1, s.size() - 2));
      const auto known = option_sections();
      if (std::find(known.begin(), known.end(), section) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        throw ConfigError(where + ": unknown section [" + section + "] (sections: " + list + ")");
      }
      if (!sections.insert(section).second) throw ConfigError(where + ": section [" + section + "] appears twice");
      continue;
    }
    const size_t eq = s.find('=');
    if (eq == std::string::npos || trim(s.substr(0, eq)).empty())
      throw ConfigError(where + ": malformed line '" + s + "' (expected key = value)");
    const std::string key = trim(s.substr(0, eq)), value = trim(s.substr(eq + 1));
    if (section.empty()) throw ConfigError(where + ": key '" + key + "' outside any [section]");
    const std::string dotted = section + "." + key;
    if (value.empty()) fail(where, dotted, "missing value (expected key = value)");
    if (value.front() == '[' && (value.back() != ']' || value.find('[', 1) != std::string::npos))
      fail(where, dotted, "malformed array " + value + " (only flat arrays [a, b] on one line)");
    if (value.front() == '"' && (value.size() < 2 || value.back() != '"'))
      fail(where, dotted, "unterminated string " + value);
    if (!find_option(dotted)) fail(where, dotted, "unknown key; did you mean '" + nearest_option(dotted) + "'?");
    if (!lines.emplace(dotted, n).second)
      fail(where, dotted, "duplicate key (first set on line " + std::to_string(lines[dotted]) + ")");
  }
  return lines;
}

po::options_description registry_description() {
  po::options_description desc;
  for (const Option& o : option_registry()) desc.add_options()(o.dotted().c_str(), po::value<std::string>(), o.doc.c_str());
  return desc;
}

}  // namespace

std::string JobConfig::origin_of(const std::string& dotted_key) const {
  for (const auto& [k, where] : origins)
    if (k == dotted_key) return where;
  return deck_path.empty() ? std::string("deck") : deck_path;
}

JobConfig load_job_config(const std::string& deck_path, const std::vector<std::string>& overrides) {
  std::ifstream in(deck_path);
  if (!in) throw ConfigError(deck_path + ": cannot read deck (" + std::strerror(errno) + ")");
  const auto lines = scan_deck(deck_path, in);
  in.clear();
  in.seekg(0);
  const po::options_description desc = registry_description();

  // Command line first: program_options keeps the first value stored, so the CLI wins.
  po::variables_map cli_vm, deck_vm;
  std::vector<std::string> args;
  for (const std::string& a : overrides) {
    if (a.rfind("--", 0) != 0) {
      if (!args.empty() && args.back().find('=') == std::string::npos) {
        args.push_back(a);  // value of "--section.key value"
        continue;
      }
      throw ConfigError("command line: unexpected argument '" + a + "' (overrides are --section.key=value)");
    }
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (!find_option(name))
      fail("command line", name.find('.') == std::string::npos ? "?." + name : name,
           "unknown key; did you mean '--" + nearest_option(name) + "'?");
    args.push_back(a);
  }
  try {
    po::store(po::command_line_parser(args).options(desc).style(po::command_line_style::allow_long |
                                                              po::command_line_style::long_allow_adjacent |
                                                              po::command_line_style::long_allow_next).run(),
              cli_vm);
  } catch (const po::multiple_occurrences& e) {
    throw ConfigError("command line: " + std::string(e.what()) + " (give each override once)");
  } catch (const po::error& e) {
    throw ConfigError("command line: " + std::string(e.what()));
  }
  try {
    po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), deck_vm);
  } catch (const po::error& e) {  // the structural scan catches what it can name precisely first
    throw ConfigError(deck_path + ": " + e.what());
  }

  JobConfig cfg;
  cfg.deck_path = deck_path;
  for (const Option& o : option_registry()) {
    const std::string name = o.dotted();
    if (cli_vm.count(name)) {
      o.set(cfg, convert(o, cli_vm[name].as<std::string>(), false, "command line"));
      cfg.origins.emplace_back(name, "command line");
    } else if (deck_vm.count(name)) {
      const std::string where = deck_path + ":" + std::to_string(lines.at(name));
      o.set(cfg, convert(o, deck_vm[name].as<std::string>(), true, where));
      cfg.origins.emplace_back(name, where);
    }
  }
  return cfg;
}

std::string resolved_deck_toml(const JobConfig& cfg) {
  std::ostringstream out;
  out << "# Resolved deck: every key with the value used (generated by meshtrain from "
      << (cfg.deck_path.empty() ? std::string("defaults") : cfg.deck_path) << " and command-line overrides).\n";
  std::string section;
  for (const Option& o : option_registry()) {
    if (o.section != section) {
      section = o.section;
      out << "\n[" << section << "]\n";
    }
    const std::string v = o.get(cfg);
    if (v.empty()) out << "# " << o.key << " = (unset: " << o.doc << ")\n";
    else out << o.key << " = " << v << "\n";
  }
  return out.str();
}

}  // namespace meshtrain
