#include "model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "model/init.hpp"
#include "model/layers/attention.hpp"
#include "model/layers/embedding.hpp"
#include "model/layers/transformer_block.hpp"

namespace meshtrain {

namespace {
constexpr int64_t kAlign = 16;  // elements: 64-byte aligned parameter views
}

ModelPart ModelPart::whole(const ModelArgs& args) {
  ModelPart p;
  for (int64_t i = 0; i < args.n_layers; ++i) p.layers.push_back(i);
  return p;
}

bool ModelPart::is_whole(const ModelArgs& args) const {
  return embedding && head && int64_t(layers.size()) == args.n_layers;
}

Transformer::Transformer(const ModelArgs& args, Device& dev, ModelStorage storage, const TensorParallel& tp,
                         DType compute_dtype, const ModelPart* part, const ExpertParallel& ep)
    : args_(args),
      part_(part ? *part : ModelPart::whole(args)),
      dev_(dev),
      tp_(tp),
      ep_(ep),
      compute_dtype_(compute_dtype) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16)
    throw std::invalid_argument(std::string("Transformer: compute dtype ") + dtype_name(compute_dtype) +
                                " (float32 or bfloat16)");
  for (size_t i = 0; i < part_.layers.size(); ++i)
    if (part_.layers[i] < 0 || part_.layers[i] >= args.n_layers || (i && part_.layers[i] <= part_.layers[i - 1]))
      throw std::invalid_argument("Transformer: model part block " + std::to_string(part_.layers[i]) +
                                  " is outside [0, n_layers) or out of order");
  if (part_.layers.empty() && !part_.embedding && !part_.head)
    throw std::invalid_argument("Transformer: an empty model part");
  Parameter* tied = nullptr;
  if (part_.embedding) {
    auto emb = std::make_unique<Embedding>(args, tp);
    tied = &emb->weight;
    owned_.push_back(std::move(emb));
  }
  for (int64_t i : part_.layers) {
    auto block = std::make_unique<TransformerBlock>(args, int(i), tp, ep);
    if (block->moe()) moe_layers_.push_back(block->moe());
    owned_.push_back(std::move(block));
  }
  if (part_.head) owned_.push_back(std::make_unique<OutputHead>(args, tied, tp));
  int64_t total = 0;
  for (auto& u : owned_) {
    units_.push_back(u.get());
    const size_t first = params_.size();
    for (Parameter* p : u->parameters()) {
      p->sharding.tp_size = tp.size;
      p->flat_offset = total;
      total += (shape_numel(p->local_shape) + kAlign - 1) / kAlign * kAlign;
      params_.push_back(p);
    }
    unit_ranges_.emplace_back(first, params_.size());
  }
  if (storage.params) flat_params_ = dev.empty({total}, DType::kF32, MemCategory::kParameters);
  if (storage.grads) flat_grads_ = dev.zeros({total}, DType::kF32, MemCategory::kGradients);
  const bool mixed = compute_dtype_ != DType::kF32;
  if (mixed && storage.params) flat_compute_ = dev.empty({total}, compute_dtype_, MemCategory::kParameters);
  for (Parameter* p : params_) {
    if (storage.params) p->value = flat_params_.view(p->local_shape, p->flat_offset);
    if (storage.grads) p->grad = flat_grads_.view(p->local_shape, p->flat_offset);
    if (flat_compute_.defined()) p->compute = flat_compute_.view(p->local_shape, p->flat_offset);
  }
  stale_.assign(params_.size(), 1);
  for (size_t i = 0; i < params_.size(); ++i) index_[params_[i]] = i;
}

size_t Transformer::index_of(const Parameter* p) const {
  const auto it = index_.find(p);
  if (it == index_.end()) throw std::logic_error("parameter " + p->name + " is not in the model");
  return it->second;
}

