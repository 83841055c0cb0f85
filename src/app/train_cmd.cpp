// `meshtrain train --deck FILE [--section.key=value ...]`
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/deck_args.hpp"
#include "checkpoint/async_checkpoint.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "config/deck_parser.hpp"
#include "topology/discovery.hpp"
#include "train/preemption.hpp"
#include "train/trainer.hpp"
#include "util/errors.hpp"
#include "util/log.hpp"

namespace meshtrain::app {

namespace {

// The MPI thread level the run needs, read from the deck before MPI starts: asynchronous
// checkpoints write from a background thread (MPI_THREAD_MULTIPLE); every other run keeps the
// single-caller level, so a library's thread locking costs nothing there. A deck that does not
// load asks for nothing more: the real parse below reports its error once MPI is up.
int thread_level_for(int argc, char** argv) {
  try {
    const DeckArgs args = parse_deck_args(argc, argv);
    if (args.deck.empty()) return MPI_THREAD_FUNNELED;
    const JobConfig cfg = load_job_config(args.deck, args.overrides);
    return cfg.checkpoint.enable && cfg.checkpoint.async_mode != "disabled" ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
  } catch (const std::exception&) {
    return MPI_THREAD_FUNNELED;
  }
}

}  // namespace

int cmd_train(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv, thread_level_for(argc, argv));
  log::init(mpi.world_rank(), mpi.host());
  // Every rank parses and validates before any work, so a bad deck exits 2 everywhere with the
  // same one-line message (printed once, by rank 0) and nothing is written.
  // The corpus is opened here too: a missing or corrupt dataset is bad input, not a crash.
  // Ranks then agree on the outcome, so a failure on any rank (say, a file missing on one node)
  // stops every rank with status 2 and the lowest failing rank prints its one line.
  JobConfig cfg;
  ParallelDims dims;
  std::unique_ptr<TokenStore> store;
  std::unique_ptr<RankLayout> layout;
  Topology topo;
  // Runs one preflight phase on every rank; true when it failed anywhere. Each phase ends in
  // this agreement, so no rank enters a later collective that another rank skipped.
  auto failed = [&](const std::function<void()>& phase) {
    std::string error;
    try {
      phase();
    } catch (const ConfigError& e) {
      error = e.what();
    } catch (const DataError& e) {
      error = e.what();
    }
    int first = error.empty() ? mpi.world_size() : mpi.world_rank();
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first < mpi.world_size() && mpi.world_rank() == first)
      std::fprintf(stderr, "%s%s\n", first == 0 ? "" : ("[rank " + std::to_string(first) + " " + mpi.host() + "] ").c_str(),
                   error.c_str());
    return first < mpi.world_size();
  };
  if (failed([&] {
        const DeckArgs args = parse_deck_args(argc, argv);
        if (args.deck.empty()) throw ConfigError("command line: --deck FILE is required (meshtrain train --deck FILE)");
        cfg = load_job_config(args.deck, args.overrides);
        dims = cfg.validate(mpi.world_size());
        for (const std::string& n : cfg.notices) log::info("notice: " + n);  // TorchTitan keys with no effect here
        if (cfg.job.print_config) log::info("resolved deck:\n" + resolved_deck_toml(cfg));
        check_device(cfg);  // a GPU deck on a node without one stops here, before any collective
        if (cfg.checkpoint.enable && cfg.checkpoint.async_mode != "disabled")
          require_mpi_thread_multiple(cfg.origin_of("checkpoint.async_mode"), cfg.checkpoint.async_mode);
        if (!cfg.topology.file.empty()) topo = Topology::from_slurm_conf(cfg.topology.file);
      }))
    return kExitConfig;
  if (failed([&] {
        layout = std::make_unique<RankLayout>(dims, discover_places(MPI_COMM_WORLD, cfg.topology, topo),
                                              cfg.topology.allow_cross_node_tp);
        store = std::make_unique<TokenStore>(cfg.training.dataset);
        check_dataset(cfg, *store);
      }))
    return kExitConfig;
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  install_preemption_handlers();
  try {
    train(cfg, dims, *store, *layout, world);
  } catch (const PreemptedError& e) {
    // Every rank stopped at the same step boundary (agreed), after the save: a clean exit.
    if (world.rank() == 0) log::warn(e.what());
    return kExitPreempted;
  } catch (const NonFiniteError& e) {
    // Every rank reached the same verdict from the same all-reduced loss and gradient norm, at
    // the same step, before any update or save: rank 0 prints it once, all exit cleanly.
    if (world.rank() == 0) log::error(e.what());
    return kExitNonFinite;
  } catch (const ConfigError& e) {
    log::error(e.what());
    MpiRuntime::abort_job(kExitConfig);
  } catch (const DataError& e) {
    log::error(e.what());
    MpiRuntime::abort_job(kExitConfig);
  } catch (const CheckpointError& e) {
    // Checkpoint reads and writes agree on their outcome over the world, so every rank is here
    // with the same message: rank 0 prints it once, then all stop with the bad-input status.
    if (world.rank() == 0) log::error(e.what());
    world.barrier();
    MpiRuntime::abort_job(kExitConfig);
  } catch (const CommError& e) {
    log::error(e.what());
    MpiRuntime::abort_job(kExitComm);
  } catch (const std::exception& e) {
    log::error(e.what());
    MpiRuntime::abort_job(kExitRuntime);
  }
  return kExitOk;
}

}  // namespace meshtrain::app
