#pragma once
/// @file Layout-independent parameter initialization.
#include <cstdint>

#include "model/parameter.hpp"

namespace meshtrain {

/// Value of element `global_index` of `p` under `seed`, per p.init: ones, N(0, std), or
/// N(0, std) truncated at ±bound·std by resampling (util/rng.hpp). Pure function.
float init_value(const Parameter& p, uint64_t seed, uint64_t name_hash, int64_t global_index);

/// Fills `host` [count] with elements [first, first + count) of parameter p's tp-local tensor
/// (flat, row-major), each mapped to its global flat index (global_flat_index), so a slab
/// or an FSDP shard of it gets exactly the values of the same elements of the full tensor.
void init_range(const Parameter& p, uint64_t seed, int64_t first, int64_t count, float* host);

}  // namespace meshtrain
