#include "train/trainer.hpp"

#include "train/moe_balance.hpp"

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
#include "checkpoint/safetensors_export.hpp"
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
#include "model/float8_linears.hpp"
#include "train/nvtx_step_range.hpp"
#include "model/layers/embedding.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"
#include "optim/muon.hpp"
#include "optim/lr_schedule.hpp"
#include "parallel/composed_sync.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "parallel/mixed_precision.hpp"
#include "parallel/tp_grads.hpp"
#include "plan/planner.hpp"
#include "train/device_comms.hpp"
#include "train/initial_load.hpp"
#include "train/nonfinite_guard.hpp"
#include "train/pipeline_runtime.hpp"
#include "train/preemption.hpp"
#include "train/stage_parts.hpp"
#include "util/errors.hpp"
#include "util/log.hpp"
#include "util/trace.hpp"

namespace meshtrain {

namespace {

// How MFU is counted under float8 training (TorchTitan reports none for its FP8 runs).
const std::string kFloat8MfuConvention =
    "MFU under float8 counts bf16-equivalent FLOPs: the model's FLOPs as for a bf16 run (FP8 GEMMs counted like "
    "bf16 ones), over the device's bf16 peak (float32 on the cpu device), so tflops_per_rank is bf16-equivalent "
    "TFLOPS and an FP8 run's MFU can pass what its bf16 peak allows.";

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
double validate_loss(StepSchedule& schedule, GradientSync& sync, const DataLoader& val, Communicator& dp,
                     Communicator& loss, Communicator& pp, bool pipelined, int64_t local_batch, int64_t global_batch, int64_t max_steps) {
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
      // that gathers parameters; it runs one sample it does not count. (Every stage of a
      // pipeline shares its dp rank, so a whole pipeline skips or runs together.)
      if (sync.forward_is_collective()) {
        samples.resize(size_t(t + 1));
        val.fetch(0, 1, samples.data());
        schedule.evaluate(samples.data(), 1);
      }
      continue;
    }
    samples.resize(size_t(n * (t + 1)));
    val.fetch(first, n, samples.data());
    const EvalSums e = schedule.evaluate(samples.data(), n);
    sums[0] += e.loss_sum;
    sums[1] += double(e.targets);
  }
  loss.all_reduce_host(sums, 2, ReduceOp::kSum);  // dp × cp: each cp rank holds part of every sample
  if (pipelined) pp.all_reduce_host(sums, 2, ReduceOp::kSum);  // the last stage holds the loss
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

}  // namespace

