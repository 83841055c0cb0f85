#pragma once
/// @file Parameter: a named model weight with its gradient, initialization rule and sharding
/// spec (DESIGN.md data flow step 5).
#include <string>

#include "tensor/tensor.hpp"

namespace meshtrain {

/// How a parameter's initial values are drawn; each element is a pure function of
/// (seed, parameter name, global flat index) — see model/init.hpp.
struct InitSpec {
  enum class Kind { kOnes, kNormal, kTruncNormal } kind = InitSpec::Kind::kTruncNormal;
  double std = 0.02;
  double bound = 2.0;  ///< truncation at ±bound·std (kTruncNormal)
};

/// Placement of a parameter over the mesh. tp_dim: the dim split over tensor-parallel ranks
/// (-1 = replicated); fsdp_shard: dim-0 shard over the fsdp group (FSDP2-style, padded evenly).
/// Only the fully replicated placement is implemented in this issue.
struct ShardingSpec {
  int tp_dim = -1;
  bool fsdp_shard = false;
};

/// A model weight. `value` and `grad` are views into the model's flat parameter and gradient
/// buffers (so data-parallel buckets are contiguous slices); shape is the global shape.
struct Parameter {
  std::string name;       ///< Meta naming, e.g. layers.0.attention.wq.weight
  Shape shape;            ///< global shape
  Tensor value;           ///< local shard (== global while unsharded)
  Tensor grad;            ///< same shape as value
  InitSpec init;
  bool weight_decay = true;  ///< false for norms and embeddings unless the deck says otherwise
  ShardingSpec sharding;
  int64_t flat_offset = 0;   ///< element offset in the flat buffers
};

/// A parameter of global `shape` with its init rule; value/grad are bound when the model
/// allocates its flat buffers.
inline Parameter make_parameter(std::string name, Shape shape, InitSpec init, bool weight_decay = true) {
  Parameter p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.init = init;
  p.weight_decay = weight_decay;
  return p;
}

}  // namespace meshtrain
