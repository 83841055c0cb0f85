#pragma once
/// @file ShardPlan: how a model's parameters are laid out for sharded data parallelism. Units
/// follow the executor's (embedding; each transformer block; final norm + output), except that
/// a tied output projection joins the embedding's unit, since both use one weight. Within a
/// unit every parameter is dim-0 sharded (dim0_shard.hpp) and its padded block placed at a
/// 16-element (64-byte) aligned offset of the unit's flat shard buffer; all-gathering that
/// buffer over N ranks yields N such buffers in rank order.
#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.hpp"
#include "parallel/fsdp/dim0_shard.hpp"

namespace meshtrain {

/// One parameter's place in its unit's buffers (offsets in elements).
struct ShardedParam {
  Parameter* param = nullptr;
  Dim0Shard shard;
  int64_t shard_offset = 0;  ///< into the unit's padded shard buffer [shard_elems]
  int64_t full_offset = 0;   ///< into the unit's unsharded buffer [full_elems]
};

/// A sharding unit: the executor units it spans and its parameters.
struct ShardUnit {
  std::vector<size_t> members;  ///< executor unit indices, ascending
  std::vector<ShardedParam> params;
  int64_t shard_elems = 0;  ///< S = Σ align16(⌈R/N⌉·C): what each rank contributes to an all-gather
  int64_t full_elems = 0;   ///< Σ align16(R·C): the unsharded parameters (or gradients)
};

struct ShardPlan {
  int64_t group = 1, rank = 0;
  std::vector<ShardUnit> units;
  std::vector<int> unit_of;  ///< executor unit → sharding unit
};

/// Rounds an element count up to a multiple of 16 (64-byte aligned views).
inline int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

/// Which parameters a plan covers (an empty function: all of them).
using ParamFilter = std::function<bool(const Parameter&)>;

/// The plan of `model` for rank `rank` of a shard group of `group` ranks, over the parameters
/// `select` admits (expert parallelism shards the routed experts over another group than the
/// rest); every executor unit still gets a sharding unit, possibly without parameters.
/// @throws std::invalid_argument for group < 1 or rank outside [0, group).
ShardPlan make_shard_plan(const Transformer& model, int64_t group, int64_t rank, const ParamFilter& select = {});

/// The unsharded tensor of a parameter as a flat [R·C] view (its value or its gradient, in
/// whatever buffer holds it).
using FullView = std::function<Tensor(const ShardedParam&)>;

/// Copies rank k's block of every parameter out of `gathered` [N·S] (N shard buffers in rank
/// order) into the unsharded tensors `full` gives; skip_rank's blocks are left as they are
/// (−1: copy all). Pure data movement on `dev`.
void copy_out_gathered(Device& dev, const ShardUnit& u, int64_t group, const Tensor& gathered, const FullView& full,
                       int64_t skip_rank = -1);
/// The inverse layout: block k of `scatter` [N·S] := rank k's rows of every parameter's
/// unsharded tensor (padding zeroed) — the input of a reduce-scatter.
void copy_in_for_scatter(Device& dev, const ShardUnit& u, int64_t group, const FullView& full, const Tensor& scatter);

}  // namespace meshtrain
