#pragma once
/// @file The hardware catalog (inputs/hardware/catalog.toml, compiled into the binary; a user file of
/// the same form may replace it): peak rates, memory, bandwidths and the efficiency factors
/// the planner's time model applies (plan/time_model.hpp).
#include <string>
#include <vector>

namespace meshtrain {

/// One device kind. Rates in FLOP/s and bytes/s (one direction), sizes in bytes, times in s.
struct HardwareSpec {
  std::string name, description, source;
  double peak_bf16_flops = 0, peak_fp32_flops = 0;
  double memory_bytes = 0, memory_bandwidth = 0;
  int64_t devices_per_node = 8;
  double intra_node_bandwidth = 0, inter_node_bandwidth = 0;
  double intra_node_latency_s = 0, inter_node_latency_s = 0;
  double matmul_efficiency = 1, attention_efficiency = 1, memory_efficiency = 1, comm_efficiency = 1;
  double comm_overlap = 0;  ///< fraction of compute time that can hide asynchronous collectives
  /// Fraction of the blocks' tensor-parallel communication that async TP hides (at most its
  /// fused GEMMs' (tp − 1)/tp; plan/time_model.hpp).
  double async_tp_overlap = 0;
  double fragmentation = 0;
  /// Units that run GEMM output tiles at once (GPU streaming multiprocessors; the cpu entry: 1,
  /// one core per rank) and the edge of a tile, elements: tile and wave quantization.
  int64_t sm_count = 1, gemm_tile = 1;
  /// Keys per query block at which flash attention reaches half its long-sequence speed (causal).
  double attention_half_seq = 0;
  /// Keys per query row at which the attention kernel's rate has fallen to half as its per-row
  /// working set leaves the caches (meshtrain's cpu kernel, row by row); 0: no fall (GPUs).
  double attention_fall_seq = 0;
  /// The fraction of the short-row rate the fall levels off at (with attention_fall_seq > 0).
  double attention_fall_floor = 1;
  /// The step-time model's relative error band on this entry (from doc/plan.md's accuracy
  /// tables): predictions closer than this to the fastest are not told apart.
  double step_time_error = 0;
  /// The peak for a run in `dtype_bytes` (2: bf16 tensor cores, 4: fp32). @throws nothing.
  double peak_flops(int dtype_bytes) const { return dtype_bytes == 2 ? peak_bf16_flops : peak_fp32_flops; }
};

/// Parses a catalog: `[name]` tables of `key = value` lines (TOML: numbers, strings, `#`
/// comments), every key of the built-in catalog required in each table.
/// @throws ConfigError `FILE:LINE: ...` for a syntax error, an unknown or missing key, a
/// duplicate table or a value out of range (rates and sizes > 0 except peak_bf16_flops ≥ 0,
/// efficiencies in (0, 1], fragmentation in [0, 1)).
std::vector<HardwareSpec> parse_hardware_catalog(const std::string& text, const std::string& file);

/// The built-in catalog (inputs/hardware/catalog.toml as compiled in).
const std::vector<HardwareSpec>& builtin_hardware();

/// `name_or_file`: an entry of the built-in catalog, or a catalog file (its only entry, or the
/// entry named after a colon: FILE:NAME). @throws ConfigError naming the known entries or the
/// file's problem.
HardwareSpec find_hardware(const std::string& name_or_file);

}  // namespace meshtrain
