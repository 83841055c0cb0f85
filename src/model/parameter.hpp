#pragma once
/// @file Parameter: a named model weight with its gradient, initialization rule and sharding
/// spec (DESIGN.md data flow step 5).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "tensor/tensor.hpp"

namespace meshtrain {

class Communicator;

struct Float8LinearRecipe;  // tensor/float8.hpp

/// How a parameter's initial values are drawn; each element is a pure function of
/// (seed, parameter name, global flat index) — see model/init.hpp.
struct InitSpec {
  enum class Kind { kOnes, kNormal, kTruncNormal } kind = InitSpec::Kind::kTruncNormal;
  double std = 0.02;
  double bound = 2.0;  ///< truncation at ±bound·std (kTruncNormal)
};

/// Tensor-parallel placement of a parameter (DESIGN.md data flow step 5). A parameter split
/// over the tp group holds, on tp rank r, the slab [tp_first, tp_first + local extent) of its
/// global shape along tp_dim (⌈E/tp⌉ per rank, the last rank possibly fewer: vocabularies and
/// FFN widths need not divide). A replicated one (tp_dim = −1) is identical on every tp rank;
/// tp_partial_grad marks those whose gradient each tp rank computes only in part (norms under
/// sequence parallelism, Qwen3 q/k norms over split heads), summed over tp after backward.
/// FSDP then shards the tp-local tensor along its dim 0 (parallel/fsdp/dim0_shard.hpp).
struct ShardingSpec {
  int tp_dim = -1;
  int64_t tp_size = 1;   ///< tensor-parallel degree of the model holding this parameter
  int64_t tp_first = 0;  ///< first global index along tp_dim held on this rank
  bool tp_partial_grad = false;
  /// A pipeline stage's own copy of a weight another stage holds too (the tied
  /// tok_embeddings.weight on the last stage): its gradient is summed with the original's, it
  /// is updated identically, and it is neither written to checkpoints nor counted in the norm.
  bool tied_copy = false;
  /// Expert parallelism: a routed-expert weight ([E, …], experts first) of which this ep rank
  /// holds the experts [ep_first, ep_first + E/ep) (ep_size > 1). Its gradients are summed over
  /// the ranks holding the same experts (efsdp × dp_replicate), and the gradient norm counts it
  /// over efsdp and ep instead of fsdp.
  int64_t ep_size = 1;
  int64_t ep_first = 0;
  bool expert_parallel() const { return ep_size > 1; }
};

/// A model weight. `value` and `grad` are views into the model's flat parameter and gradient
/// buffers (so data-parallel buckets are contiguous slices) of the tensor-parallel local shape.
struct Parameter {
  std::string name;       ///< Meta naming, e.g. layers.0.attention.wq.weight
  Shape shape;            ///< global shape
  Shape local_shape;      ///< this tp rank's slab (== shape unless split over tp)
  Tensor value;           ///< [local_shape] (FSDP binds it only while the unit is gathered)
  Tensor grad;            ///< same shape as value, always f32 (gradients accumulate in f32)
  /// [local_shape] the value in the compute dtype (bf16 under mixed precision), refreshed from
  /// `value` by Transformer::ensure_compute; undefined in float32 runs.
  Tensor compute;
  InitSpec init;
  bool weight_decay = true;  ///< false for norms and embeddings unless the deck says otherwise
  ShardingSpec sharding;
  int64_t flat_offset = 0;   ///< element offset in the flat buffers
  /// Set on the weight [out, in] of a linear layer converted to Float8 training
  /// (model/float8_linears.hpp): linear_forward / linear_backward cast the operands of its three
  /// GEMMs per this recipe. Null: high precision.
  std::shared_ptr<const Float8LinearRecipe> float8;
  /// With `float8` on a weight split over tp (sharding.tp_dim ≥ 0): the tp group, over which the
  /// amax of every scaling group that spans the split is reduced with max before the cast (as
  /// TorchAO computes it over the whole DTensor). Null when not split.
  Communicator* float8_tp = nullptr;

  /// What forward and backward read: `compute` under bf16 mixed precision, else `value`.
  const Tensor& compute_value() const { return compute.defined() ? compute : value; }
};

/// A parameter of global `shape` with its init rule; value/grad are bound when the model
/// allocates its flat buffers.
inline Parameter make_parameter(std::string name, Shape shape, InitSpec init, bool weight_decay = true) {
  Parameter p;
  p.name = std::move(name);
  p.local_shape = shape;
  p.shape = std::move(shape);
  p.init = init;
  p.weight_decay = weight_decay;
  return p;
}

/// Rows of an extent E split over `parts` ranks as torch.chunk does: ⌈E/parts⌉ each, the
/// last ranks fewer (possibly none). Returns {first, count} for `part`.
inline std::pair<int64_t, int64_t> chunk_range(int64_t extent, int64_t parts, int64_t part) {
  const int64_t per = (extent + parts - 1) / parts;
  const int64_t first = std::min(extent, part * per);
  return {first, std::min(extent, first + per) - first};
}

/// Splits `p` along `dim` over a tensor-parallel group of `tp` ranks; this is rank `rank`'s
/// slab (chunk_range). No-op for tp == 1. @throws std::invalid_argument for a bad dim or a
/// rank that would hold nothing (config validation rejects such models first).
void split_tensor_parallel(Parameter& p, int dim, int64_t tp, int64_t rank);

/// Splits the expert-first `p` ([E, …]) over an ep group of `ep` ranks: rank `rank` holds
/// experts [rank·E/ep, (rank+1)·E/ep). No-op for ep == 1. @throws std::invalid_argument when ep
/// does not divide E (config validation rejects such models first).
void split_expert_parallel(Parameter& p, int64_t ep, int64_t rank);

/// The global flat (row-major) index of element `local_index` of p's tp-local tensor.
int64_t global_flat_index(const Parameter& p, int64_t local_index);

}  // namespace meshtrain
