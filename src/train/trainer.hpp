#pragma once
/// @file Trainer: the step loop that wires config, communicators, device, model, executor, data
/// parallelism, optimizer, data and metrics together (DESIGN.md data flow steps 5–8).
#include <memory>
#include <string>

#include "comm/mpi/mpi_communicator.hpp"
#include "config/job_config.hpp"
#include "data/token_store.hpp"
#include "layout/rank_layout.hpp"

namespace meshtrain {

/// Final numbers of a run (also the metrics.jsonl summary record).
struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;           ///< mean CE of the last step (nats/token)
  double final_val_loss = -1;      ///< last validation loss, −1 when validation is off
  double unigram_entropy = 0;      ///< entropy of the validation tokens' unigram distribution (nats)
  double elapsed_s = 0;
  double tokens_per_s = 0;         ///< mean over the run, excluding the first step
};

/// Runs training as configured. `cfg` must already be validated for world.size() ranks and
/// `dims` is what validate() returned; `store` is the opened cfg.training.dataset; `layout` places
/// this job's ranks (communicators are split from it). Rank 0 writes metrics.jsonl, deck.resolved.toml and the
/// final model (model_final.h5) into cfg.dump_folder().
/// @throws DataError (corpus), CommError (collectives), std::runtime_error (I/O).
TrainSummary train(const JobConfig& cfg, const ParallelDims& dims, const TokenStore& store, const RankLayout& layout,
                   MpiCommunicator& world);

/// Checks that the dataset fits the model (vocabulary) before any work.
/// @throws ConfigError naming [model] vocab_size and the dataset.
void check_dataset(const JobConfig& cfg, const TokenStore& store);

/// Checks that [training] device can be used on this rank before any work: "cuda" needs a
/// build with CUDA and at least one visible GPU. @throws ConfigError naming the key.
void check_device(const JobConfig& cfg);

}  // namespace meshtrain
