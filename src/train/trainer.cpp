#include "train/trainer.hpp"

#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "checkpoint/checkpoint_folder.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "comm/mesh_communicators.hpp"
#include "config/deck_parser.hpp"
#include "data/loader.hpp"
#include "data/stats.hpp"
#include "device/device.hpp"
#include "graph/executor.hpp"
#include "metrics/metrics_writer.hpp"
#include "metrics/step_profiler.hpp"
#include "metrics/tensorboard_writer.hpp"
#include "metrics/throughput.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "parallel/mixed_precision.hpp"
#include "parallel/tp_grads.hpp"
#include "train/device_comms.hpp"
#include "train/nonfinite_guard.hpp"
#include "train/preemption.hpp"
#include "util/errors.hpp"
#include "util/log.hpp"
#include "util/trace.hpp"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt("%.1f ", b) + units[u];
}

/// Loads the checkpoint [checkpoint] asks for through `load` (collective; throws
/// CheckpointError on every rank alike) and returns its path, or nothing for a fresh run. With
/// on_corrupt = "previous" (and load_step = -1) a checkpoint that fails is reported and the next
/// older one is tried.
std::optional<std::string> load_with_fallback(const CheckpointSection& c, const std::string& dir,
                                              const std::function<void(const std::string&)>& load) {
  std::optional<std::string> first;
  try {
    first = checkpoint_to_load(dir, c.load_step);
    if (first) load(*first);
    return first;
  } catch (const CheckpointError& e) {
    if (c.on_corrupt != "previous" || c.load_step >= 0) throw;
    log::warn(std::string(e.what()) + "; [checkpoint] on_corrupt = previous: trying an older checkpoint");
    const std::vector<int64_t> steps = checkpoint_steps(dir);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const std::string f = (std::filesystem::path(dir) / checkpoint_file_name(*it)).string();
      if (first && f == *first) continue;
      try {
        load(f);
        log::warn("resuming from the previous good checkpoint " + f);
        return f;
      } catch (const CheckpointError& older) {
        log::warn(std::string(older.what()) + "; trying an older checkpoint");
      }
    }
    throw CheckpointError(dir + ": no checkpoint loads (on_corrupt = previous tried every step file)");
  }
}

/// "pp 1 × dp_replicate 2 × dp_shard 4 × cp 1 × tp 2": the layout a checkpoint records.
std::string layout_summary(const ParallelDims& d) {
  return "pp " + std::to_string(d.pp) + " × dp_replicate " + std::to_string(d.dp_replicate) + " × dp_shard " +
         std::to_string(d.dp_shard) + " × cp " + std::to_string(d.cp) + " × tp " + std::to_string(d.tp);
}

/// Mean validation loss over the first `max_steps` global batches of the validation split (all of
/// it when < 0), read in order; chunks of local_batch samples are dealt round-robin to the dp
/// ranks, so the samples, and hence the value, do not depend on the layout.
double validate_loss(Device& dev, Transformer& model, Executor& exec, GradientSync& sync, const DataLoader& val,
                     Communicator& dp, int64_t local_batch, int64_t global_batch, int64_t max_steps) {
  const int64_t t = val.seq_len();
  sync.begin_evaluation();
  const int64_t total = max_steps < 0 ? val.num_samples() : std::min(val.num_samples(), max_steps * global_batch);
  double sums[2] = {0, 0};
  std::vector<int32_t> samples;
  for (int64_t start = 0; start < total; start += local_batch * dp.size()) {
    const int64_t first = start + dp.rank() * local_batch;
    const int64_t n = std::max<int64_t>(0, std::min(local_batch, total - first));
    if (n == 0) {
      // A rank past the end of the split still takes part in the collectives of a forward
      // that gathers parameters; it runs one sample it does not count.
      if (sync.forward_is_collective()) {
        samples.resize(size_t(t + 1));
        val.fetch(0, 1, samples.data());
        StepContext idle = model.make_context(samples.data(), 1, t, 0.0f, /*need_backward=*/false);
        exec.forward(idle);
      }
      continue;
    }
    samples.resize(size_t(n * (t + 1)));
    val.fetch(first, n, samples.data());
    StepContext ctx = model.make_context(samples.data(), n, t, 0.0f, /*need_backward=*/false);
    exec.forward(ctx);
    sums[0] += ctx.loss_sum;
    sums[1] += double(ctx.num_targets);
  }
  dp.all_reduce_host(sums, 2, ReduceOp::kSum);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

}  // namespace

