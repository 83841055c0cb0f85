#pragma once
/// @file Float8 training as a deck asks for it: TorchTitan v0.2.2's `[model] converters =
/// ["float8"]` (or "quantize.linear.float8") with its `[quantize.linear.float8]` table
/// (torchtitan/config/job_config.py, Float8Linear; torchtitan/components/quantization/float8.py).
/// The keys are TorchTitan-only options kept in JobConfig::torchtitan; this reads them back.
#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace meshtrain {

/// The resolved Float8 settings of a run.
struct Float8Config {
  bool enabled = false;  ///< model.converters names float8
  /// TorchAO's recipe: recipe_name as set, "tensorwise" when unset (TorchTitan's None builds
  /// TorchAO's default Float8LinearConfig, which is tensorwise).
  std::string recipe = "tensorwise";
  bool recipe_set = false;                ///< recipe_name was given
  std::vector<std::string> filter_fqns;   ///< module names kept in high precision (substring match)
  bool emulate = false;                   ///< quantize → dequantize + f32 GEMM instead of FP8 GEMMs
  bool fsdp_float8_all_gather = false;    ///< enable_fsdp_float8_all_gather
  bool precompute_scale = false;          ///< precompute_float8_dynamic_scale_for_fsdp
};

/// Whether `converter` (an entry of model.converters) is the float8 linear converter. Throws nothing.
bool is_float8_converter(const std::string& converter);

/// The Float8 settings of `cfg` (defaults for keys not set). Throws nothing for a loaded
/// config (its values were checked when parsed).
Float8Config float8_config(const JobConfig& cfg);

/// TorchTitan's module filter (torchtitan/components/quantization/utils.py, module_filter_fn):
/// a linear layer named `fqn` ("layers.0.attention.wq", "output") with weight [out, in] is
/// converted unless some filter_fqns entry is a substring of fqn, or out or in is not a
/// multiple of 16 (the FP8 tensor cores' rule, kept so both devices convert the same layers).
/// Throws nothing.
bool float8_converts(const Float8Config& f8, const std::string& fqn, int64_t out, int64_t in);

}  // namespace meshtrain