std::vector<Parameter*> Transformer::used_parameters(size_t u) const {
  std::vector<Parameter*> ps = unit_parameters(u);
  // A tied output projection reads the embedding's weight from the last unit (when this part
  // holds both; otherwise the head holds its own copy, among its unit_parameters).
  if (args_.tie_word_embeddings && part_.embedding && part_.head && u + 1 == units_.size() && u > 0)
    ps.push_back(params_.front());
  return ps;
}

void Transformer::ensure_compute(size_t u) {
  if (compute_dtype_ == DType::kF32) return;
  if (!flat_compute_.defined()) {
    // FSDP: one buffer for this unit's parameters that have no compute copy yet (all of them,
    // or those of the FSDP instance that gathered in f32). The views keep it alive.
    std::vector<Parameter*> unbound;
    int64_t n = 0;
    for (Parameter* p : unit_parameters(u))
      if (!p->compute.defined()) {
        unbound.push_back(p);
        n += (shape_numel(p->local_shape) + kAlign - 1) / kAlign * kAlign;
      }
    if (!unbound.empty()) {
      const Tensor buf = dev_.empty({n}, compute_dtype_, MemCategory::kCommunication);
      int64_t off = 0;
      for (Parameter* p : unbound) {
        p->compute = buf.view(p->local_shape, off);
        off += (shape_numel(p->local_shape) + kAlign - 1) / kAlign * kAlign;
        stale_[index_of(p)] = 1;
      }
    }
  }
  for (Parameter* p : used_parameters(u)) {
    char& stale = stale_[index_of(p)];
    if (!stale) continue;
    if (!p->value.defined() || !p->compute.defined())
      throw std::logic_error("ensure_compute: " + p->name + " has no value to cast (parameters not gathered)");
    dev_.cast(p->compute, p->value);
    stale = 0;
  }
}

void Transformer::params_changed(const std::vector<Parameter*>& ps) {
  for (Parameter* p : ps) stale_[index_of(p)] = 1;
}

void Transformer::params_changed() { std::fill(stale_.begin(), stale_.end(), 1); }

Tensor Transformer::held_compute_copy(const Parameter& p) const {
  if (!flat_compute_.defined() || !p.compute.defined()) return Tensor();
  return p.compute.reshape({p.compute.numel()});
}

void Transformer::compute_written(const std::vector<Parameter*>& ps) {
  for (Parameter* p : ps) stale_[index_of(p)] = 0;
}

void Transformer::release_compute(const std::vector<Parameter*>& ps) {
  if (flat_compute_.defined()) return;
  for (Parameter* p : ps) {
    p->compute = Tensor();
    stale_[index_of(p)] = 1;
  }
}

std::vector<int64_t> Transformer::block_index() const {
  std::vector<int64_t> b;
  if (part_.embedding) b.push_back(-1);
  b.insert(b.end(), part_.layers.begin(), part_.layers.end());
  if (part_.head) b.push_back(-1);
  return b;
}

std::vector<Parameter*> Transformer::unit_parameters(size_t u) const {
  const auto [a, b] = unit_ranges_.at(u);
  return {params_.begin() + long(a), params_.begin() + long(b)};
}

void Transformer::init_weights(uint64_t seed) {
  if (!flat_params_.defined()) throw std::logic_error("init_weights on a model without replicated parameters");
  for (Parameter* p : params_) {
    std::vector<float> host(size_t(p->value.numel()));
    init_range(*p, seed, 0, p->value.numel(), host.data());
    dev_.upload(p->value, host.data(), host.size() * sizeof(float));
  }
  params_changed();
}

void Transformer::zero_grad() {
  if (flat_grads_.defined()) dev_.fill(flat_grads_, 0.0f);
}