void check_dataset(const JobConfig& cfg, const TokenStore& store) {
  const ModelArgs args = cfg.model_args();
  if (store.vocab_size() > args.vocab_size)
    throw ConfigError(cfg.origin_of("model.vocab_size") + ": [model] vocab_size: " + std::to_string(args.vocab_size) +
                      " is smaller than the vocabulary of " + cfg.training.dataset + " (" +
                      std::to_string(store.vocab_size()) + "); token ids must be < vocab_size");
}

void check_device(const JobConfig& cfg) {
  if (cfg.training.device != "cuda") return;
  if (!cuda_build())
    throw ConfigError(cfg.origin_of("training.device") +
                      ": [training] device: \"cuda\" but this meshtrain was built without CUDA (configure with "
                      "-DMESHTRAIN_CUDA=ON where the CUDA toolkit and NCCL are installed, or use device = \"cpu\")");
  if (cuda_device_count() == 0)
    throw ConfigError(cfg.origin_of("training.device") +
                      ": [training] device: \"cuda\" but no GPU is visible to this rank (check the allocation's "
                      "--gpus / CUDA_VISIBLE_DEVICES and the NVIDIA driver)");
}

TrainSummary train(const JobConfig& cfg, const ParallelDims& dims, const TokenStore& store, const RankLayout& layout,
                   MpiCommunicator& world) {
  const bool rank0 = world.rank() == 0;
  const auto t_start = Clock::now();
  const ModelArgs args = cfg.model_args();
  const int64_t local_batch = cfg.training.local_batch_size, seq_len = cfg.training.seq_len;
  const int64_t global_batch = cfg.global_batch(dims), accum = cfg.grad_accum_steps(dims);

  DataLoader loader(store.split("train"), seq_len, uint64_t(cfg.training.seed));
  DataLoader val_loader(store.split("validation"), seq_len, uint64_t(cfg.training.seed), /*shuffle=*/false);
  const double unigram = unigram_entropy(store.split("validation"), store.vocab_size());

  world.set_timeout(cfg.comm.init_timeout_seconds);
  MeshCommunicators comms(world, layout);
  comms.set_timeout(cfg.comm.init_timeout_seconds);
  Communicator* dp = &comms.get(MeshDim::kDP);        // data loading: which samples this rank reads
  Communicator& loss_comm = comms.get(MeshDim::kLoss);  // loss and token counts
  // One GPU per rank: the node-local rank picks it (modulo the visible GPUs, so several ranks
  // may share one GPU in tests; collectives then go through MPI, see DeviceComms).
  auto device = make_device(cfg.training.device, 0, int(layout.place(world.rank()).local_rank));
  Device& dev = *device;
  DeviceComms dcomms(comms, dev, world, layout, cfg.comm.init_timeout_seconds);
  bool peak_measured = false;
  const double peak = dev.peak_flops(&peak_measured);

  // dp_shard > 1 shards over the fsdp group (ZeRO-1/2/3, HSDP with dp_replicate > 1); else DDP.
  Communicator& fsdp_comm = dcomms.get(MeshDim::kFSDP);
  const bool sharded = fsdp_comm.size() > 1;
  const int zero_stage = sharded ? int(cfg.parallelism.zero_stage) : 0;
  // Tensor parallelism inside the node (tp innermost in the layout); the data-parallel
  // strategies below then shard or replicate the tp-local tensors (2-D parallelism).
  Communicator& tp_comm = dcomms.get(MeshDim::kTP);
  TensorParallel tp;
  tp.comm = &tp_comm;
  tp.size = tp_comm.size();
  tp.rank = tp_comm.rank();
  tp.sequence_parallel = cfg.parallelism.enable_sequence_parallel;
  tp.loss_parallel = !cfg.parallelism.disable_loss_parallel;
  // Mixed precision: bf16 activations and compute copies of the weights; f32 masters, grads, AdamW.
  const DType compute_dtype = cfg.training.mixed_precision_param == "bfloat16" ? DType::kBF16 : DType::kF32;
  const DType reduce_dtype = cfg.training.mixed_precision_reduce == "bfloat16" ? DType::kBF16 : DType::kF32;
  Transformer model(args, dev, sharded ? model_storage_for(zero_stage) : ModelStorage{}, tp, compute_dtype);
  std::unique_ptr<GradientSync> sync;
  if (sharded) {
    ShardedOptions so;
    so.zero_stage = zero_stage;
    // TorchTitan's "default": reshard after forward unless pipeline parallel (pp == 1 here).
    so.reshard_after_forward = cfg.parallelism.fsdp_reshard_after_forward != "never";
    so.reduce_dtype = reduce_dtype;
    so.param_dtype = compute_dtype;  // FSDP2's param_dtype: ZeRO-3 gathers bf16 under mixed precision
    auto sdp = std::make_unique<ShardedDataParallel>(model, dev, fsdp_comm, &dcomms.get(MeshDim::kDpReplicate), so);
    sdp->init_weights(uint64_t(cfg.training.seed));
    sync = std::move(sdp);
  } else {
    model.init_weights(uint64_t(cfg.training.seed));
    sync = std::make_unique<DataParallel>(model, dcomms.get(MeshDim::kDpReplicate), 25 << 20, reduce_dtype);
  }
  Executor exec(model.units(), model.block_index(),
                CheckpointPolicy::from_deck(cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option));
  MixedPrecisionHooks hooks(model, sync.get());
  exec.set_hooks(&hooks);
  AdamW opt(sync->local_shards(), dev, cfg.optimizer);
  LrSchedule schedule(cfg.lr_scheduler, cfg.optimizer.lr, cfg.training.steps);

  const std::filesystem::path out_dir = cfg.dump_folder();
  // Resume: the checkpoint `latest` names (or load_step's) is read into this layout's shards,
  // whatever layout wrote it (every rank reads the hyperslabs it now owns).
  const std::string ckpt_dir = (out_dir / cfg.checkpoint.folder).string();  // an absolute folder wins
  TrainState resumed;
  nlohmann::json load_event;  // written to metrics.jsonl once it is open
  if (cfg.checkpoint.enable) {
    const auto t_load = Clock::now();
    if (const auto from = load_with_fallback(cfg.checkpoint, ckpt_dir, [&](const std::string& f) {
          resumed = load_checkpoint(f, world.comm(), dev, model, sync->local_shards(), opt);
          model.params_changed();
        })) {
      if (resumed.seed != cfg.training.seed)  // the remaining sample order would change
        throw CheckpointError(*from + ": written with [training] seed " + std::to_string(resumed.seed) + ", the deck has " +
                              std::to_string(cfg.training.seed) + "; resuming would reorder the remaining samples (set seed = " +
                              std::to_string(resumed.seed) + ")");
      loader.set_cursor(resumed.loader_cursor);
      load_event = {{"event", "checkpoint_load"}, {"step", resumed.step}, {"bytes", int64_t(std::filesystem::file_size(*from))},
                    {"seconds", seconds_since(t_load)}};
      log::info("resumed from " + *from + ": step " + std::to_string(resumed.step) + ", " +
                std::to_string(resumed.tokens_seen) + " tokens seen, loader cursor " +
                std::to_string(resumed.loader_cursor) + " (" + human_bytes(double(load_event["bytes"])) + " in " +
                fmt("%.2f s", double(load_event["seconds"])) + ", checksums verified)");
    }
  }
  if (rank0) {
    std::filesystem::create_directories(out_dir);
    std::ofstream(out_dir / "deck.resolved.toml") << resolved_deck_toml(cfg);
  }
  MetricsWriter metrics((out_dir / "metrics.jsonl").string(), rank0, /*append=*/resumed.step > 0);
  if (!load_event.is_null()) metrics.write(load_event);
  // [profiling]: Chrome traces of the executor's units and the collectives, every profile_freq
  // steps; [metrics] enable_tensorboard: the log line's scalars as TensorBoard events.
  const ProfilingSection& pc = cfg.profiling;
  std::unique_ptr<StepProfiler> profiler;
  try {
    profiler = std::make_unique<StepProfiler>(
        ProfilingOptions{pc.enable_profiling, (out_dir / pc.save_traces_folder).string(), pc.profile_freq,
                         pc.profiler_warmup, pc.profiler_active},
        world.rank());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(cfg.origin_of("profiling.profiler_active") + ": " + e.what());
  }
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (cfg.metrics.enable_tensorboard && (rank0 || cfg.metrics.save_for_all_ranks)) {
    std::filesystem::path tb_dir = out_dir / cfg.metrics.save_tb_folder;
    if (cfg.metrics.save_for_all_ranks) tb_dir /= "rank_" + std::to_string(world.rank());
    tensorboard = std::make_unique<TensorBoardWriter>(tb_dir.string(), world.rank());
    log::info("tensorboard: " + tensorboard->path());
  }
  int64_t tokens_seen = resumed.tokens_seen;
  Communicator& dp_replicate = dcomms.get(MeshDim::kDpReplicate);
  double last_lr = 0;
  auto save = [&](int64_t step) {
    trace::Span span("checkpoint save", "checkpoint");
    const auto t_save = Clock::now();
    if (rank0) std::filesystem::create_directories(ckpt_dir);
    world.barrier();
    const std::string tmp = (std::filesystem::path(ckpt_dir) / checkpoint_file_name(step)).string() + ".tmp";
    const TrainState st{step, tokens_seen, loader.cursor(), opt.step_count(), last_lr, cfg.training.seed};
    const bool model_only = cfg.checkpoint.last_save_model_only && step == cfg.training.steps;
    CheckpointMeta meta{resolved_deck_toml(cfg), layout_summary(dims), int64_t(world.size()), seq_len, model_only};
    save_checkpoint(tmp, world.comm(), dev, model, sync->local_shards(), opt, st,
                    CheckpointRole{dp_replicate.rank() == 0, tp_comm.rank() == 0}, meta);
    // Rank 0 publishes; every rank learns whether that worked, so all stop together if not.
    std::string error;
    if (rank0) try {
        publish_checkpoint(ckpt_dir, step, cfg.checkpoint.keep_latest_k);
      } catch (const CheckpointError& e) {
        error = e.what();
      }
    double failed = error.empty() ? 0 : 1;
    world.all_reduce_host(&failed, 1, ReduceOp::kMax);
    if (failed) throw CheckpointError(rank0 ? error : ckpt_dir + ": publishing the checkpoint of step " + std::to_string(step) + " failed on rank 0");
    const double dt = seconds_since(t_save);
    const std::string file = ckpt_dir + "/" + checkpoint_file_name(step);
    const int64_t bytes = rank0 ? int64_t(std::filesystem::file_size(file)) : 0;
    metrics.write({{"event", "checkpoint_save"}, {"step", step}, {"bytes", bytes}, {"seconds", dt}});
    log::info("checkpoint: step " + std::to_string(step) + (model_only ? " (model only)" : "") + " saved to " + file + " (" + human_bytes(double(bytes)) +
              " in " + fmt("%.2f s", dt) + ")");
  };
  const double flops_per_token = args.flops_per_token(seq_len);
  log::info("meshtrain: " + args.name + " " + args.flavor + ", " + std::to_string(args.num_params()) +
            " parameters, " + fmt("%.3g", flops_per_token) + " FLOPs/token; world " + std::to_string(world.size()) +
            " (dp_replicate " + std::to_string(dims.dp_replicate) + ", dp_shard " + std::to_string(dims.dp_shard) +
            (sharded ? (zero_stage == 3 ? ", FSDP" : ", ZeRO-" + std::to_string(zero_stage)) : std::string()) +
            ", tp " + std::to_string(dims.tp) +
            (dims.tp > 1 ? std::string(tp.sequence_parallel ? ", sequence parallel" : "") +
                               (tp.loss_parallel ? ", loss parallel" : ", logits gathered for the loss")
                         : std::string()) +
            "); global batch " + std::to_string(global_batch) +
            " x " + std::to_string(seq_len) + " tokens, grad accumulation " + std::to_string(accum) + "; peak " +
            fmt("%.1f", peak / 1e9) + " GFLOP/s per rank (" + (peak_measured ? "measured by sgemm" : "datasheet") + "); device " +
            dev.name() + ", compute " + dtype_name(compute_dtype) + ", collectives on device tensors over " + dcomms.backend());
  log::info("layout:\n" + layout_report(layout));
  log::info("data: " + cfg.training.dataset + ", " + std::to_string(loader.num_samples()) + " train samples, " +
            std::to_string(val_loader.num_samples()) + " validation samples; validation unigram entropy " +
            fmt("%.4f", unigram) + " nats");

  TrainSummary summary;
  summary.unigram_entropy = unigram;
  std::vector<int32_t> samples(size_t(local_batch * (seq_len + 1)));
  const float grad_scale = float(1.0 / double(global_batch * seq_len));
  double timed_s = 0;
  int64_t timed_tokens = 0;
  std::array<int64_t, kNumMemCategories> run_peak{};  // per-category peaks over the whole run
  auto note_peaks = [&] {
    const MemoryStats m = dev.allocator()->stats();
    for (int c = 0; c < kNumMemCategories; ++c) run_peak[c] = std::max(run_peak[c], m.peak[c]);
  };
  // Bytes each mesh communicator has sent so far (per collective kind), for per-step deltas.
  auto comm_bytes_now = [&] {
    std::array<std::array<int64_t, int(CollectiveKind::kCount)>, kNumMeshDims> b{};
    for (int d = 0; d < kNumMeshDims; ++d) b[d] = dcomms.get(MeshDim(d)).bytes_sent();
    return b;
  };
  NonFiniteGuard guard(model, sync->local_shards(), cfg.training.skip_nonfinite_steps);
  std::vector<double> shard_terms;  // this rank's Σ g² per local shard, from the norm's own pass
  // [debug] fault injection: the chosen rank's loss gradient is NaN on the chosen steps, so every
  // gradient it computes is, before any reduction spreads it (as a faulty device would).
  const auto poisoned = [&](int64_t step) {
    const DebugSection& d = cfg.debug;
    return d.inject_nonfinite_grad_step >= 1 && world.rank() == d.inject_nonfinite_grad_rank &&
           step >= d.inject_nonfinite_grad_step && step < d.inject_nonfinite_grad_step + d.inject_nonfinite_grad_count;
  };
  if (cfg.debug.inject_nonfinite_grad_step >= 1 && cfg.debug.inject_nonfinite_grad_rank >= world.size())
    throw ConfigError(cfg.origin_of("debug.inject_nonfinite_grad_rank") + ": [debug] inject_nonfinite_grad_rank: " +
                      std::to_string(cfg.debug.inject_nonfinite_grad_rank) + " is not a rank of this world of " +
                      std::to_string(world.size()) + " (must be < world size)");
  const int64_t first_step = resumed.step + 1;
  for (int64_t step = first_step; step <= cfg.training.steps; ++step) {
    profiler->begin_step(step);
    std::optional<trace::Span> step_span(std::in_place, "step " + std::to_string(step), "step");
    const auto t0 = Clock::now();
    const auto bytes0 = comm_bytes_now();
    sync->take_comm_wait_seconds();  // waits outside the step (validation) are not the step's
    model.zero_grad();
    double loss_sum = 0;
    for (int64_t m = 0; m < accum; ++m) {
      loader.micro_batch(m, dp->rank(), dp->size(), local_batch, samples.data());
      const float scale = m + 1 == accum && poisoned(step) ? std::numeric_limits<float>::quiet_NaN() : grad_scale;
      StepContext ctx = model.make_context(samples.data(), local_batch, seq_len, scale, /*need_backward=*/true);
      sync->begin_micro_batch(m, accum);
      exec.forward_backward(ctx);
      loss_sum += ctx.loss_sum;
    }
    sync->finish_gradients();
    reduce_tp_partial_grads(dev, tp_comm, sync->local_shards());
    loader.advance(global_batch);
    loss_comm.all_reduce_host(&loss_sum, 1, ReduceOp::kSum);
    const double loss = loss_sum / double(global_batch * seq_len);
    const double norm = grad_norm(dev, *sync, &tp_comm, &shard_terms);
    // Nothing is applied before every rank agrees the step is finite (the same collective
    // carries the preemption flag); a non-finite step beyond skip_nonfinite_steps throws here.
    StepCheck check;
    try {
      check = guard.check(step, loss, norm, shard_terms, world, preemption_requested() ? preemption_signal() : 0);
    } catch (const NonFiniteError& e) {
      const auto last = cfg.checkpoint.enable ? checkpoint_to_load(ckpt_dir, -1) : std::nullopt;
      throw NonFiniteError(std::string(e.what()) + "; " +
                           (!cfg.checkpoint.enable ? std::string("[checkpoint] enable is false, so there is nothing to resume from")
                            : last ? "a rerun resumes from " + *last
                                   : std::string("no checkpoint was saved yet, so a rerun starts afresh")));
    }
    const bool applied = check.verdict == StepVerdict::kApply;
    const double lr = schedule.lr(step);
    if (applied) {
      trace::Span span("optimizer", "optimizer");
      clip_grad_norm(dev, sync->local_shards(), norm, cfg.training.max_norm);
      opt.step(float(lr));
      model.params_changed();  // bf16 compute copies are recast before their next use
      last_lr = lr;
    } else {
      if (rank0) log::warn(check.message);
      metrics.write({{"event", "nonfinite_step_skipped"}, {"step", step}, {"message", check.message},
                     {"skipped_in_a_row", guard.skipped_in_a_row()}});
    }
    sync->after_optimizer_step();
    dev.synchronize();
    step_span.reset();  // the step's work ends here; logging, validation and saving are traced apart
    const double dt = seconds_since(t0);
    const double comm_wait = sync->take_comm_wait_seconds();
    nlohmann::json step_bytes = nlohmann::json::object();
    {
      const auto bytes1 = comm_bytes_now();
      for (int d = 0; d < kNumMeshDims; ++d)
        for (int k = 0; k < int(CollectiveKind::kCount); ++k)
          if (bytes1[d][k] != bytes0[d][k]) step_bytes[mesh_dim_name(MeshDim(d))][collective_name(CollectiveKind(k))] = bytes1[d][k] - bytes0[d][k];
    }
    tokens_seen += global_batch * seq_len;
    if (step > first_step) timed_s += dt, timed_tokens += global_batch * seq_len;
    if (step == first_step) {  // start-up is over: collectives now get the (shorter) training deadline
      world.set_timeout(cfg.comm.train_timeout_seconds);
      comms.set_timeout(cfg.comm.train_timeout_seconds);
      dcomms.set_timeout(cfg.comm.train_timeout_seconds);
    }
    summary.steps = step;
    if (applied) summary.final_loss = loss;

    if (applied && (step == first_step || step % cfg.metrics.log_freq == 0 || step == cfg.training.steps)) {
      const Throughput tp = compute_throughput(global_batch * seq_len, dt, world.size(), flops_per_token, peak);
      const MemoryStats mem = dev.allocator()->stats();
      double peak_all = double(mem.total_peak);  // the largest rank's peak
      world.all_reduce_host(&peak_all, 1, ReduceOp::kMax);
      const double avg = step > first_step ? timed_s / double(step - first_step) : dt;
      const double eta = avg * double(cfg.training.steps - step);
      metrics.write({{"step", step}, {"loss", loss}, {"grad_norm", norm}, {"lr", lr}, {"tokens_per_s", tp.tokens_per_s},
                     {"tokens_per_s_per_rank", tp.tokens_per_s_per_rank}, {"tflops_per_rank", tp.tflops_per_rank},
                     {"mfu", tp.mfu}, {"step_time_s", dt}, {"comm_wait_s", comm_wait}, {"comm_bytes", step_bytes},
                     {"memory_peak_bytes", int64_t(peak_all)},
                     {"memory_reserved_bytes", mem.reserved_bytes}, {"eta_s", eta}});
      if (tensorboard)
        tensorboard->add_scalars(step, {{"loss", loss}, {"grad_norm", norm}, {"lr", lr}, {"tokens_per_s", tp.tokens_per_s},
                                        {"tokens_per_s_per_rank", tp.tokens_per_s_per_rank},
                                        {"tflops_per_rank", tp.tflops_per_rank}, {"mfu", tp.mfu}, {"step_time_s", dt},
                                        {"comm_wait_s", comm_wait}, {"memory_peak_bytes", peak_all}, {"eta_s", eta}});
      log::info("step " + std::to_string(step) + "/" + std::to_string(cfg.training.steps) + "  loss " +
                fmt("%.4f", loss) + "  grad_norm " + fmt("%.3f", norm) + "  lr " + fmt("%.2e", lr) + "  tok/s " +
                fmt("%.0f", tp.tokens_per_s) + " (" + fmt("%.0f", tp.tokens_per_s_per_rank) + "/rank)  TFLOPS/rank " +
                fmt("%.3f", tp.tflops_per_rank) + "  MFU " + fmt("%.1f%%", 100 * tp.mfu) + "  step " +
                fmt("%.3f s", dt) + " (comm wait " + fmt("%.3f s", comm_wait) + ")  mem " + human_bytes(peak_all) + "  eta " + fmt("%.0f s", eta));
      note_peaks();
      dev.allocator()->reset_peaks();
    }
    if (cfg.validation.enable && (step % cfg.validation.freq == 0 || step == cfg.training.steps)) {
      trace::Span span("validation", "validation");
      const double vl = validate_loss(dev, model, exec, *sync, val_loader, *dp, local_batch, global_batch, cfg.validation.steps);
      summary.final_val_loss = vl;
      metrics.write({{"step", step}, {"val_loss", vl}});
      if (tensorboard) tensorboard->add_scalars(step, {{"val_loss", vl}});
      log::info("validation step " + std::to_string(step) + "  val_loss " + fmt("%.4f", vl) + "  (unigram entropy " +
                fmt("%.4f", unigram) + ")");
    }
    const bool saved = cfg.checkpoint.enable && (step % cfg.checkpoint.interval == 0 || step == cfg.training.steps);
    if (saved) save(step);
    if (const std::string trace_file = profiler->end_step(step); !trace_file.empty() && rank0)
      log::info("profiling: step " + std::to_string(step) + " trace written to " + trace_file + " (one file per rank)");
    // Preemption: any rank's signal (agreed with the non-finite check) stops every rank here, at
    // the same step boundary.
    const int stop = check.preempt_signal;
    if (stop > 0 && step < cfg.training.steps) {
      if (cfg.checkpoint.enable && !saved) save(step);
      throw PreemptedError("preempted by signal " + std::to_string(stop) + " after step " + std::to_string(step) +
                           (cfg.checkpoint.enable ? "; checkpoint saved in " + ckpt_dir + ", a rerun resumes from it"
                                                  : "; [checkpoint] enable is false, so nothing was saved"));
    }
  }
  summary.elapsed_s = seconds_since(t_start);
  summary.tokens_per_s = timed_s > 0 ? double(timed_tokens) / timed_s : 0;
  note_peaks();
  if (cfg.job.final_dump) {
    // The final model goes through the sharded checkpoint writer (model only): every rank writes
    // the hyperslabs of its own shards, so the end of a 405B run needs no more memory than a
    // checkpoint save, where gathering every parameter on every rank would not fit.
    const auto t_final = Clock::now();
    dev.allocator()->reset_peaks();
    const std::string final_path = (out_dir / "model_final.h5").string(), tmp = final_path + ".tmp";
    world.barrier();  // rank 0 created out_dir at start-up
    const TrainState st{summary.steps, tokens_seen, loader.cursor(), opt.step_count(), last_lr, cfg.training.seed};
    CheckpointMeta meta{resolved_deck_toml(cfg), layout_summary(dims), int64_t(world.size()), seq_len, /*model_only=*/true};
    save_checkpoint(tmp, world.comm(), dev, model, sync->local_shards(), opt, st,
                    CheckpointRole{dp_replicate.rank() == 0, tp_comm.rank() == 0}, meta);
    std::string error;
    if (rank0) try {
        publish_file(tmp, final_path);
      } catch (const CheckpointError& e) {
        error = e.what();
      }
    double failed = error.empty() ? 0 : 1;
    world.all_reduce_host(&failed, 1, ReduceOp::kMax);
    if (failed) throw CheckpointError(rank0 ? error : final_path + ": publishing the final model failed on rank 0");
    double final_peak = double(dev.allocator()->stats().total_peak);  // the largest rank's
    world.all_reduce_host(&final_peak, 1, ReduceOp::kMax);
    const int64_t bytes = rank0 ? int64_t(std::filesystem::file_size(final_path)) : 0;
    metrics.write({{"event", "final_model_save"}, {"bytes", bytes}, {"seconds", seconds_since(t_final)},
                   {"memory_peak_bytes", int64_t(final_peak)}});
    log::info("final model: " + final_path + " (" + human_bytes(double(bytes)) + ", sharded writer, model only; memory peak " +
              human_bytes(final_peak) + " per rank)");
  }
  // Per-category peaks of the largest rank (shards are uneven when shapes do not divide).
  std::array<double, kNumMemCategories> peaks{};
  for (int c = 0; c < kNumMemCategories; ++c) peaks[c] = double(run_peak[c]);
  world.all_reduce_host(peaks.data(), kNumMemCategories, ReduceOp::kMax);
  nlohmann::json by_cat;
  std::string breakdown;
  for (int c = 0; c < kNumMemCategories; ++c) {
    by_cat[mem_category_name(MemCategory(c))] = int64_t(peaks[c]);
    breakdown += std::string(c ? ", " : "") + mem_category_name(MemCategory(c)) + " " + human_bytes(peaks[c]);
  }
  metrics.write({{"event", "summary"}, {"steps", summary.steps}, {"final_loss", summary.final_loss},
                 {"final_val_loss", summary.final_val_loss}, {"unigram_entropy", unigram},
                 {"elapsed_s", summary.elapsed_s}, {"tokens_per_s", summary.tokens_per_s},
                 {"tokens", int64_t(summary.steps * global_batch * seq_len)}, {"world_size", world.size()},
                 {"parameters", args.num_params()}, {"dp_replicate", dims.dp_replicate}, {"dp_shard", dims.dp_shard}, {"tp", dims.tp},
                 {"zero_stage", zero_stage}, {"memory_peak_bytes_by_category", by_cat},
                 {"nonfinite_steps_skipped", guard.skipped_total()}});
  log::info("summary: " + std::to_string(summary.steps) + " steps in " + fmt("%.1f s", summary.elapsed_s) +
            ", final loss " + fmt("%.4f", summary.final_loss) +
            (summary.final_val_loss >= 0 ? ", final val_loss " + fmt("%.4f", summary.final_val_loss) : std::string()) +
            ", validation unigram entropy " + fmt("%.4f", unigram) + " nats" +
            (summary.final_val_loss >= 0 ? " (val_loss is " + fmt("%.3f", unigram - summary.final_val_loss) +
                                               " nats below it)"
                                         : std::string()) +
            ", " + fmt("%.0f", summary.tokens_per_s) + " tokens/s; outputs in " + out_dir.string());
  log::info("memory peaks per rank (largest rank, by category): " + breakdown);
  return summary;
}

}  // namespace meshtrain
