#include "parallel/fsdp/sharded_data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "model/init.hpp"
#include "tensor/float8.hpp"
#include "util/trace.hpp"

namespace meshtrain {

namespace {
// The parameters a sharding unit holds (of this instance only, under expert parallelism).
std::vector<Parameter*> params_of(const ShardUnit& su) {
  std::vector<Parameter*> ps;
  ps.reserve(su.params.size());
  for (const ShardedParam& sp : su.params) ps.push_back(sp.param);
  return ps;
}

// Whether p's gathered copy can travel as e4m3 codes: a Float8 weight whose recipe casts it
// tensorwise to e4m3 for both GEMMs that read it (TorchAO's tensorwise recipe, the one its FSDP
// all-gather serves), so the gathered codes are exactly what those casts produce.
bool gathers_as_float8(const Parameter& p) {
  if (!p.float8) return false;
  const Float8Cast& a = p.float8->output_w;
  const Float8Cast& b = p.float8->grad_input_w;
  const auto tensorwise_e4m3 = [](const Float8Cast& c) {
    return c.quantize && c.scaling == Float8Scaling::kTensorwise && c.format == Float8Format::kE4M3;
  };
  return tensorwise_e4m3(a) && tensorwise_e4m3(b);
}

// Rank k's rows of a dim-0 sharded parameter: [first, first + rows).
std::pair<int64_t, int64_t> rows_of_rank(const Dim0Shard& s, int64_t k) {
  const int64_t first = std::min(s.rows, k * s.rows_per_rank);
  return {first, std::min(s.rows, first + s.rows_per_rank) - first};
}
}  // namespace

ModelStorage model_storage_for(int zero_stage) { return ModelStorage{zero_stage < 3, zero_stage < 2}; }

ShardedDataParallel::ShardedDataParallel(Transformer& model, Device& dev, Communicator& shard, Communicator* replicate,
                                         ShardedOptions opt)
    : model_(model), dev_(dev), shard_(shard), replicate_(replicate), opt_(opt) {
  if (opt.zero_stage < 1 || opt.zero_stage > 3)
    throw std::invalid_argument("zero_stage " + std::to_string(opt.zero_stage) + " (must be 1, 2 or 3)");
  const ModelStorage need = model_storage_for(opt.zero_stage);
  if (model.flat_params().defined() != need.params || model.flat_grads().defined() != need.grads)
    throw std::invalid_argument("ShardedDataParallel: the model's storage does not match ZeRO-" +
                                std::to_string(opt.zero_stage) + " (build it with model_storage_for)");
  plan_ = make_shard_plan(model, shard.size(), shard.rank(), opt.select);
  units_.resize(plan_.units.size());
  for (size_t f = 0; f < plan_.units.size(); ++f) {
    const ShardUnit& su = plan_.units[f];
    UnitState& s = units_[f];
    s.shard_grads = dev.zeros({su.shard_elems}, DType::kF32, MemCategory::kGradients);
    if (shards_params()) s.shard_values = dev.zeros({su.shard_elems}, DType::kF32, MemCategory::kParameters);
    s.params_ready = !shards_params();
    for (const ShardedParam& sp : su.params) {
      const int64_t n = sp.shard.local_elems();
      LocalShard ls;
      ls.param = sp.param;
      ls.value = shards_params()
                     ? s.shard_values.view({n}, sp.shard_offset)
                     : sp.param->value.reshape({sp.param->value.numel()}).view({n}, sp.shard.first_row * sp.shard.row_elems);
      ls.grad = s.shard_grads.view({n}, sp.shard_offset);
      ls.first_elem = sp.shard.first_row * sp.shard.row_elems;
      shards_.push_back(ls);
    }
  }
  f8_split_.resize(plan_.units.size());
  if (!opt.float8_all_gather || !shards_params()) return;
  for (size_t f = 0; f < plan_.units.size(); ++f) {
    const ShardUnit& su = plan_.units[f];
    Float8Split& sp8 = f8_split_[f];
    for (const ShardedParam& sp : su.params) {
      const bool f8 = gathers_as_float8(*sp.param);
      ShardUnit& part = f8 ? sp8.f8 : sp8.hp;
      ShardedParam q = sp;
      q.shard_offset = part.shard_elems;
      part.shard_elems += align16(sp.shard.padded_elems());
      part.params.push_back(q);
      (f8 ? sp8.f8_master_offset : sp8.hp_master_offset).push_back(sp.shard_offset);
      if (f8 && sp.param->float8_tp) {
        if (sp8.tp && sp8.tp != sp.param->float8_tp)
          throw std::invalid_argument("ShardedDataParallel: the Float8 weights of one unit are split over different "
                                      "tensor-parallel groups");
        sp8.tp = sp.param->float8_tp;
      }
    }
    if (sp8.f8.params.empty()) sp8 = Float8Split{};
  }
}

ShardedDataParallel::~ShardedDataParallel() {
  try {  // never free a buffer a collective still writes
    for (UnitState& s : units_) {
      if (s.gather) s.gather->wait();
      if (s.f8_gather) s.f8_gather->wait();
    }
    retire(true);
  } catch (...) {
  }
}

void ShardedDataParallel::init_weights(uint64_t seed) {
  if (!shards_params()) {
    model_.init_weights(seed);
    return;
  }
  std::vector<float> host;
  for (size_t f = 0; f < plan_.units.size(); ++f)
    for (const ShardedParam& sp : plan_.units[f].params) {
      const int64_t n = sp.shard.local_elems();
      if (n == 0) continue;
      host.resize(size_t(n));
      init_range(*sp.param, seed, sp.shard.first_row * sp.shard.row_elems, n, host.data());
      dev_.upload(units_[f].shard_values.view({n}, sp.shard_offset), host.data(), size_t(n) * sizeof(float));
    }
}

void ShardedDataParallel::timed_wait(Work& w) {
  const auto t0 = std::chrono::steady_clock::now();
  w.wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ShardedDataParallel::start_gather(size_t f) {
  UnitState& s = units_[f];
  if (s.params_ready || s.gather || s.f8_gather) return;
  if (plan_.units[f].params.empty()) {  // another instance's unit (expert parallelism): nothing to gather
    s.params_ready = true;
    return;
  }
  if (gather_f8(f)) {
    start_f8_gather(f);
    return;
  }
  trace::Span span("issue all_gather", "comm_issue");
  span.arg("unit", f).arg("group", shard_.name());
  const ShardUnit& su = plan_.units[f];
  if (gather_bf16()) {
    s.gather_send = dev_.empty({su.shard_elems}, DType::kBF16, MemCategory::kCommunication);
    dev_.cast(s.gather_send, s.shard_values);
  } else if (shards_params()) {
    s.gather_send = s.shard_values;
  } else {  // ZeRO-1/2: the updated rows live in the replicated parameters; pack them
    s.gather_send = dev_.empty({su.shard_elems}, DType::kF32, MemCategory::kCommunication);
    dev_.fill(s.gather_send, 0.0f);
    for (const ShardedParam& sp : su.params) {
      const int64_t n = sp.shard.local_elems();
      if (n == 0) continue;
      const Tensor full = sp.param->value.reshape({sp.param->value.numel()});
      dev_.copy(s.gather_send.view({n}, sp.shard_offset), full.view({n}, sp.shard.first_row * sp.shard.row_elems));
    }
  }
  s.gather_recv = dev_.empty({plan_.group * su.shard_elems}, s.gather_send.dtype(), MemCategory::kCommunication);
  s.gather = shard_.all_gather(s.gather_send, s.gather_recv);
  span.arg("bytes", int64_t(s.gather_recv.nbytes()));
}

void ShardedDataParallel::start_f8_gather(size_t f) {
  UnitState& s = units_[f];
  const Float8Split& sp8 = f8_split_[f];
  trace::Span span("issue all_gather (float8)", "comm_issue");
  span.arg("unit", f).arg("group", shard_.name());
  // The scales first: every rank must cast its shard with the whole weight's amax, so the local
  // amax of all the unit's Float8 weights travel in one all-reduce (TorchAO's
  // precompute_float8_dynamic_scale_for_fsdp batches them so, for all weights at once). It
  // blocks: the casts below need it. Ranks issue it at the same hook, so collectives on the
  // shard (and tp) group stay in one order everywhere.
  const int64_t n8 = int64_t(sp8.f8.params.size());
  s.f8_amax = dev_.empty({n8}, DType::kF32, MemCategory::kCommunication);
  for (int64_t j = 0; j < n8; ++j) {
    const ShardedParam& sp = sp8.f8.params[size_t(j)];
    const int64_t n = sp.shard.local_elems();
    dev_.float8_amax(s.shard_values.view({1, n}, sp8.f8_master_offset[size_t(j)]), Float8Scaling::kTensorwise,
                     s.f8_amax.view({1}, j));
  }
  shard_.all_reduce(s.f8_amax, ReduceOp::kMax)->wait();
  if (sp8.tp && sp8.tp->size() > 1) sp8.tp->all_reduce(s.f8_amax, ReduceOp::kMax)->wait();
  // The codes, 4 per i32 element: every parameter block starts 16 codes apart, so each one's
  // view begins on a whole element.
  s.f8_send = dev_.empty({sp8.f8.shard_elems / 4}, DType::kI32, MemCategory::kCommunication);
  dev_.fill(s.f8_send, 0.0f);
  for (int64_t j = 0; j < n8; ++j) {
    const ShardedParam& sp = sp8.f8.params[size_t(j)];
    const int64_t n = sp.shard.local_elems();
    if (n == 0) continue;
    dev_.float8_quantize_bytes(s.shard_values.view({n}, sp8.f8_master_offset[size_t(j)]), Float8Format::kE4M3,
                               sp.param->float8->power_of_two, s.f8_amax.view({1}, j),
                               s.f8_send.view({(n + 3) / 4}, sp.shard_offset / 4));
  }
  // The other parameters in param_dtype, packed into their own layout.
  const DType hp_dtype = gather_bf16() ? DType::kBF16 : DType::kF32;
  if (!sp8.hp.params.empty()) {
    s.gather_send = dev_.empty({sp8.hp.shard_elems}, hp_dtype, MemCategory::kCommunication);
    dev_.fill(s.gather_send, 0.0f);
    for (size_t j = 0; j < sp8.hp.params.size(); ++j) {
      const ShardedParam& sp = sp8.hp.params[j];
      const int64_t n = sp.shard.local_elems();
      if (n == 0) continue;
      dev_.cast(s.gather_send.view({n}, sp.shard_offset), s.shard_values.view({n}, sp8.hp_master_offset[j]));
    }
    s.gather_recv = dev_.empty({plan_.group * sp8.hp.shard_elems}, hp_dtype, MemCategory::kCommunication);
    s.gather = shard_.all_gather(s.gather_send, s.gather_recv);
  }
  s.f8_recv = dev_.empty({plan_.group * s.f8_send.numel()}, DType::kI32, MemCategory::kCommunication);
  s.f8_gather = shard_.all_gather(s.f8_send, s.f8_recv);
  span.arg("bytes", int64_t(s.f8_recv.nbytes() + (s.gather_recv.defined() ? s.gather_recv.nbytes() : 0)));
}

void ShardedDataParallel::ensure_params(size_t f) {
  UnitState& s = units_[f];
  if (s.params_ready) return;
  start_gather(f);
  if (s.params_ready) return;  // a unit without parameters of this instance
  if (s.gather) {  // a unit gathered only as Float8 codes has no high-precision all-gather
    trace::Span span("wait all_gather", "comm_wait");
    span.arg("unit", f);
    timed_wait(*s.gather);
  }
  const ShardUnit& su = plan_.units[f];
  if (s.f8_gather) {
    finish_f8_gather(f);
    return;
  }
  if (s.gather_recv.dtype() == DType::kBF16) {  // bf16 gather: the values are the compute copies
    s.full_values = dev_.empty({su.full_elems}, DType::kBF16, MemCategory::kCommunication);
    for (const ShardedParam& sp : su.params) sp.param->compute = s.full_values.view(sp.param->local_shape, sp.full_offset);
    copy_out_gathered(dev_, su, plan_.group, s.gather_recv, [&](const ShardedParam& sp) {
      return s.full_values.view({shape_numel(sp.param->local_shape)}, sp.full_offset);
    });
    s.gather.reset();
    s.gather_send = Tensor();
    s.gather_recv = Tensor();
    s.params_ready = true;
    model_.compute_written(params_of(su));
    return;
  }
  if (shards_params()) {
    s.full_values = dev_.empty({su.full_elems}, DType::kF32, MemCategory::kCommunication);
    for (const ShardedParam& sp : su.params) sp.param->value = s.full_values.view(sp.param->local_shape, sp.full_offset);
    copy_out_gathered(dev_, su, plan_.group, s.gather_recv, [&](const ShardedParam& sp) {
      return s.full_values.view({shape_numel(sp.param->local_shape)}, sp.full_offset);
    });
  } else {  // this rank's own rows are already current
    copy_out_gathered(
        dev_, su, plan_.group, s.gather_recv,
        [](const ShardedParam& sp) { return sp.param->value.reshape({sp.param->value.numel()}); }, plan_.rank);
  }
  s.gather.reset();
  s.gather_send = Tensor();
  s.gather_recv = Tensor();
  s.params_ready = true;
  model_.params_changed(params_of(su));  // mixed precision: recast on next use
}

void ShardedDataParallel::finish_f8_gather(size_t f) {
  UnitState& s = units_[f];
  const Float8Split& sp8 = f8_split_[f];
  {
    trace::Span span("wait all_gather (float8)", "comm_wait");
    span.arg("unit", f);
    timed_wait(*s.f8_gather);
  }
  // Under bf16 mixed precision the full copies are the compute copies, as with a bf16 gather;
  // in float32 runs they are the values the layers read.
  const bool bf16 = gather_bf16();
  s.full_values = dev_.empty({plan_.units[f].full_elems}, bf16 ? DType::kBF16 : DType::kF32,
                             MemCategory::kCommunication);
  for (const ShardedParam& sp : plan_.units[f].params) {
    Tensor& t = bf16 ? sp.param->compute : sp.param->value;
    t = s.full_values.view(sp.param->local_shape, sp.full_offset);
  }
  const FullView full = [&](const ShardedParam& sp) {
    return s.full_values.view({shape_numel(sp.param->local_shape)}, sp.full_offset);
  };
  if (s.gather_recv.defined()) copy_out_gathered(dev_, sp8.hp, plan_.group, s.gather_recv, full);
  // Why the GEMMs' own casts of these copies give back the gathered codes (so float32 runs
  // equal the high-precision gather's bit for bit, and the FP8 GEMMs read these very codes):
  // each value is q / s with q an e4m3 code, s = 448 / amax. The largest |w| maps onto q = 448
  // (its product with s is 448 within an ulp, which rounds or saturates to 448), so the
  // copy's amax is 448 / s, which rounds to amax within an ulp or two — exactly the gathered
  // amax in the float32 cases met so far, and in any case a scale s' within a few ulps of s
  // (within 2^-9 relative for a bf16 copy). The cast then rounds q · (s' / s) · (1 ± 2^-9) to
  // e4m3, whose neighbouring codes lie at least 2^-4 · q apart (subnormals: 2^-9 apart, with
  // q ≤ 2^-6): far beyond the perturbation, so it lands on q again.
  for (size_t j = 0; j < sp8.f8.params.size(); ++j) {
    const ShardedParam& sp = sp8.f8.params[j];
    const Tensor dst = full(sp);
    const int64_t c = sp.shard.row_elems;
    for (int64_t k = 0; k < plan_.group; ++k) {
      const auto [first, rows] = rows_of_rank(sp.shard, k);
      if (rows == 0) continue;
      const int64_t n = rows * c;
      dev_.float8_dequantize_bytes(s.f8_recv.view({(n + 3) / 4}, (k * sp8.f8.shard_elems + sp.shard_offset) / 4),
                                   Float8Format::kE4M3, sp.param->float8->power_of_two,
                                   s.f8_amax.view({1}, int64_t(j)), dst.view({n}, first * c));
    }
  }
  s.gather.reset();
  s.f8_gather.reset();
  s.gather_send = s.gather_recv = s.f8_send = s.f8_recv = s.f8_amax = Tensor();
  s.params_ready = true;
  if (bf16)
    model_.compute_written(params_of(plan_.units[f]));
  else
    model_.params_changed(params_of(plan_.units[f]));
}

void ShardedDataParallel::release_params(size_t f) {
  UnitState& s = units_[f];
  for (const ShardedParam& sp : plan_.units[f].params) sp.param->value = Tensor();
  // Only this instance's parameters: another instance (expert parallelism) may hold the rest.
  model_.release_compute(params_of(plan_.units[f]));
  s.full_values = Tensor();
  s.params_ready = false;
}

void ShardedDataParallel::start_reduce(size_t f) {
  if (plan_.units[f].params.empty()) return;
  trace::Span span("issue reduce_scatter", "comm_issue");
  span.arg("unit", f).arg("group", shard_.name());
  UnitState& s = units_[f];
  const ShardUnit& su = plan_.units[f];
  Reduction r;
  r.unit = f;
  r.last = last_;
  r.in = dev_.empty({plan_.group * su.shard_elems}, DType::kF32, MemCategory::kCommunication);
  copy_in_for_scatter(
      dev_, su, plan_.group,
      [&](const ShardedParam& sp) {
        return shards_grads() ? s.full_grads.view({shape_numel(sp.param->local_shape)}, sp.full_offset)
                              : sp.param->grad.reshape({sp.param->grad.numel()});
      },
      r.in);
  if (shards_grads()) {
    for (const ShardedParam& sp : su.params) sp.param->grad = Tensor();
    s.full_grads = Tensor();
  }
  // The step's first reduction of this unit writes the shard; later micro-batches accumulate.
  const bool first = !shards_grads() || first_ || opt_.reduce_once_per_step;
  if (wire_bf16()) {
    Tensor wire_in = dev_.empty(r.in.shape(), DType::kBF16, MemCategory::kCommunication);
    dev_.cast(wire_in, r.in);
    r.in = wire_in;
    r.wire_out = dev_.empty({su.shard_elems}, DType::kBF16, MemCategory::kCommunication);
    r.accumulate = !first;
    span.arg("bytes", int64_t(r.in.nbytes()));
    r.work = shard_.reduce_scatter(r.in, r.wire_out, ReduceOp::kSum);
    reductions_.push_back(std::move(r));
    return;
  }
  if (!first) r.staging = dev_.empty({su.shard_elems}, DType::kF32, MemCategory::kCommunication);
  span.arg("bytes", int64_t(r.in.nbytes()));
  r.work = shard_.reduce_scatter(r.in, first ? s.shard_grads : r.staging, ReduceOp::kSum);
  reductions_.push_back(std::move(r));
}

void ShardedDataParallel::retire(bool block) {
  while (!reductions_.empty()) {
    Reduction& r = reductions_.front();
    if (block) {
      trace::Span span("wait reduce_scatter", "comm_wait");
      span.arg("unit", r.unit);
      timed_wait(*r.work);
    } else if (!r.work->test()) {
      break;
    }
    UnitState& s = units_[r.unit];
    if (r.wire_out.defined()) {  // bf16 on the wire: widen into the f32 shard (first) or add to it
      if (r.accumulate) {
        Tensor wide = dev_.empty({r.wire_out.numel()}, DType::kF32, MemCategory::kCommunication);
        dev_.cast(wide, r.wire_out);
        dev_.add(s.shard_grads, wide, 1.0f);
      } else {
        dev_.cast(s.shard_grads, r.wire_out);
      }
    }
    if (r.staging.defined()) dev_.add(s.shard_grads, r.staging, 1.0f);
    // Issued in reduce-scatter order, which every rank shares, so replicas pair up.
    if (r.last && replicate_ && replicate_->size() > 1) {
      if (opt_.replicate_at_finish)
        pending_replicas_.push_back(r.unit);
      else
        start_replica(r.unit);
    }
    reductions_.pop_front();
  }
  while (!replicas_.empty()) {
    ReplicaReduction& rr = replicas_.front();
    if (block) {
      trace::Span span("wait all_reduce (replicas)", "comm_wait");
      timed_wait(*rr.work);
    } else if (!rr.work->test()) {
      break;
    }
    if (rr.wire.defined()) dev_.cast(rr.target, rr.wire);
    replicas_.pop_front();
  }
}

void ShardedDataParallel::start_replica(size_t f) {
  UnitState& s = units_[f];
  ReplicaReduction rr;
  rr.target = s.shard_grads;
  Tensor t = s.shard_grads;
  if (wire_bf16()) {
    rr.wire = dev_.empty(s.shard_grads.shape(), DType::kBF16, MemCategory::kCommunication);
    dev_.cast(rr.wire, s.shard_grads);
    t = rr.wire;
  }
  rr.work = replicate_->all_reduce(t, ReduceOp::kSum);
  replicas_.push_back(std::move(rr));
}

void ShardedDataParallel::pre_forward(size_t u, int64_t) {
  const size_t f = size_t(plan_.unit_of[u]);
  ensure_params(f);
  if (u + 1 < plan_.unit_of.size() && size_t(plan_.unit_of[u + 1]) != f) start_gather(size_t(plan_.unit_of[u + 1]));
  poll();
}

void ShardedDataParallel::post_forward(size_t u, int64_t) {
  const size_t f = size_t(plan_.unit_of[u]);
  if (shards_params() && u == plan_.units[f].members.back()) {
    // The last unit's backward follows at once, so training keeps it; evaluation frees all.
    if (eval_ || (opt_.reshard_after_forward && u + 1 != plan_.unit_of.size())) release_params(f);
  }
  poll();
}

void ShardedDataParallel::pre_backward(size_t u, int64_t) {
  const size_t f = size_t(plan_.unit_of[u]);
  ensure_params(f);
  UnitState& s = units_[f];
  const ShardUnit& su = plan_.units[f];
  // The unit's first backward (of the micro-batch, or of the step when reducing once): zeroed
  // unsharded gradients.
  if (shards_grads() && u == su.members.back() && !(opt_.reduce_once_per_step && s.full_grads.defined())) {
    s.full_grads = dev_.zeros({su.full_elems}, DType::kF32, MemCategory::kCommunication);
    for (const ShardedParam& sp : su.params) sp.param->grad = s.full_grads.view(sp.param->local_shape, sp.full_offset);
  }
  if (shards_params() && u > 0 && size_t(plan_.unit_of[u - 1]) != f) start_gather(size_t(plan_.unit_of[u - 1]));
  poll();
}

void ShardedDataParallel::post_backward(size_t u, int64_t) {
  const size_t f = size_t(plan_.unit_of[u]);
  if (u == plan_.units[f].members.front()) {  // the unit's gradients are complete
    if (last_ || (shards_grads() && !opt_.reduce_once_per_step)) start_reduce(f);
    if (shards_params() && (last_ || !opt_.reduce_once_per_step)) release_params(f);
  }
  poll();
}

void ShardedDataParallel::set_micro_batch_role(bool first, bool last) {
  first_ = first;
  last_ = last;
  eval_ = false;
}

void ShardedDataParallel::begin_evaluation() { eval_ = true; }

void ShardedDataParallel::finish_gradients() {
  retire(true);
  if (pending_replicas_.empty()) return;
  std::sort(pending_replicas_.begin(), pending_replicas_.end());  // unit order, the same on every rank
  for (size_t f : pending_replicas_) start_replica(f);
  pending_replicas_.clear();
  retire(true);
}

double ShardedDataParallel::grad_sum_squares(Device& dev, std::vector<double>* each) {
  double s = local_sum_squares(dev, shards_, each);
  shard_.all_reduce_host(&s, 1, ReduceOp::kSum);
  if (opt_.norm_group && opt_.norm_group->size() > 1) opt_.norm_group->all_reduce_host(&s, 1, ReduceOp::kSum);
  return s;
}

void ShardedDataParallel::after_optimizer_step() {
  if (shards_params()) return;  // the shards are the parameters; the next forward gathers them
  for (UnitState& s : units_) s.params_ready = false;
  start_gather(size_t(plan_.unit_of[0]));  // the rest are prefetched by the next forward
}

void ShardedDataParallel::gather_full_parameters() {
  bool f8 = false;
  for (size_t f = 0; f < units_.size(); ++f) f8 = f8 || gather_f8(f);
  // Units gathered for compute hold bf16 copies or Float8 codes' values: regather in f32.
  if (gather_bf16() || f8) {
    for (size_t f = 0; f < units_.size(); ++f) {
      if (units_[f].gather) units_[f].gather->wait();
      if (units_[f].f8_gather) units_[f].f8_gather->wait();
      units_[f].gather.reset();
      units_[f].f8_gather.reset();
      release_params(f);
    }
    full_precision_ = true;
  }
  for (size_t f = 0; f < units_.size(); ++f) ensure_params(f);
}

void ShardedDataParallel::release_full_parameters() {
  if (!shards_params()) return;
  for (size_t f = 0; f < units_.size(); ++f) release_params(f);
  full_precision_ = false;
}

double ShardedDataParallel::take_comm_wait_seconds() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace meshtrain
