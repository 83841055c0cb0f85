#pragma once
/// @file Sharded HDF5 checkpoints (DESIGN.md data flow step 9; doc/checkpoint-format.md): one file
/// per saved step, written collectively with parallel HDF5 over MPI-IO. Every parameter is a
/// dataset of its global shape under /model/<name>, its AdamW state under
/// /optimizer/<name>/{exp_avg, exp_avg_sq}; each rank writes the hyperslab of its own shard —
/// its tensor-parallel slab, restricted to its FSDP / ZeRO rows — and of replicated pieces exactly
/// one replica writes. Loading computes the hyperslab of every local shard from the *current*
/// layout, so exact resume and elastic restart on another layout or world size are the same code.
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/transformer.hpp"
#include "optim/optimizer.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

/// Training progress restored with the tensors. The LR schedule is a function of the step, so
/// `step` is its state (`lr` records the value for inspection). meshtrain's random numbers are
/// counter-based (util/rng.hpp: a pure function of seed, stream and index), so `seed` is the
/// whole RNG state, and with the loader's global cursor it fixes the remaining sample order.
struct TrainState {
  int64_t step = 0;            ///< optimizer steps completed
  int64_t tokens_seen = 0;     ///< global tokens consumed
  int64_t loader_cursor = 0;   ///< the train loader's global cursor (samples)
  int64_t optimizer_step = 0;  ///< AdamW's t
  double lr = 0;               ///< learning rate of the last step taken
  int64_t seed = 0;            ///< [training] seed: the counter-based RNG state
  /// Mixture of Experts: each MoE block's selection bias [E], in block order (the blocks
  /// ModelArgs::is_moe_layer names), identical on every rank (gather_expert_biases). Stored as
  /// /model/layers.{i}.moe.expert_bias, part of the model state; empty for dense models.
  std::vector<std::vector<float>> expert_bias;
};

/// Which replicated pieces this rank writes: pieces replicated over dp_replicate are written by
/// its rank 0 (dp_primary); parameters replicated over tp by tp rank 0 (tp_primary).
struct CheckpointRole {
  bool dp_primary = true;
  bool tp_primary = true;
};

/// Run description stored under /meta.
struct CheckpointMeta {
  std::string deck_toml;   ///< the resolved deck
  std::string layout;      ///< e.g. "pp 1 x dp_replicate 1 x dp_shard 4 x cp 1 x tp 1"
  int64_t world_size = 1;
  int64_t seq_len = 0;     ///< training sequence length (config.json's max_position_embeddings on export)
  /// Parameters only, no optimizer state ([checkpoint] last_save_model_only, final save): for
  /// export and evaluation; resuming training from it is refused.
  bool model_only = false;
  /// Optimizer::name() of the run; plan_checkpoint sets it. A checkpoint without the attribute
  /// (written before Muon existed) holds AdamW state.
  std::string optimizer = "AdamW";
};

/// Writes `path` collectively over `world` (every rank calls it): /meta, /train_state, and the
/// hyperslab of every local shard of `shards` (parameters from LocalShard::value, AdamW state from
/// `opt` unless meta.model_only) that `role` says this rank writes. The file is flushed and closed before returning; the
/// caller renames it into place. Equivalent to write_checkpoint(path, world,
/// plan_checkpoint(...), &dev): each shard is downloaded through one host buffer while it is
/// written, so a synchronous save holds no host copy of the whole state.
/// @throws CheckpointError naming the file (on every rank: the outcome is agreed over `world`),
/// NonFiniteError (every rank) when a value about to be written is NaN or inf: the .tmp is deleted.
void save_checkpoint(const std::string& path, MPI_Comm world, Device& dev, const Transformer& model,
                     const std::vector<LocalShard>& shards, const Optimizer& opt, const TrainState& state,
                     const CheckpointRole& role, const CheckpointMeta& meta);

/// One hyperslab a rank writes: `dataset`'s elements {start, count} (global indices), whose
/// values are the device tensor `source` (a plan) or, once staged, the host copy `values` with its
/// XXH3-64 `xxh3_hex` (16 hex digits; the /checksums record).
struct StagedShard {
  std::string dataset;                 ///< "/model/<name>" or "/optimizer/<name>/{exp_avg, exp_avg_sq}"
  std::vector<hsize_t> start, count;   ///< the hyperslab, one entry per dimension of the dataset
  Tensor source;                       ///< float32 [prod(count)] on the device; undefined once staged
  std::vector<float> values;           ///< the staged host copy (empty until staged)
  std::string xxh3_hex;                ///< of `values`, computed when staged
};

/// Everything one rank contributes to a checkpoint file, independent of the live model once
/// staged: the datasets every rank creates (whole model, from the parameter catalog), this rank's
/// hyperslabs, the train state (with the MoE expert biases) and /meta. A staged snapshot is
/// plain host memory, so a background thread can write it while training changes the model.
struct CheckpointSnapshot {
  ModelArgs args;                                          ///< /meta/model_args, the bias datasets
  TrainState state;                                        ///< /train_state, expert biases
  CheckpointMeta meta;                                     ///< /meta
  std::vector<std::pair<std::string, Shape>> datasets;     ///< created by every rank, in this order
  std::vector<StagedShard> shards;                         ///< this rank's hyperslabs, in write order
  bool staged = false;                                     ///< values and hashes hold the data
};

