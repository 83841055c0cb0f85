#include "plan/hardware.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "config/toml_value.hpp"
#include "util/errors.hpp"

namespace meshtrain {

extern const char* const kBuiltinHardwareCatalog;  // generated from inputs/hardware/catalog.toml

namespace {

struct Field {
  std::function<void(HardwareSpec&, double)> set_number;
  std::function<void(HardwareSpec&, const std::string&)> set_text;
  double min = 0, max = 1e300;
  bool min_open = true;  // value must be > min (else >= min)
};

const std::map<std::string, Field>& fields() {
  static const std::map<std::string, Field> f = [] {
    std::map<std::string, Field> m;
    auto num = [&](const char* key, double HardwareSpec::*member, double lo, double hi, bool open) {
      m[key] = Field{[member](HardwareSpec& h, double v) { h.*member = v; }, nullptr, lo, hi, open};
    };
    auto text = [&](const char* key, std::string HardwareSpec::*member) {
      m[key] = Field{nullptr, [member](HardwareSpec& h, const std::string& v) { h.*member = v; }};
    };
    text("description", &HardwareSpec::description);
    text("source", &HardwareSpec::source);
    num("peak_bf16_flops", &HardwareSpec::peak_bf16_flops, 0, 1e300, false);
    num("peak_fp32_flops", &HardwareSpec::peak_fp32_flops, 0, 1e300, true);
    num("memory_bytes", &HardwareSpec::memory_bytes, 0, 1e300, true);
    num("memory_bandwidth", &HardwareSpec::memory_bandwidth, 0, 1e300, true);
    m["devices_per_node"] = Field{[](HardwareSpec& h, double v) { h.devices_per_node = int64_t(v); }, nullptr, 0, 1e9, true};
    num("intra_node_bandwidth", &HardwareSpec::intra_node_bandwidth, 0, 1e300, true);
    num("inter_node_bandwidth", &HardwareSpec::inter_node_bandwidth, 0, 1e300, true);
    num("intra_node_latency_s", &HardwareSpec::intra_node_latency_s, 0, 1, false);
    num("inter_node_latency_s", &HardwareSpec::inter_node_latency_s, 0, 1, false);
    num("matmul_efficiency", &HardwareSpec::matmul_efficiency, 0, 1, true);
    num("attention_efficiency", &HardwareSpec::attention_efficiency, 0, 1, true);
    num("memory_efficiency", &HardwareSpec::memory_efficiency, 0, 1, true);
    num("comm_efficiency", &HardwareSpec::comm_efficiency, 0, 1, true);
    num("comm_overlap", &HardwareSpec::comm_overlap, 0, 1, false);
    num("async_tp_overlap", &HardwareSpec::async_tp_overlap, 0, 1, false);
    m["sm_count"] = Field{[](HardwareSpec& h, double v) { h.sm_count = int64_t(v); }, nullptr, 0, 1e6, true};
    m["gemm_tile"] = Field{[](HardwareSpec& h, double v) { h.gemm_tile = int64_t(v); }, nullptr, 0, 4096, true};
    num("attention_half_seq", &HardwareSpec::attention_half_seq, 0, 1e9, false);
    num("attention_fall_seq", &HardwareSpec::attention_fall_seq, 0, 1e12, false);
    num("attention_fall_floor", &HardwareSpec::attention_fall_floor, 0, 1, true);
    num("step_time_error", &HardwareSpec::step_time_error, 0, 1, false);
    m["fragmentation"] = Field{[](HardwareSpec& h, double v) { h.fragmentation = v; }, nullptr, 0, 0.999999, false};
    return m;
  }();
  return f;
}

std::string where(const std::string& file, int line) { return file + ":" + std::to_string(line) + ": "; }

}  // namespace

std::vector<HardwareSpec> parse_hardware_catalog(const std::string& text, const std::string& file) {
  std::vector<HardwareSpec> out;
  std::vector<std::map<std::string, int>> seen;  // per entry: key -> line
  std::vector<int> opened;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    const std::string s = toml::trim(toml::strip_comment(raw));
    if (s.empty()) continue;
    if (s.front() == '[') {
      if (s.back() != ']' || s.size() < 3)
        throw ConfigError(where(file, line) + "'" + s + "': a table header is [name]");
      const std::string name = toml::trim(s.substr(1, s.size() - 2));
      for (const HardwareSpec& h : out)
        if (h.name == name) throw ConfigError(where(file, line) + "[" + name + "]: defined twice");
      out.emplace_back();
      out.back().name = name;
      seen.emplace_back();
      opened.push_back(line);
      continue;
    }
    const size_t eq = s.find('=');
    if (eq == std::string::npos) throw ConfigError(where(file, line) + "'" + s + "': expected key = value");
    if (out.empty()) throw ConfigError(where(file, line) + "a key before the first [name] table");
    const std::string key = toml::trim(s.substr(0, eq)), value = toml::trim(s.substr(eq + 1));
    const auto it = fields().find(key);
    if (it == fields().end())
      throw ConfigError(where(file, line) + "[" + out.back().name + "] " + key + ": unknown key (see inputs/hardware/catalog.toml)");
    if (seen.back().count(key)) throw ConfigError(where(file, line) + "[" + out.back().name + "] " + key + ": set twice");
    seen.back()[key] = line;
    const Field& f = it->second;
    if (f.set_text) {
      if (!toml::looks_like_string(value))
        throw ConfigError(where(file, line) + "[" + out.back().name + "] " + key + ": expected a string");
      try {
        f.set_text(out.back(), toml::parse_string(value));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(where(file, line) + "[" + out.back().name + "] " + key + ": " + e.what());
      }
      continue;
    }
    const std::optional<double> v = toml::parse_float(value);
    if (!v) throw ConfigError(where(file, line) + "[" + out.back().name + "] " + key + ": '" + value + "' is not a number");
    const bool low = f.min_open ? *v <= f.min : *v < f.min;
    if (low || *v > f.max)
      throw ConfigError(where(file, line) + "[" + out.back().name + "] " + key + ": " + value + " is out of range (must be " +
                        (f.min_open ? "> " : ">= ") + toml::format_float(f.min) +
                        (f.max < 1e300 ? " and <= " + toml::format_float(f.max) : std::string()) + ")");
    f.set_number(out.back(), *v);
  }
  for (size_t i = 0; i < out.size(); ++i)
    for (const auto& [key, field] : fields())
      if (!seen[i].count(key))
        throw ConfigError(where(file, opened[i]) + "[" + out[i].name + "] " + key + ": missing (every entry sets every key)");
  if (out.empty()) throw ConfigError(file + ": no [name] entry");
  return out;
}

