#include "config/float8_config.hpp"

#include <optional>

#include "config/option_registry.hpp"

namespace meshtrain {

namespace {

// The value of TorchTitan-only key `dotted` as its option parses it, or nullopt when unset.
std::optional<OptionValue> tt_value(const JobConfig& cfg, const std::string& dotted) {
  const auto it = cfg.torchtitan.find(dotted);
  const Option* o = find_option(dotted);
  if (it == cfg.torchtitan.end() || !o) return std::nullopt;
  return parse_option_value(*o, it->second, ValueSyntax::kDeck);
}

}  // namespace

bool is_float8_converter(const std::string& converter) {
  return converter == "float8" || converter == "quantize.linear.float8";
}

Float8Config float8_config(const JobConfig& cfg) {
  Float8Config f;
  if (const auto v = tt_value(cfg, "model.converters"))
    for (const OptionValue& c : v->items) f.enabled = f.enabled || is_float8_converter(c.text);
  const std::string s = "quantize.linear.float8.";
  if (const auto v = tt_value(cfg, s + "recipe_name")) f.recipe = v->text, f.recipe_set = true;
  if (const auto v = tt_value(cfg, s + "filter_fqns"))
    for (const OptionValue& c : v->items) f.filter_fqns.push_back(c.text);
  if (const auto v = tt_value(cfg, s + "emulate")) f.emulate = v->b;
  if (const auto v = tt_value(cfg, s + "enable_fsdp_float8_all_gather")) f.fsdp_float8_all_gather = v->b;
  if (const auto v = tt_value(cfg, s + "precompute_float8_dynamic_scale_for_fsdp")) f.precompute_scale = v->b;
  return f;
}

bool float8_converts(const Float8Config& f8, const std::string& fqn, int64_t out, int64_t in) {
  if (out % 16 != 0 || in % 16 != 0) return false;
  for (const std::string& f : f8.filter_fqns)
    if (fqn.find(f) != std::string::npos) return false;
  return true;
}

}  // namespace meshtrain
