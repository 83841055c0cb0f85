#pragma once
/// @file [checkpoint] initial_load_path: where a run whose checkpoint folder holds no checkpoint
/// yet starts from (TorchTitan's initial_load_path, initial_load_model_only, initial_load_in_hf).
/// A meshtrain checkpoint (a step file, or a folder's `latest`) is read into this run's layout —
/// parameters only, or with initial_load_model_only = false the whole training state; a Hugging
/// Face model folder is checked against [model] and its safetensors read into the local shards
/// (checkpoint/hf_import.hpp). Once the run has saved a checkpoint of its own, a restart resumes
/// that instead (Trainer::resume never gets here).
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/sharded_checkpoint.hpp"
#include "config/job_config.hpp"

namespace meshtrain {

/// What load_initial_checkpoint read.
struct InitialLoad {
  std::string path;          ///< the file or folder read
  std::string format;        ///< "meshtrain" or "huggingface"
  bool full_state = false;   ///< the training state was read too (initial_load_model_only = false)
  TrainState state;          ///< the checkpoint's train state (used when full_state)
  int64_t tensors = 0;       ///< tensors in a Hugging Face folder; 0 for a meshtrain checkpoint
  int64_t bytes = 0;         ///< bytes read from disk over all ranks (HF), or the checkpoint file's size
};

/// Reads cfg.checkpoint.initial_load_path (or, with initial_load_in_hf and no path, [model]
/// hf_assets_path) into `model`'s local `shards` (and `opt` when the whole state is read), MoE
/// selection biases included. Returns nothing when no initial load is configured. Collective over
/// `world`: every rank reads its own shards, and all fail together.
/// @throws CheckpointError naming the path (on every rank alike): a missing file or folder, a
/// folder with no checkpoint, a Hugging Face folder given without initial_load_in_hf (or the
/// reverse), a config.json that disagrees with [model] (the field, its value, the deck's), a
/// missing or misshapen tensor, a failed checksum.
std::optional<InitialLoad> load_initial_checkpoint(const JobConfig& cfg, MPI_Comm world, Device& dev, Transformer& model,
                                                   const std::vector<LocalShard>& shards, Optimizer& opt);

}  // namespace meshtrain
