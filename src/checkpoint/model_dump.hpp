#pragma once
/// @file Model dumps: an HDF5 file with a model's arguments, its parameters in global shape
/// (/params/<name>), optionally their gradients (/grads/<name>) and the batch they came from
/// (/batch/tokens). Used for the final trained model of a run and for the PyTorch validation
/// (validation/check_gradients.py reads exactly this layout; doc/checkpoint-format.md).
#include <string>
#include <vector>

#include "model/transformer.hpp"

namespace meshtrain {

struct DumpOptions {
  bool grads = false;                 ///< also write /grads
  const std::vector<int32_t>* tokens = nullptr;  ///< [B, T+1] written to /batch/tokens when set
  int64_t batch = 0, seq_len = 0;
  double loss = 0;                    ///< root attribute "loss" when grads are written
  /// Global values of every parameter (model.parameters() order, row-major) to write instead
  /// of downloading Parameter::value — a tensor-parallel model's slabs reassembled
  /// (gather_tp_parameter). Not with grads.
  const std::vector<std::vector<float>>* global_values = nullptr;
  /// Root attribute moe_force_load_balance (1: the MoE layers routed round-robin), when grads
  /// are written.
  bool moe_force_load_balance = false;
};

/// Writes `model` (unsharded, on this rank, or its global values from opt.global_values) to
/// `path` via `path.tmp` + rename, so a failure never leaves a half-written file.
/// @throws CheckpointError naming the file.
void write_model_dump(const std::string& path, Transformer& model, Device& dev, const DumpOptions& opt = {});

/// Reads `group`/<name> of `path` into every parameter of (unsharded) `model` (shapes must
/// match): "/params" of a model dump, or "/model" of a sharded checkpoint, whose datasets hold the
/// same global tensors. @throws CheckpointError naming the file and dataset on a missing dataset
/// or a shape mismatch.
void read_model_dump(const std::string& path, Transformer& model, Device& dev, const std::string& group = "/params");

}  // namespace meshtrain