void check_dataset(const JobConfig& cfg, const TokenStore& store) {
  const ModelArgs args = cfg.model_args();
  if (store.vocab_size() > args.vocab_size)
    throw ConfigError(cfg.origin_of("model.vocab_size") + ": [model] vocab_size: " + std::to_string(args.vocab_size) +
                      " is smaller than the vocabulary of " + cfg.training.dataset + " (" +
                      std::to_string(store.vocab_size()) + "); token ids must be < vocab_size");
  if (args.attn_mask_type == "block_causal" && store.eos_id() < 0)
    throw ConfigError(cfg.origin_of("model.attn_mask_type") + ": [model] attn_mask_type: \"block_causal\" finds "
                      "documents by their EOS token, but " + cfg.training.dataset +
                      " has no eos_id attribute (write it again with `meshtrain data prepare`)");
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

namespace {

// The world's deadline applies from the communicator splits on (they are its first collectives).
const MpiCommunicator& with_timeout(MpiCommunicator& world, double seconds) {
  world.set_timeout(seconds);
  return world;
}

}  // namespace

Trainer::Trainer(const JobConfig& cfg, const ParallelDims& dims, const TokenStore& store, const RankLayout& layout,
                 MpiCommunicator& world)
    : cfg_(cfg),
      dims_(dims),
      layout_(layout),
      world_(world),
      rank0_(world.rank() == 0),
      t_start_(Clock::now()),
      args_(cfg.model_args()),
      local_batch_(cfg.training.local_batch_size),
      seq_len_(cfg.training.seq_len),
      global_batch_(cfg.global_batch(dims)),
      accum_(cfg.grad_accum_steps(dims)),
      loader_(store.split("train"), seq_len_, uint64_t(cfg.training.seed)),
      val_loader_(store.split("validation"), seq_len_, uint64_t(cfg.training.seed), /*shuffle=*/false),
      unigram_(unigram_entropy(store.split("validation"), store.vocab_size())),
      comms_(with_timeout(world, cfg.comm.init_timeout_seconds), layout) {
  comms_.set_timeout(cfg.comm.init_timeout_seconds);
  // One GPU per rank: the node-local rank picks it (modulo the visible GPUs, so several ranks
  // may share one GPU in tests; collectives then go through MPI, see DeviceComms).
  device_ = make_device(cfg.training.device, 0, int(layout.place(world.rank()).local_rank));
  if (cfg.training.memory_limit_gib > 0)
    device_->allocator()->set_limit(int64_t(cfg.training.memory_limit_gib * 1073741824.0),
                                    "[training] memory_limit_gib = " + fmt("%g", cfg.training.memory_limit_gib));
  dcomms_ = std::make_unique<DeviceComms>(comms_, *device_, world, layout, cfg.comm.init_timeout_seconds);
  pc_ = make_parallel_context(world_, comms_, *dcomms_);
  peak_flops_ = device_->peak_flops(&peak_measured_);
  log_prediction();
  build_model();
  if (args_.attn_mask_type == "block_causal") {
    check_dataset(cfg_, store);  // throws when the store does not name its EOS token
    model_->set_document_mask_eos(int32_t(store.eos_id()));
  }
  resume();
  open_outputs();
  log_start();
  // Asynchronous checkpoints: the writers' own communicator, duplicated while every rank is here.
  const CheckpointSection& ck = cfg.checkpoint;
  if (ck.enable && ck.async_mode != "disabled")
    async_ckpt_ = std::make_unique<AsyncCheckpointer>(world.comm(), ckpt_dir_, ck.keep_latest_k,
                                                      cfg.origin_of("checkpoint.async_mode"), ck.async_mode);
}

Trainer::~Trainer() = default;

void Trainer::build_model() {
  Device& dev = *device_;
  // dp_shard > 1 shards over the fsdp group (ZeRO-1/2/3, HSDP with dp_replicate > 1); else DDP.
  sharded_ = pc_.fsdp->size() > 1;
  zero_stage_ = sharded_ ? int(cfg_.parallelism.zero_stage) : 0;
  // Tensor parallelism inside the node (tp innermost in the layout); the data-parallel
  // strategies below then shard or replicate the tp-local tensors (2-D parallelism).
  tp_.comm = pc_.tp;
  tp_.size = pc_.tp->size();
  tp_.rank = pc_.tp->rank();
  tp_.sequence_parallel = cfg_.parallelism.enable_sequence_parallel;
  tp_.loss_parallel = !cfg_.parallelism.disable_loss_parallel;
  tp_.async = cfg_.parallelism.enable_async_tensor_parallel;
  // Context parallelism: each sample's sequence is split over the cp group; parameters are
  // sharded over fsdp = dp_shard × cp, so sharded_ above is on whenever cp > 1.
  cp_.comm = pc_.cp;
  cp_.size = pc_.cp->size();
  cp_.rank = pc_.cp->rank();
  cp_.rotate = cp_rotate_from_name(cfg_.parallelism.context_parallel_rotate_method);
  cp_.balancer = cp_balancer_from_name(cfg_.parallelism.context_parallel_load_balancer);
  cp_.stats = &cp_stats_;
  // Mixed precision: bf16 activations and compute copies of the weights; f32 masters, grads, AdamW.
  compute_dtype_ = cfg_.training.mixed_precision_param == "bfloat16" ? DType::kBF16 : DType::kF32;
  const DType reduce_dtype = cfg_.training.mixed_precision_reduce == "bfloat16" ? DType::kBF16 : DType::kF32;
  // Pipeline parallelism: this rank builds only its stages (TorchTitan's split, loop or V
  // placement), with global layer indices so names and initial values are the whole model's.
  pipelined_ = dims_.pp > 1;
  ModelPart part = ModelPart::whole(args_);
  if (pipelined_) {
    plan_ = cfg_.pipeline_plan(dims_);
    part = model_part_of(plan_.stages, plan_.schedule.stages_of(pc_.pp->rank()));
  }
  ExpertParallel ep;
  if (dims_.ep > 1) ep = ExpertParallel{pc_.ep, pc_.ep->size(), pc_.ep->rank()};
  model_ = std::make_unique<Transformer>(args_, dev, sharded_ ? model_storage_for(zero_stage_) : ModelStorage{}, tp_,
                                         compute_dtype_, &part, ep);
  model_->set_context_parallel(cp_);
  model_->set_moe_force_load_balance(cfg_.debug.moe_force_load_balance);
  if (const Float8Config f8 = float8_config(cfg_); f8.enabled) {
    const std::vector<std::string> converted = convert_float8_linears(*model_, f8);
    if (rank0_)
      log::info("float8: recipe " + f8.recipe +
                (f8.emulate ? ", emulated (quantize -> dequantize, high-precision GEMMs) in "
                            : ", FP8 GEMMs (e4m3 / e5m2 operands, fp32 accumulation) in ") +
                std::to_string(converted.size()) + " linear layers of this rank's model" +
                (converted.empty() ? "" : " (" + converted.front() + " ... " + converted.back() + ")") +
                "; the output head, embedding and routed experts stay in high precision. " + kFloat8MfuConvention);
  }
  if (sharded_) {
    ShardedOptions so;
    so.zero_stage = zero_stage_;
    // TorchTitan's "default": reshard after forward unless pipeline parallel (a stage's
    // backward of a micro-batch comes after other micro-batches' forwards).
    const std::string& raf = cfg_.parallelism.fsdp_reshard_after_forward;
    so.reshard_after_forward = raf == "always" || (raf == "default" && !pipelined_);
    so.reduce_once_per_step = pipelined_;
    so.reduce_dtype = reduce_dtype;
    so.param_dtype = compute_dtype_;  // FSDP2's param_dtype: ZeRO-3 gathers bf16 under mixed precision
    if (const Float8Config f8 = float8_config(cfg_); f8.enabled) so.float8_all_gather = f8.fsdp_float8_all_gather;
    if (dims_.ep > 1) {
      // The routed experts are sharded over the ranks holding the same experts (efsdp), the
      // rest over fsdp; the experts' norm is summed over ep as well (their ranks hold different
      // experts).
      ShardedOptions dense = so, experts = so;
      dense.select = [](const Parameter& p) { return !p.sharding.expert_parallel(); };
      experts.select = [](const Parameter& p) { return p.sharding.expert_parallel(); };
      experts.norm_group = pc_.ep;
      experts.replicate_at_finish = true;  // HSDP: after the dense instance's all-reduces, never between
      std::vector<std::unique_ptr<GradientSync>> parts;
      for (auto [opt, comm] : {std::pair{&dense, pc_.fsdp}, std::pair{&experts, pc_.efsdp}}) {
        auto sdp = std::make_unique<ShardedDataParallel>(*model_, dev, *comm, pc_.dp_replicate, *opt);
        init_weights_.push_back([s = sdp.get(), seed = uint64_t(cfg_.training.seed)] { s->init_weights(seed); });
        parts.push_back(std::move(sdp));
      }
      sync_ = std::make_unique<ComposedGradientSync>(std::move(parts));
    } else {
      auto sdp = std::make_unique<ShardedDataParallel>(*model_, dev, *pc_.fsdp, pc_.dp_replicate, so);
      init_weights_.push_back([s = sdp.get(), seed = uint64_t(cfg_.training.seed)] { s->init_weights(seed); });
      sync_ = std::move(sdp);
    }
  } else {
    init_weights_.push_back([m = model_.get(), seed = uint64_t(cfg_.training.seed)] { m->init_weights(seed); });
    sync_ = std::make_unique<DataParallel>(*model_, *pc_.dp_replicate, 25 << 20, reduce_dtype);
  }
  const CheckpointPolicy ac =
      CheckpointPolicy::from_deck(cfg_.activation_checkpoint.mode, cfg_.activation_checkpoint.selective_ac_option);
  hooks_ = std::make_unique<MixedPrecisionHooks>(*model_, sync_.get());
  std::vector<PipelineStage> stages;
  if (pipelined_) {  // one executor per stage of this rank, over its units
    for (int s : plan_.schedule.stages_of(pc_.pp->rank())) {
      const auto [first, last] = stage_unit_range(*model_, plan_.stages[size_t(s)]);
      execs_.push_back(std::make_unique<Executor>(model_->units(), model_->block_index(), ac, first, last));
      stages.push_back({s, execs_.back().get()});
    }
  } else {
    execs_.push_back(std::make_unique<Executor>(model_->units(), model_->block_index(), ac));
  }
  for (auto& e : execs_) e->set_hooks(hooks_.get());
  if (cfg_.optimizer.name == "Muon") {
    // Muon gathers each matrix from the ranks holding its rows: the sharding group of the
    // strategy that holds the parameter (efsdp for routed experts, fsdp for the rest), none
    // when parameters are replicated (DDP).
    MuonComms mc;
    if (sharded_) {
      Communicator* fsdp = pc_.fsdp;
      Communicator* efsdp = dims_.ep > 1 ? pc_.efsdp : pc_.fsdp;
      mc.shard_group = [fsdp, efsdp](const Parameter& p) { return p.sharding.expert_parallel() ? efsdp : fsdp; };
    }
    mc.tp = pc_.tp;
    opt_ = std::make_unique<Muon>(sync_->local_shards(), dev, cfg_.optimizer, mc);
  } else {
    opt_ = std::make_unique<AdamW>(sync_->local_shards(), dev, cfg_.optimizer);
  }
  {
    // A shard that is its whole parameter (replicated: DDP, tp, one rank) can have its bf16
    // compute copy written by the optimizer's own pass; sharded values are gathered instead.
    const std::vector<LocalShard>& shards = sync_->local_shards();
    std::vector<Tensor> copies(shards.size());
    std::vector<Parameter*> written;
    for (size_t i = 0; i < shards.size(); ++i) {
      const LocalShard& s = shards[i];
      const bool whole = s.first_elem == 0 && s.param->value.defined() && s.value.raw() == s.param->value.raw() &&
                         s.value.numel() == s.param->value.numel();
      if (whole) copies[i] = model_->held_compute_copy(*s.param);
      if (copies[i].defined()) written.push_back(s.param);
    }
    if (!written.empty() && opt_->write_compute_copies(copies)) optimizer_written_copies_ = std::move(written);
  }
  lr_schedule_ = std::make_unique<LrSchedule>(cfg_.lr_scheduler, cfg_.optimizer.lr, cfg_.training.steps);
  guard_ = std::make_unique<NonFiniteGuard>(*model_, sync_->local_shards(), cfg_.training.skip_nonfinite_steps);

  // [debug] fault injection: the chosen rank's loss gradient is NaN on the chosen steps, so every
  // gradient it computes is, before any reduction spreads it (as a faulty device would).
  const DebugSection& d = cfg_.debug;
  if (d.inject_nonfinite_grad_step >= 1 && d.inject_nonfinite_grad_rank >= world_.size())
    throw ConfigError(cfg_.origin_of("debug.inject_nonfinite_grad_rank") + ": [debug] inject_nonfinite_grad_rank: " +
                      std::to_string(d.inject_nonfinite_grad_rank) + " is not a rank of this world of " +
                      std::to_string(world_.size()) + " (must be < world size)");
  const bool injecting = d.inject_nonfinite_grad_step >= 1 && world_.rank() == d.inject_nonfinite_grad_rank;
  const int64_t first = d.inject_nonfinite_grad_step, count = d.inject_nonfinite_grad_count;
  auto poisoned = [injecting, first, count](int64_t step) { return injecting && step >= first && step < first + count; };
  const float loss_grad_scale = float(1.0 / double(global_batch_ * seq_len_));
  if (pipelined_)
    schedule_ = std::make_unique<PipelineRuntime>(*model_, stages, plan_.schedule, *sync_, loader_, pc_, *pc_.pp_device,
                                                  local_batch_, plan_.microbatch_size, seq_len_, accum_, loss_grad_scale,
                                                  poisoned);
  else
    schedule_ = std::make_unique<AccumulationSchedule>(*model_, *execs_.front(), *sync_, loader_, pc_, local_batch_,
                                                       seq_len_, accum_, loss_grad_scale, poisoned);
}

void Trainer::resume() {
  out_dir_ = cfg_.dump_folder();
  // Resume: the checkpoint `latest` names (or load_step's) is read into this layout's shards,
  // whatever layout wrote it (every rank reads the hyperslabs it now owns).
  ckpt_dir_ = (out_dir_ / cfg_.checkpoint.folder).string();  // an absolute folder wins
  // The load's time starts once every rank is here, so that checkpoint_load's seconds are the
  // load's own, not the lag of the slowest rank's set-up (on a shared core).
  world_.barrier();
  const auto t_load = Clock::now();
  std::optional<std::string> from;
  if (cfg_.checkpoint.enable)
    from = load_with_fallback(cfg_.checkpoint, ckpt_dir_, [&](const std::string& f) {
      resumed_ = load_checkpoint(f, world_.comm(), *device_, *model_, sync_->local_shards(), *opt_);
      restore_expert_biases(args_, model_->moe_layers(), resumed_.expert_bias);
      model_->params_changed();
    });
  if (!from) {
    for (const auto& init : init_weights_) init();
    model_->params_changed();
    // Nothing of this run's own yet: [checkpoint] initial_load_path, if set, is where it starts.
    const auto init = load_initial_checkpoint(cfg_, world_.comm(), *device_, *model_, sync_->local_shards(), *opt_);
    if (!init) return;
    if (!init->full_state) {
      const double seconds = seconds_since(t_load);
      load_event_ = {{"event", "checkpoint_load"}, {"initial", true},        {"format", init->format},
                     {"path", init->path},         {"bytes", init->bytes},   {"seconds", seconds}};
      log::info("initial weights from " + init->path + " (" +
                (init->format == "huggingface" ? "Hugging Face, " + std::to_string(init->tensors) + " tensors, config.json checked"
                                               : std::string("meshtrain checkpoint, parameters only, checksums verified")) +
                "; " + human_bytes(double(init->bytes)) + " read in " + fmt("%.2f s", seconds) +
                "); optimizer, step and data cursor start afresh");
      return;
    }
    resumed_ = init->state;
    from = init->path;
  }
  if (resumed_.seed != cfg_.training.seed)  // the remaining sample order would change
    throw CheckpointError(*from + ": written with [training] seed " + std::to_string(resumed_.seed) + ", the deck has " +
                          std::to_string(cfg_.training.seed) + "; resuming would reorder the remaining samples (set seed = " +
                          std::to_string(resumed_.seed) + ")");
  loader_.set_cursor(resumed_.loader_cursor);
  const int64_t bytes = int64_t(std::filesystem::file_size(*from));
  const double seconds = seconds_since(t_load);
  load_event_ = {{"event", "checkpoint_load"}, {"step", resumed_.step}, {"bytes", bytes}, {"seconds", seconds}};
  log::info("resumed from " + *from + ": step " + std::to_string(resumed_.step) + ", " +
            std::to_string(resumed_.tokens_seen) + " tokens seen, loader cursor " +
            std::to_string(resumed_.loader_cursor) + " (" + human_bytes(double(bytes)) + " in " +
            fmt("%.2f s", seconds) + ", checksums verified)");
}

void Trainer::open_outputs() {
  if (rank0_) {
    std::filesystem::create_directories(out_dir_);
    std::ofstream(out_dir_ / "deck.resolved.toml") << resolved_deck_toml(cfg_);
    // Where every rank ran and its mesh coordinates: the placement this run used, for comparing
    // with `meshtrain layout --topology` and for finding a failed node's ranks afterwards.
    std::ofstream(out_dir_ / "layout.csv") << layout_csv(layout_);
  }
  metrics_ = std::make_unique<MetricsWriter>((out_dir_ / "metrics.jsonl").string(), rank0_, /*append=*/resumed_.step > 0);
  if (!load_event_.is_null()) metrics_->write(load_event_);
  if (const Float8Config f8 = float8_config(cfg_); f8.enabled)
    metrics_->write({{"event", "float8"}, {"recipe", f8.recipe}, {"emulate", f8.emulate},
                     {"mfu_flops", "bf16_equivalent"}, {"message", kFloat8MfuConvention}});
  // [profiling]: Chrome traces of the executor's units and the collectives, every profile_freq
  // steps; [metrics] enable_tensorboard: the log line's scalars as TensorBoard events.
  const ProfilingSection& pc = cfg_.profiling;
  try {
    profiler_ = std::make_unique<StepProfiler>(
        ProfilingOptions{pc.enable_profiling, (out_dir_ / pc.save_traces_folder).string(), pc.profile_freq,
                         pc.profiler_warmup, pc.profiler_active},
        world_.rank());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(cfg_.origin_of("profiling.profiler_active") + ": " + e.what());
  }
  if (cfg_.metrics.enable_tensorboard && (rank0_ || cfg_.metrics.save_for_all_ranks)) {
    std::filesystem::path tb_dir = out_dir_ / cfg_.metrics.save_tb_folder;
    if (cfg_.metrics.save_for_all_ranks) tb_dir /= "rank_" + std::to_string(world_.rank());
    tensorboard_ = std::make_unique<TensorBoardWriter>(tb_dir.string(), world_.rank());
    log::info("tensorboard: " + tensorboard_->path());
  }
  tokens_seen_ = resumed_.tokens_seen;
  first_step_ = resumed_.step + 1;
  summary_.unigram_entropy = unigram_;
}

void Trainer::log_prediction() {
  // The hardware is checked on every rank (a wrong key stops all of them the same way); the
  // prediction is rank 0's to print.
  const std::string& key = cfg_.training.hardware;
  HardwareSpec hw;
  try {
    hw = find_hardware(!key.empty() ? key : cfg_.training.device == "cpu" ? "cpu" : "h100_sxm");
  } catch (const ConfigError& e) {
    throw ConfigError(cfg_.origin_of("training.hardware") + ": [training] hardware: " + e.what());
  }
  if (!rank0_) return;
  PlanCandidate c;
  try {
    c = predict_deck(cfg_, world_.size(), hw);
  } catch (const std::exception& e) {
    log::info("plan: no prediction for this layout (" + std::string(e.what()) + ")");
    return;
  }
  log::info("plan: predicted on " + hw.name + " per rank: " + describe_memory(c.memory) + "; step " +
            fmt("%.3g s", c.time.step_s) + " (compute " + fmt("%.3g", c.time.compute_s) + ", exposed communication " +
            fmt("%.3g", c.time.exposed_comm_s) + ", bubble " + fmt("%.3g", c.time.bubble_s) + "), " +
            fmt("%.0f", c.time.tokens_per_s_per_device) + " tokens/s per rank, MFU " + fmt("%.1f%%", 100 * c.time.mfu) +
            " (meshtrain plan --deck ... explains; [training] hardware picks the catalog entry)");
  const double limit = cfg_.training.memory_limit_gib > 0 ? cfg_.training.memory_limit_gib * 1073741824.0
                                                          : hw.memory_bytes * (1 - hw.fragmentation);
  if (double(c.memory.total) > limit)
    log::warn("plan: the predicted peak of " + human_bytes(double(c.memory.total)) + " per rank exceeds " +
              human_bytes(limit) + (cfg_.training.memory_limit_gib > 0 ? " ([training] memory_limit_gib)"
                                                                      : " (" + hw.name + " less its fragmentation margin)") +
              "; `meshtrain plan --deck " + (cfg_.deck_path.empty() ? std::string("DECK") : cfg_.deck_path) + " --gpus " +
              std::to_string(world_.size()) + "` lists layouts that fit");
}

void Trainer::log_start() {
  const double flops_per_token = args_.flops_per_token(seq_len_);
  log::info("meshtrain: " + args_.name + " " + args_.flavor + ", " + std::to_string(args_.num_params()) +
            " parameters, " + fmt("%.3g", flops_per_token) + " FLOPs/token; world " + std::to_string(world_.size()) +
            " (dp_replicate " + std::to_string(dims_.dp_replicate) + ", dp_shard " + std::to_string(dims_.dp_shard) +
            (sharded_ ? (zero_stage_ == 3 ? ", FSDP" : ", ZeRO-" + std::to_string(zero_stage_)) : std::string()) +
            ", tp " + std::to_string(dims_.tp) +
            (dims_.tp > 1 ? std::string(tp_.sequence_parallel ? ", sequence parallel" : "") +
                                (tp_.loss_parallel ? ", loss parallel" : ", logits gathered for the loss")
                          : std::string()) +
            "); global batch " + std::to_string(global_batch_) + " x " + std::to_string(seq_len_) +
            " tokens, grad accumulation " + std::to_string(accum_) + "; peak " + fmt("%.1f", peak_flops_ / 1e9) +
            " GFLOP/s per rank (" + (peak_measured_ ? "measured by sgemm" : "datasheet") + "); device " +
            device_->name() + ", compute " + dtype_name(compute_dtype_) + ", collectives on device tensors over " +
            dcomms_->backend());
  log::info("layout:\n" + layout_report(layout_));
  if (pipelined_) {
    std::string stages = describe_stage_placement(plan_);
    if (!stages.empty()) stages.pop_back();  // the log adds its own line end
    log::info("pipeline: " + schedule_->describe() + "; " + std::to_string(plan_.schedule.num_stages()) +
              " stages\n" + stages);
  }
  log::info("data: " + cfg_.training.dataset + ", " + std::to_string(loader_.num_samples()) + " train samples, " +
            std::to_string(val_loader_.num_samples()) + " validation samples; validation unigram entropy " +
            fmt("%.4f", unigram_) + " nats");
  if (model_->document_mask_eos() >= 0)
    log::info("attention: block_causal (each token attends to its own document; documents end with token " +
              std::to_string(model_->document_mask_eos()) +
              ", the store's eos_id); FLOPs/token and MFU count attention over the whole sample, as TorchTitan");
}

void Trainer::note_peaks() {
  const MemoryStats m = device_->allocator()->stats();
  for (int c = 0; c < kNumMemCategories; ++c) run_peak_[c] = std::max(run_peak_[c], m.peak[c]);
}

StepResult Trainer::train_step(int64_t step) {
  Device& dev = *device_;
  GradientSync& sync = *sync_;
  std::optional<trace::Span> step_span(std::in_place, "step " + std::to_string(step), "step");
  std::optional<NvtxStepRange> nvtx_step(std::in_place, "step " + std::to_string(step));
  const auto t0 = Clock::now();
  // Bytes each mesh communicator has sent so far (per collective kind), for the step's deltas.
  auto comm_bytes_now = [&] {
    std::array<std::array<int64_t, int(CollectiveKind::kCount)>, kNumMeshDims> b{};
    for (int d = 0; d < kNumMeshDims; ++d) b[d] = dcomms_->get(MeshDim(d)).bytes_sent();
    return b;
  };
  const auto bytes0 = comm_bytes_now();
  sync.take_comm_wait_seconds();  // waits outside the step (validation) are not the step's
  if (pipelined_) static_cast<PipelineRuntime&>(*schedule_).take_recv_wait_seconds();
  cp_stats_ = {};
  model_->zero_grad();
  OutputHead* head = model_->units().empty() ? nullptr : dynamic_cast<OutputHead*>(model_->units().back());
  if (head) head->reset_z_loss_sum();  // validation forwards add to it too
  double sums[2] = {schedule_->run(step), 0.0};  // Σ CE, Σ ζ·log²Z (only the last stage's are non-zero)
  if (head) sums[1] = head->z_loss_sum();
  sync.finish_gradients();
  reduce_tp_partial_grads(dev, *pc_.tp, sync.local_shards());
  if (pipelined_)  // the tied embedding's two copies get the same gradient (before the norm)
    sum_tied_embedding_grads(dev, *model_, sync.local_shards(), *pc_.pp_device, plan_.schedule.rank_of(0),
                             plan_.schedule.rank_of(plan_.schedule.num_stages() - 1));
  loader_.advance(global_batch_);
  pc_.loss->all_reduce_host(sums, 2, ReduceOp::kSum);
  if (pipelined_) pc_.pp->all_reduce_host(sums, 2, ReduceOp::kSum);  // only the last stage's are non-zero
  StepResult r;
  r.loss = sums[0] / double(global_batch_ * seq_len_);
  r.z_loss = sums[1] / double(global_batch_ * seq_len_);
  r.grad_norm = grad_norm(dev, sync, pc_.tp, &shard_terms_, pipelined_ ? pc_.pp : nullptr);
  // Nothing is applied before every rank agrees the step is finite (the same collective
  // carries the preemption flag); a non-finite step beyond skip_nonfinite_steps throws here.
  StepCheck check;
  try {
    check = guard_->check(step, r.loss, r.grad_norm, shard_terms_, world_, preemption_requested() ? preemption_signal() : 0);
  } catch (const NonFiniteError& e) {
    // A background write still in flight settles `latest` first (its failure, if any, is
    // reported; the non-finite step is what stops the run).
    if (async_ckpt_)
      if (const auto w = async_ckpt_->wait()) report_async_save(*w);
    const auto last = cfg_.checkpoint.enable ? checkpoint_to_load(ckpt_dir_, -1) : std::nullopt;
    throw NonFiniteError(std::string(e.what()) + "; " +
                         (!cfg_.checkpoint.enable ? std::string("[checkpoint] enable is false, so there is nothing to resume from")
                          : last ? "a rerun resumes from " + *last
                                 : std::string("no checkpoint was saved yet, so a rerun starts afresh")));
  }
  r.applied = check.verdict == StepVerdict::kApply;
  r.preempt_signal = check.preempt_signal;
  r.lr = lr_schedule_->lr(step);
  if (r.applied) {
    trace::Span span("optimizer", "optimizer");
    opt_->step(float(r.lr), float(clip_coefficient(r.grad_norm, cfg_.training.max_norm)));
    model_->params_changed();  // bf16 compute copies are recast before their next use ...
    model_->compute_written(optimizer_written_copies_);  // ... except those the step wrote
    last_lr_ = r.lr;
  } else {
    if (rank0_) log::warn(check.message);
    metrics_->write({{"event", "nonfinite_step_skipped"}, {"step", step}, {"message", check.message},
                     {"skipped_in_a_row", guard_->skipped_in_a_row()}});
  }
  if (args_.num_moe_layers() > 0) {
    // Loads over every rank; the expert biases move only when the step was applied.
    moe_metrics_ = finish_moe_step(args_, model_->moe_layers(), world_, r.applied);
    r.moe_aux_loss = moe_metrics_.aux_loss;
    r.moe_z_loss = moe_metrics_.z_loss;
    r.loss += r.moe_aux_loss + r.moe_z_loss;
  }
  sync.after_optimizer_step();
  dev.synchronize();
  step_span.reset();  // the step's work ends here; logging, validation and saving are traced apart
  nvtx_step.reset();
  r.seconds = seconds_since(t0);
  r.comm_bytes = nlohmann::json::object();
  const auto bytes1 = comm_bytes_now();
  for (int d = 0; d < kNumMeshDims; ++d)
    for (int k = 0; k < int(CollectiveKind::kCount); ++k)
      if (bytes1[d][k] != bytes0[d][k])
        r.comm_bytes[mesh_dim_name(MeshDim(d))][collective_name(CollectiveKind(k))] = bytes1[d][k] - bytes0[d][k];
  return r;
}

void Trainer::log_step(int64_t step, const StepResult& r) {
  const double dt = r.seconds;
  const double comm_wait = sync_->take_comm_wait_seconds();
  const Throughput tp =
      compute_throughput(global_batch_ * seq_len_, dt, world_.size(), args_.flops_per_token(seq_len_), peak_flops_);
  const MemoryStats mem = device_->allocator()->stats();
  double peak_all = double(mem.total_peak);  // the largest rank's peak
  world_.all_reduce_host(&peak_all, 1, ReduceOp::kMax);
  // Stages differ: the largest peak of each pp rank (its stages' activations in flight).
  // [0, pp): the largest memory peak per pp rank; [pp, 2·pp): the longest receive wait (s);
  // [2·pp, 3·pp): the largest peak of the activations category (saved tensors, messages).
  std::vector<double> per_stage(size_t(3 * dims_.pp), 0.0);
  if (pipelined_) {
    const size_t me = size_t(pc_.pp->rank()), pp = size_t(dims_.pp);
    per_stage[me] = double(mem.total_peak);
    per_stage[pp + me] = static_cast<PipelineRuntime&>(*schedule_).take_recv_wait_seconds();
    per_stage[2 * pp + me] = double(mem.peak[size_t(MemCategory::kActivations)]);
    world_.all_reduce_host(per_stage.data(), int(per_stage.size()), ReduceOp::kMax);
  }
  const double avg = step > first_step_ ? timed_s_ / double(step - first_step_) : dt;
  const double eta = avg * double(cfg_.training.steps - step);
  metrics_->write({{"step", step}, {"loss", r.loss}, {"grad_norm", r.grad_norm}, {"lr", r.lr},
                   {"tokens_per_s", tp.tokens_per_s}, {"tokens_per_s_per_rank", tp.tokens_per_s_per_rank},
                   {"tflops_per_rank", tp.tflops_per_rank}, {"mfu", tp.mfu}, {"step_time_s", dt},
                   {"comm_wait_s", comm_wait}, {"comm_bytes", r.comm_bytes}, {"memory_peak_bytes", int64_t(peak_all)},
                   {"memory_reserved_bytes", mem.reserved_bytes}, {"eta_s", eta}});
  if (args_.output_z_loss_coeff > 0) metrics_->write({{"step", step}, {"z_loss", r.z_loss}});
  if (pipelined_) {
    const std::vector<int64_t> peaks(per_stage.begin(), per_stage.begin() + dims_.pp);
    const std::vector<double> waits(per_stage.begin() + dims_.pp, per_stage.begin() + 2 * dims_.pp);
    const std::vector<int64_t> act_peaks(per_stage.begin() + 2 * dims_.pp, per_stage.end());
    metrics_->write({{"step", step}, {"memory_peak_bytes_per_pp_rank", peaks}, {"pp_recv_wait_s_per_pp_rank", waits},
                     {"activation_peak_bytes_per_pp_rank", act_peaks}});
  }
  std::string moe_text;
  if (args_.num_moe_layers() > 0) {
    const MoeStepMetrics& m = moe_metrics_;
    nlohmann::json layers = nlohmann::json::array();
    for (size_t j = 0; j < m.layers.size(); ++j) {
      const auto s = m.summary(j);
      layers.push_back({{"layer", m.layers[j]}, {"min", s.min}, {"max", s.max}, {"cv", s.cv},
                        {"bias_min", m.bias_min[j]}, {"bias_max", m.bias_max[j]}});
    }
    const auto [worst, ratio] = m.worst_imbalance();
    nlohmann::json rec = {{"step", step}, {"moe_layers", layers}, {"moe_tokens_dropped", 0},
                          {"moe_max_over_mean", ratio}, {"moe_worst_layer", worst}};
    if (dims_.ep > 1) rec["moe_dispatch_s"] = m.dispatch_s;
    if (args_.aux_loss_coeff > 0) rec["moe_aux_loss"] = r.moe_aux_loss;
    if (args_.z_loss_coeff > 0) rec["moe_z_loss"] = r.moe_z_loss;
    const int64_t hf = cfg_.metrics.moe_histogram_freq;
    if (hf > 0 && step % hf == 0) rec["moe_tokens_per_expert"] = m.tokens_per_expert;
    metrics_->write(rec);
    moe_text = "  moe max/mean " + fmt("%.2f", ratio) + " (layer " + std::to_string(worst) + ")";
  }
  if (dims_.cp > 1) {  // the cp group's transfers: their spans and the part no block computation hid
    double cs[2] = {cp_stats_.comm_s, cp_stats_.wait_s};
    cp_stats_ = {};
    world_.all_reduce_host(cs, 2, ReduceOp::kMax);
    metrics_->write({{"step", step}, {"cp_comm_s", cs[0]}, {"cp_wait_s", cs[1]}});
  }
  if (tensorboard_)
    tensorboard_->add_scalars(step, {{"loss", r.loss}, {"grad_norm", r.grad_norm}, {"lr", r.lr},
                                     {"tokens_per_s", tp.tokens_per_s}, {"tokens_per_s_per_rank", tp.tokens_per_s_per_rank},
                                     {"tflops_per_rank", tp.tflops_per_rank}, {"mfu", tp.mfu}, {"step_time_s", dt},
                                     {"comm_wait_s", comm_wait}, {"memory_peak_bytes", peak_all}, {"eta_s", eta}});
  log::info("step " + std::to_string(step) + "/" + std::to_string(cfg_.training.steps) + "  loss " + fmt("%.4f", r.loss) +
            "  grad_norm " + fmt("%.3f", r.grad_norm) + "  lr " + fmt("%.2e", r.lr) + "  tok/s " +
            fmt("%.0f", tp.tokens_per_s) + " (" + fmt("%.0f", tp.tokens_per_s_per_rank) + "/rank)  TFLOPS/rank " +
            fmt("%.3f", tp.tflops_per_rank) + "  MFU " + fmt("%.1f%%", 100 * tp.mfu) + "  step " + fmt("%.3f s", dt) +
            " (comm wait " + fmt("%.3f s", comm_wait) + ")  mem " + human_bytes(peak_all) + moe_text + "  eta " +
            fmt("%.0f s", eta));
  note_peaks();
  device_->allocator()->reset_peaks();
}

double Trainer::validate() {
  trace::Span span("validation", "validation");
  return validate_loss(*schedule_, *sync_, val_loader_, *pc_.data, *pc_.loss, *pc_.pp, pipelined_, local_batch_, global_batch_,
                       cfg_.validation.steps);
}

void Trainer::save(int64_t step) {
  trace::Span span("checkpoint save", "checkpoint");
  const auto t_save = Clock::now();
  finish_async_save();  // one write in flight at a time; a failed one stops the run here
  if (rank0_) std::filesystem::create_directories(ckpt_dir_);
  world_.barrier();
  const std::string tmp = (std::filesystem::path(ckpt_dir_) / checkpoint_file_name(step)).string() + ".tmp";
  const TrainState st{step,           tokens_seen_,
                      loader_.cursor(), opt_->step_count(),
                      last_lr_,       cfg_.training.seed,
                      gather_expert_biases(args_, model_->moe_layers(), world_)};
  const bool model_only = cfg_.checkpoint.last_save_model_only && step == cfg_.training.steps;
  CheckpointMeta meta{resolved_deck_toml(cfg_), layout_summary(dims_), int64_t(world_.size()), seq_len_, model_only};
  const CheckpointRole role{pc_.dp_primary(), pc_.tp_primary()};
  const std::string file = ckpt_dir_ + "/" + checkpoint_file_name(step);
  if (async_ckpt_) {
    // Only the copy to host memory blocks (with the NaN / inf check, agreed: a non-finite state
    // stops the run here as a synchronous save would); the writer thread does the rest.
    CheckpointSnapshot snap = plan_checkpoint(*model_, sync_->local_shards(), *opt_, st, role, meta);
    stage_checkpoint(snap, world_.comm(), tmp, *device_, async_ckpt_->recycle());
    int64_t staged = 0;
    for (const StagedShard& s : snap.shards) staged += int64_t(s.values.size() * sizeof(float));
    async_ckpt_->start(step, std::move(snap));
    const double dt = seconds_since(t_save);
    metrics_->write({{"event", "checkpoint_save"}, {"step", step}, {"async", true}, {"seconds", dt}, {"blocking_s", dt},
                     {"staged_bytes_rank0", staged}});
    log::info("checkpoint: step " + std::to_string(step) + (model_only ? " (model only)" : "") + " staged in " +
              fmt("%.3f s", dt) + " (" + human_bytes(double(staged)) + " on rank 0); " + file +
              " is written in the background");
    if (model_only && cfg_.checkpoint.last_save_in_hf) {
      finish_async_save();  // the export reads the published file
      save_hf(step, file);
    }
    return;
  }
  save_checkpoint(tmp, world_.comm(), *device_, *model_, sync_->local_shards(), *opt_, st, role, meta);
  // Rank 0 publishes; every rank learns whether that worked, so all stop together if not.
  std::string error;
  if (rank0_) try {
      publish_checkpoint(ckpt_dir_, step, cfg_.checkpoint.keep_latest_k);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
  double failed = error.empty() ? 0 : 1;
  world_.all_reduce_host(&failed, 1, ReduceOp::kMax);
  if (failed)
    throw CheckpointError(rank0_ ? error
                                 : ckpt_dir_ + ": publishing the checkpoint of step " + std::to_string(step) + " failed on rank 0");
  const double dt = seconds_since(t_save);
  const int64_t bytes = rank0_ ? int64_t(std::filesystem::file_size(file)) : 0;
  metrics_->write({{"event", "checkpoint_save"}, {"step", step}, {"bytes", bytes}, {"seconds", dt}, {"blocking_s", dt}});
  log::info("checkpoint: step " + std::to_string(step) + (model_only ? " (model only)" : "") + " saved to " + file + " (" +
            human_bytes(double(bytes)) + " in " + fmt("%.2f s", dt) + ")");
  if (model_only && cfg_.checkpoint.last_save_in_hf) save_hf(step, file);
}

void Trainer::finish_async_save() {
  if (!async_ckpt_) return;
  if (const auto r = async_ckpt_->wait()) report_async_save(*r);
  if (async_failure_.empty()) return;
  const std::string error = async_failure_;
  async_failure_.clear();
  throw CheckpointError(error + " (an asynchronous save; `latest` still names the previous checkpoint)");
}

void Trainer::report_async_save(const AsyncSaveResult& r) {
  nlohmann::json rec = {{"event", "checkpoint_write"}, {"step", r.step}, {"async", true}, {"ok", r.ok},
                        {"seconds", r.write_s}, {"bytes", r.bytes}};
  if (!r.ok) rec["error"] = r.error;
  metrics_->write(rec);
  if (r.ok) {
    log::info("checkpoint: step " + std::to_string(r.step) + " written in the background to " + r.file + " (" +
              human_bytes(double(r.bytes)) + " in " + fmt("%.2f s", r.write_s) + ") and published as latest");
    return;
  }
  if (rank0_) log::error("checkpoint: the background write of step " + std::to_string(r.step) + " failed: " + r.error);
  if (async_failure_.empty()) async_failure_ = r.error;
}

void Trainer::save_hf(int64_t step, const std::string& file) {
  // The exporter reads the published checkpoint on rank 0 (serial I/O; the file is the model
  // only); every rank learns whether it worked so all stop together if not.
  const auto t0 = Clock::now();
  const std::string dir = file.substr(0, file.size() - 3) + "-hf";  // step-NNNNNNNN.h5 -> step-NNNNNNNN-hf
  std::string error;
  ExportSummary s;
  if (rank0_) try {
      std::error_code ec;
      const std::string& assets = cfg_.model.hf_assets_path;
      s = export_safetensors(file, dir, std::filesystem::is_directory(assets, ec) ? assets : "",
                             cfg_.checkpoint.export_dtype);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
  double failed = error.empty() ? 0 : 1;
  world_.all_reduce_host(&failed, 1, ReduceOp::kMax);
  if (failed) throw CheckpointError(rank0_ ? error : dir + ": the Hugging Face last save failed on rank 0");
  metrics_->write({{"event", "hf_save"}, {"step", step}, {"bytes", s.bytes}, {"seconds", seconds_since(t0)},
                   {"dtype", cfg_.checkpoint.export_dtype}});
  log::info("checkpoint: step " + std::to_string(step) + " saved as a Hugging Face model in " + dir + " (" +
            std::to_string(s.tensors) + " " + cfg_.checkpoint.export_dtype + " tensors, " + human_bytes(double(s.bytes)) +
            ", " + s.architecture + ")");
}

TrainSummary Trainer::train() {
  for (int64_t step = first_step_; step <= cfg_.training.steps; ++step) {
    profiler_->begin_step(step);
    const StepResult r = train_step(step);
    tokens_seen_ += global_batch_ * seq_len_;
    if (step > first_step_) timed_s_ += r.seconds, timed_tokens_ += global_batch_ * seq_len_;
    if (step == first_step_) {  // start-up is over: collectives now get the (shorter) training deadline
      world_.set_timeout(cfg_.comm.train_timeout_seconds);
      comms_.set_timeout(cfg_.comm.train_timeout_seconds);
      dcomms_->set_timeout(cfg_.comm.train_timeout_seconds);
    }
    summary_.steps = step;
    if (r.applied) summary_.final_loss = r.loss;
    if (r.applied && (step == first_step_ || step % cfg_.metrics.log_freq == 0 || step == cfg_.training.steps))
      log_step(step, r);
    if (cfg_.validation.enable && (step % cfg_.validation.freq == 0 || step == cfg_.training.steps)) {
      const double vl = validate();
      summary_.final_val_loss = vl;
      metrics_->write({{"step", step}, {"val_loss", vl}});
      if (tensorboard_) tensorboard_->add_scalars(step, {{"val_loss", vl}});
      log::info("validation step " + std::to_string(step) + "  val_loss " + fmt("%.4f", vl) + "  (unigram entropy " +
                fmt("%.4f", unigram_) + ")");
    }
    const bool saved = cfg_.checkpoint.enable && (step % cfg_.checkpoint.interval == 0 || step == cfg_.training.steps);
    if (saved) save(step);
    if (async_ckpt_)  // a background write that has finished is reported at once (rank-local)
      if (const auto w = async_ckpt_->poll()) report_async_save(*w);
    if (const std::string trace_file = profiler_->end_step(step); !trace_file.empty() && rank0_)
      log::info("profiling: step " + std::to_string(step) + " trace written to " + trace_file + " (one file per rank)");
    // Preemption: any rank's signal (agreed with the non-finite check) stops every rank here, at
    // the same step boundary.
    if (r.preempt_signal > 0 && step < cfg_.training.steps) {
      if (cfg_.checkpoint.enable && !saved) save(step);
      finish_async_save();  // the preemption save is complete and published before the exit
      throw PreemptedError("preempted by signal " + std::to_string(r.preempt_signal) + " after step " +
                           std::to_string(step) +
                           (cfg_.checkpoint.enable ? "; checkpoint saved in " + ckpt_dir_ + ", a rerun resumes from it"
                                                   : "; [checkpoint] enable is false, so nothing was saved"));
    }
  }
  return finalize();
}

TrainSummary Trainer::finalize() {
  Device& dev = *device_;
  finish_async_save();  // the last save is published before the final model and the summary
  summary_.elapsed_s = seconds_since(t_start_);
  summary_.tokens_per_s = timed_s_ > 0 ? double(timed_tokens_) / timed_s_ : 0;
  note_peaks();
  if (cfg_.job.final_dump) {
    // The final model goes through the sharded checkpoint writer (model only): every rank writes
    // the hyperslabs of its own shards, so the end of a 405B run needs no more memory than a
    // checkpoint save, where gathering every parameter on every rank would not fit.
    const auto t_final = Clock::now();
    dev.allocator()->reset_peaks();
    const std::string final_path = (out_dir_ / "model_final.h5").string(), tmp = final_path + ".tmp";
    world_.barrier();  // rank 0 created out_dir at start-up
    const TrainState st{summary_.steps,   tokens_seen_,
                        loader_.cursor(), opt_->step_count(),
                        last_lr_,         cfg_.training.seed,
                        gather_expert_biases(args_, model_->moe_layers(), world_)};
    CheckpointMeta meta{resolved_deck_toml(cfg_), layout_summary(dims_), int64_t(world_.size()), seq_len_, /*model_only=*/true};
    save_checkpoint(tmp, world_.comm(), dev, *model_, sync_->local_shards(), *opt_, st,
                    CheckpointRole{pc_.dp_primary(), pc_.tp_primary()}, meta);
    std::string error;
    if (rank0_) try {
        publish_file(tmp, final_path);
      } catch (const CheckpointError& e) {
        error = e.what();
      }
    double failed = error.empty() ? 0 : 1;
    world_.all_reduce_host(&failed, 1, ReduceOp::kMax);
    if (failed) throw CheckpointError(rank0_ ? error : final_path + ": publishing the final model failed on rank 0");
    double final_peak = double(dev.allocator()->stats().total_peak);  // the largest rank's
    world_.all_reduce_host(&final_peak, 1, ReduceOp::kMax);
    const int64_t bytes = rank0_ ? int64_t(std::filesystem::file_size(final_path)) : 0;
    metrics_->write({{"event", "final_model_save"}, {"bytes", bytes}, {"seconds", seconds_since(t_final)},
                     {"memory_peak_bytes", int64_t(final_peak)}});
    log::info("final model: " + final_path + " (" + human_bytes(double(bytes)) +
              ", sharded writer, model only; memory peak " + human_bytes(final_peak) + " per rank)");
  }
  // Per-category peaks of the largest rank (shards are uneven when shapes do not divide).
  std::array<double, kNumMemCategories> peaks{};
  for (int c = 0; c < kNumMemCategories; ++c) peaks[c] = double(run_peak_[c]);
  world_.all_reduce_host(peaks.data(), kNumMemCategories, ReduceOp::kMax);
  nlohmann::json by_cat;
  std::string breakdown;
  for (int c = 0; c < kNumMemCategories; ++c) {
    by_cat[mem_category_name(MemCategory(c))] = int64_t(peaks[c]);
    breakdown += std::string(c ? ", " : "") + mem_category_name(MemCategory(c)) + " " + human_bytes(peaks[c]);
  }
  // Rank 0's parameter shards (f32 bytes): the routed experts apart from the rest.
  int64_t param_bytes[2] = {0, 0};
  for (const LocalShard& ls : sync_->local_shards())
    param_bytes[ls.param->sharding.expert_parallel() || ls.param->name.find(".moe.experts.") != std::string::npos] +=
        ls.value.numel() * int64_t(sizeof(float));
  const TrainSummary& s = summary_;
  metrics_->write({{"event", "summary"}, {"steps", s.steps}, {"final_loss", s.final_loss},
                   {"final_val_loss", s.final_val_loss}, {"unigram_entropy", unigram_}, {"elapsed_s", s.elapsed_s},
                   {"tokens_per_s", s.tokens_per_s}, {"tokens", int64_t(s.steps * global_batch_ * seq_len_)},
                   {"world_size", world_.size()}, {"parameters", args_.num_params()},
                   {"dp_replicate", dims_.dp_replicate}, {"dp_shard", dims_.dp_shard}, {"tp", dims_.tp},
                   {"zero_stage", zero_stage_}, {"ep", dims_.ep}, {"memory_peak_bytes_by_category", by_cat},
                   {"nonexpert_parameter_bytes_rank0", param_bytes[0]}, {"expert_parameter_bytes_rank0", param_bytes[1]},
                   {"nonfinite_steps_skipped", guard_->skipped_total()}});
  log::info("summary: " + std::to_string(s.steps) + " steps in " + fmt("%.1f s", s.elapsed_s) + ", final loss " +
            fmt("%.4f", s.final_loss) +
            (s.final_val_loss >= 0 ? ", final val_loss " + fmt("%.4f", s.final_val_loss) : std::string()) +
            ", validation unigram entropy " + fmt("%.4f", unigram_) + " nats" +
            (s.final_val_loss >= 0 ? " (val_loss is " + fmt("%.3f", unigram_ - s.final_val_loss) + " nats below it)"
                                   : std::string()) +
            ", " + fmt("%.0f", s.tokens_per_s) + " tokens/s; outputs in " + out_dir_.string());
  log::info("memory peaks per rank (largest rank, by category): " + breakdown);
  return summary_;
}

TrainSummary train(const JobConfig& cfg, const ParallelDims& dims, const TokenStore& store, const RankLayout& layout,
                   MpiCommunicator& world) {
  Trainer trainer(cfg, dims, store, layout, world);
  return trainer.train();
}

}  // namespace meshtrain