/// The snapshot of the current state without copying anything: the datasets and this rank's
/// hyperslabs (sources are views of LocalShard::value and `opt`'s moments; `role` and tied
/// copies as in save_checkpoint). Local (no communication).
CheckpointSnapshot plan_checkpoint(const Transformer& model, const std::vector<LocalShard>& shards, const Optimizer& opt,
                                   const TrainState& state, const CheckpointRole& role, const CheckpointMeta& meta);

/// Copies every planned hyperslab of `snap` to host memory (Device::download), hashes the copy
/// and checks it for NaN / inf in the same pass, and drops the device views (staged = true).
/// Buffers of `recycle` (a previous snapshot of the same layout, may be null) are reused, so a
/// save after the first allocates no host memory. Collective over `world`: the non-finite check
/// is agreed. @throws NonFiniteError on every rank when any rank staged a non-finite value or
/// expert bias (the message names `path`, the dataset and the element, as save_checkpoint's).
void stage_checkpoint(CheckpointSnapshot& snap, MPI_Comm world, const std::string& path, Device& dev,
                      CheckpointSnapshot* recycle);

/// Writes `snap` as the file `path`, collectively over `world` (every rank calls it, each with
/// its own snapshot). A staged snapshot is written from its host copies (no device access, `dev`
/// may be null; safe on a thread other than the one training, provided no other thread calls
/// HDF5 meanwhile: this HDF5 is not thread-safe); a plan is downloaded shard by shard through
/// `dev`. The file is flushed and closed before returning; the caller renames it into place.
/// @throws CheckpointError naming the file (agreed over `world`), NonFiniteError as save_checkpoint.
void write_checkpoint(const std::string& path, MPI_Comm world, const CheckpointSnapshot& snap, Device* dev);

/// Reads `path` into the current layout: every local shard's parameter and AdamW-state
/// hyperslab (and, when the model holds replicated parameters — DDP, ZeRO-1/2 — each parameter's
/// whole tp slab), and AdamW's step count. The reads are planned from /dataset_offsets
/// (dataset_offsets.hpp; by opening each dataset in files without it) and the bytes travel
/// through one sequential stream per node (NodeReader, node_read.hpp). Every /checksums record is
/// verified: by its node's reader
/// from the bytes streaming past (StreamVerifier), whatever layouts wrote and read it, so the file
/// is read once; a record no reader saw whole is re-read, dealt round-robin over `world`.
/// Collective over `world`.
/// Returns the train state. With `model_only` ([checkpoint] initial_load_model_only) only the
/// parameters (and MoE selection biases) are read and verified: the optimizer state, its step
/// count and the records of /optimizer are left alone, and a model-only checkpoint is accepted.
/// @throws CheckpointError naming the file and dataset: not a checkpoint, a model-only checkpoint
/// (unless `model_only`),
/// a missing dataset, a parameter of another global shape (another model), an unreadable
/// hyperslab, a failed checksum (of a shard or of /dataset_offsets), a dataset elsewhere than
/// /dataset_offsets says.
TrainState load_checkpoint(const std::string& path, MPI_Comm world, Device& dev, const Transformer& model,
                           const std::vector<LocalShard>& shards, Optimizer& opt, bool model_only = false);

/// Collective over `world`: when any rank's `local_error` is non-empty, every rank throws
/// CheckpointError with the lowest such rank's message (prefixed with `path` unless it starts
/// with it), so no rank goes on into a collective the others left. Returns when none failed.
void agree_on_outcome(MPI_Comm world, const std::string& path, const std::string& local_error);

/// One piece of parameter values a rank holds: `dst` ([n] float32, a view) is elements
/// [first_elem, first_elem + n) of p's tp-local tensor.
struct ParameterPiece {
  Parameter* p = nullptr;
  Tensor dst;
  int64_t first_elem = 0;
};

/// The parameter values this rank loads, in model order: each parameter's whole tp slab when the
/// model holds replicated parameters (DDP, ZeRO-1/2), else each of its FSDP `shards`; empty
/// pieces left out. Throws nothing.
std::vector<ParameterPiece> local_parameter_pieces(const Transformer& model, const std::vector<LocalShard>& shards);

/// One line of /checksums: the XXH3-64 (16 hex digits) of hyperslab {start, count} of `dataset`.
struct ChecksumRecord {
  std::string dataset;
  std::vector<hsize_t> start, count;
  std::string xxh3_hex;
};

/// The records of /checksums in `file`. @throws CheckpointError naming `path`: no /checksums, a
/// malformed record.
std::vector<ChecksumRecord> read_checksum_records(hid_t file, const std::string& path);

/// Re-reads the shards that /checksums of the open checkpoint `file` lists — those with record
/// index % size == rank — and compares their XXH3-64 with the recorded value. Returns the number
/// of records in the file. @throws CheckpointError naming `path` and the dataset: no /checksums,
/// a listed dataset missing or unreadable, a hash mismatch.
int64_t verify_checksums(hid_t file, int rank, int size, const std::string& path);

/// The global hyperslab {start, count} (one entry per dim of p.shape) of elements
/// [first_elem, first_elem + n) of p's tp-local tensor, which must be whole rows of it.
/// @throws std::invalid_argument when the range is not whole rows.
void shard_hyperslab(const Parameter& p, int64_t first_elem, int64_t n, std::vector<hsize_t>& start,
                     std::vector<hsize_t>& count);

}  // namespace meshtrain