StepContext Transformer::make_context(const int32_t* samples, int64_t n, int64_t t, float loss_grad_scale,
                                      bool need_backward) {
  const SequenceShard shard = sequence_shard(t, cp_);
  const int64_t local = shard.local_len();
  std::vector<int32_t> in(size_t(n * local)), tg(size_t(n * local));
  shard_samples(shard, samples, n, in.data(), tg.data());
  StepContext ctx;
  ctx.dev = &dev_;
  ctx.tp = tp_;
  ctx.cp = cp_;
  ctx.ep = ep_;
  ctx.shard = shard;
  ctx.batch = n;
  ctx.seq_len = local;
  ctx.loss_grad_scale = loss_grad_scale;
  ctx.need_backward = need_backward;
  ctx.act_dtype = compute_dtype_;
  ctx.moe_force_load_balance = moe_force_load_balance_;
  std::tie(ctx.rope_cos, ctx.rope_sin) = rope_tables(t);
  ctx.tokens = dev_.empty({n * local}, DType::kI32, MemCategory::kActivations);
  ctx.targets = dev_.empty({n * local}, DType::kI32, MemCategory::kActivations);
  dev_.upload(ctx.tokens, in.data(), in.size() * sizeof(int32_t));
  dev_.upload(ctx.targets, tg.data(), tg.size() * sizeof(int32_t));
  if (doc_eos_ >= 0) {  // from the whole samples: every cp rank needs every position's document
    ctx.doc_start_host = document_starts(samples, n, t, doc_eos_);
    ctx.doc_start = dev_.empty({n, t}, DType::kI32, MemCategory::kActivations);
    dev_.upload(ctx.doc_start, ctx.doc_start_host.data(), ctx.doc_start_host.size() * sizeof(int32_t));
  }
  return ctx;
}

Parameter* Transformer::find(const std::string& name) const {
  for (Parameter* p : params_)
    if (p->name == name) return p;
  return nullptr;
}

std::vector<double> rope_frequencies(const ModelArgs& a) {
  const int64_t half = a.head_dim / 2;
  std::vector<double> f(half);
  for (int64_t j = 0; j < half; ++j) {
    double freq = std::pow(a.rope_theta, -2.0 * double(j) / double(a.head_dim));
    if (a.use_rope_scaling) {
      // Meta's llama3 apply_scaling (Llama 3.1): keep high frequencies, divide low ones by the
      // factor, interpolate smoothly in between.
      const double wavelen = 2.0 * std::numbers::pi / freq;
      const double low_wavelen = double(a.rope_original_max_seq_len) / a.rope_low_freq_factor;
      const double high_wavelen = double(a.rope_original_max_seq_len) / a.rope_high_freq_factor;
      if (wavelen > low_wavelen) {
        freq = freq / a.rope_scaling_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (double(a.rope_original_max_seq_len) / wavelen - a.rope_low_freq_factor) /
                              (a.rope_high_freq_factor - a.rope_low_freq_factor);
        freq = (1.0 - smooth) * freq / a.rope_scaling_factor + smooth * freq;
      }
    }
    f[j] = freq;
  }
  return f;
}

std::pair<Tensor, Tensor> Transformer::rope_tables(int64_t seq_len) {
  if (seq_len != rope_len_) {
    const auto freqs = rope_frequencies(args_);
    const int64_t half = int64_t(freqs.size());
    std::vector<float> c(size_t(seq_len * half)), s(c.size());
    for (int64_t t = 0; t < seq_len; ++t)
      for (int64_t j = 0; j < half; ++j) {
        const double ang = double(t) * freqs[j];
        c[t * half + j] = float(std::cos(ang));
        s[t * half + j] = float(std::sin(ang));
      }
    rope_cos_ = dev_.empty({seq_len, half}, DType::kF32, MemCategory::kActivations);
    rope_sin_ = dev_.empty({seq_len, half}, DType::kF32, MemCategory::kActivations);
    dev_.upload(rope_cos_, c.data(), c.size() * 4);
    dev_.upload(rope_sin_, s.data(), s.size() * 4);
    rope_len_ = seq_len;
  }
  return {rope_cos_, rope_sin_};
}

}  // namespace meshtrain