const std::vector<HardwareSpec>& builtin_hardware() {
  static const std::vector<HardwareSpec> c = parse_hardware_catalog(kBuiltinHardwareCatalog, "inputs/hardware/catalog.toml");
  return c;
}

HardwareSpec find_hardware(const std::string& spec) {
  for (const HardwareSpec& h : builtin_hardware())
    if (h.name == spec) return h;
  std::string file = spec, name;
  const size_t colon = spec.rfind(':');
  if (colon != std::string::npos && !std::ifstream(spec)) file = spec.substr(0, colon), name = spec.substr(colon + 1);
  std::ifstream in(file);
  if (!in) {
    std::string known;
    for (const HardwareSpec& h : builtin_hardware()) known += known.empty() ? h.name : ", " + h.name;
    throw ConfigError("--hardware " + spec + ": neither a catalog entry (" + known + ") nor a readable file");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<HardwareSpec> c = parse_hardware_catalog(ss.str(), file);
  if (name.empty()) {
    if (c.size() == 1) return c.front();
    throw ConfigError(file + ": " + std::to_string(c.size()) + " entries; name one as --hardware " + file + ":NAME");
  }
  for (const HardwareSpec& h : c)
    if (h.name == name) return h;
  throw ConfigError(file + ": no entry [" + name + "]");
}

}  // namespace meshtrain
