#include "optim/muon.hpp"

#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>

#include "optim/newton_schulz.hpp"

namespace meshtrain {

namespace {

constexpr int64_t kAlign = 16;  // elements: 64-byte aligned state views, as AdamW

/// A contiguous run of one matrix: `len` elements at `local_off` in the holder's shard and at
/// `unit_off` in the matrix's tp-local layout.
struct Piece {
  size_t m = 0;
  int64_t local_off = 0, unit_off = 0, len = 0;
  int64_t t = 0;  ///< in the tp exchange: the tp rank whose slab this is
};

/// Steps 1 and 4 of the plan over one shard group.
struct GroupExchange {
  Communicator* comm = nullptr;  ///< nullptr or size 1: nothing travels
  int64_t size = 1, rank = 0;
  std::vector<std::vector<Piece>> send;  ///< [peer]: my pieces of the matrices `peer` owns
  std::vector<std::vector<Piece>> recv;  ///< [peer]: its pieces of the matrices I own
  std::vector<Piece> local;              ///< my pieces of the matrices I own
  bool collective() const { return comm && size > 1; }
};

std::vector<int64_t> row_counts(const std::vector<std::vector<Piece>>& per_peer) {
  std::vector<int64_t> c;
  for (const auto& v : per_peer) {
    int64_t n = 0;
    for (const Piece& p : v) n += p.len;
    c.push_back(n);
  }
  return c;
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t x : v) n += x;
  return n;
}

/// One uneven all-to-all over `comm`: the pieces in outgoing[peer] (`pack` writes each into its
/// place of the send buffer) go to each peer, and the pieces in incoming[peer] arrive, each handed to `sink` with its values.
void exchange(Device& dev, Communicator& comm, const std::vector<std::vector<Piece>>& outgoing,
              const std::vector<std::vector<Piece>>& incoming, const std::function<void(const Piece&, const Tensor&)>& pack,
              const std::function<void(const Piece&, const Tensor&)>& sink) {
  const std::vector<int64_t> sc = row_counts(outgoing), rc = row_counts(incoming);
  Tensor in = dev.empty({total(sc)}, DType::kF32, MemCategory::kCommunication);
  Tensor out = dev.empty({total(rc)}, DType::kF32, MemCategory::kCommunication);
  int64_t o = 0;
  for (const auto& v : outgoing)
    for (const Piece& p : v) pack(p, in.view({p.len}, o)), o += p.len;
  comm.all_to_all_v(in, sc, out, rc)->wait();
  o = 0;
  for (const auto& v : incoming)
    for (const Piece& p : v) sink(p, out.view({p.len}, o)), o += p.len;
}

float update_scale(const OptimizerSection& c, int64_t rows, int64_t cols) {
  const double m = double(rows), n = double(cols);
  double s = 1.0;
  if (c.muon_scale_mode == "spectral") s = std::sqrt(std::max(m, n));
  else if (c.muon_scale_mode == "shape_scaling") s = std::sqrt(std::max(1.0, m / n));
  else if (c.muon_scale_mode == "unit_rms_norm") s = std::sqrt(m / n);
  else throw std::invalid_argument("[optimizer] muon_scale_mode: unknown mode \"" + c.muon_scale_mode + "\"");
  return float(s * c.muon_extra_scale_factor);
}

}  // namespace

struct Muon::Exchange {
  std::vector<GroupExchange> groups;
  int64_t tp = 1, t_me = 0;
  std::vector<int64_t> tl_offset;      ///< matrix -> offset in the tp-local buffer (I am its shard owner), or -1
  int64_t tl_elems = 0;
  std::vector<int64_t> global_offset;  ///< matrix -> offset in the assembled buffer (I own a tp-split one), or -1
  int64_t global_elems = 0;
  std::vector<size_t> shard_owned;     ///< matrices whose shard owner I am, in plan order
  /// Steps 2 and 4 over tp, seen from a shard owner, per tp peer t, in plan order: gather_out[t]
  /// my slabs (each my whole tp-local matrix) of the tp-split matrices t owns, gather_in[t] t's
  /// slabs of those I own; scatter_out / scatter_in the way back, plus the matrices replicated
  /// over tp, which travel only back and whole. tp_own: my own slab of the tp-split ones I own.
  std::vector<std::vector<Piece>> gather_out, gather_in, scatter_out, scatter_in;
  std::vector<Piece> tp_own;
};

Muon::Muon(const std::vector<LocalShard>& shards, Device& dev, const OptimizerSection& cfg, MuonComms comms)
    : shards_(shards), dev_(dev), cfg_(cfg), comms_(std::move(comms)), ex_(std::make_unique<Exchange>()) {
  if (cfg_.muon_num_ns_steps < 0) throw std::invalid_argument("[optimizer] muon_num_ns_steps must be >= 0");
  (void)update_scale(cfg_, 1, 1);  // an unknown scale mode fails here, not at the first step
  std::vector<const Parameter*> muon_params(shards.size(), nullptr);
  std::vector<int> group_of(shards.size(), -1);
  std::vector<MuonGroupInfo> infos;
  std::map<Communicator*, int> group_index;
  adam_index_.assign(shards.size(), -1);
  mom_offset_.assign(shards.size(), -1);
  for (size_t i = 0; i < shards.size(); ++i) {
    const LocalShard& s = shards[i];
    if (!muon_orthogonalizes(*s.param)) {
      adam_index_[i] = int64_t(adam_shards_.size());
      adam_shards_.push_back(s);
      continue;
    }
    muon_params[i] = s.param;
    mom_offset_[i] = mom_elems_;
    mom_elems_ += (s.value.numel() + kAlign - 1) / kAlign * kAlign;
    Communicator* c = comms_.shard_group ? comms_.shard_group(*s.param) : nullptr;
    auto [it, fresh] = group_index.try_emplace(c, int(infos.size()));
    if (fresh) {
      infos.push_back({c ? c->size() : 1, c ? c->rank() : 0});
      GroupExchange ge;
      ge.comm = c;
      ge.size = infos.back().size;
      ge.rank = infos.back().rank;
      ge.send.resize(size_t(ge.size));
      ge.recv.resize(size_t(ge.size));
      ex_->groups.push_back(std::move(ge));
    }
    group_of[i] = it->second;
    // The exchange assumes FSDP's dim-0 rows; a shard of any other shape would be misplaced.
    const MuonGroupInfo& g = infos[size_t(it->second)];
    const ElemRange mine = shard_elements(s.param->local_shape, g.size, g.rank);
    if (mine.first != s.first_elem || mine.count != s.value.numel())
      throw std::invalid_argument(s.param->name + ": local shard [" + std::to_string(s.first_elem) + ", +" +
                                  std::to_string(s.value.numel()) + ") is not the dim-0 rows Muon's exchange expects");
  }
  OptimizerSection adam_cfg = cfg_;
  adam_cfg.weight_decay = cfg_.adamw_weight_decay.value_or(cfg_.weight_decay);
  adam_ = std::make_unique<AdamW>(adam_shards_, dev, adam_cfg);
  mom_ = dev.zeros({std::max<int64_t>(mom_elems_, 1)}, DType::kF32, MemCategory::kOptimizer);

  Exchange& x = *ex_;
  x.tp = comms_.tp ? comms_.tp->size() : 1;
  x.t_me = comms_.tp ? comms_.tp->rank() : 0;
  matrices_ = plan_muon_matrices(muon_params, group_of, infos, x.tp, int(cfg_.muon_num_ns_steps));
  x.tl_offset.assign(matrices_.size(), -1);
  for (auto* v : {&x.gather_out, &x.gather_in, &x.scatter_out, &x.scatter_in}) v->resize(size_t(x.tp));
  x.global_offset.assign(matrices_.size(), -1);
  for (size_t k = 0; k < matrices_.size(); ++k) {
    const MuonMatrix& m = matrices_[k];
    GroupExchange& ge = x.groups[size_t(m.group)];
    const LocalShard& s = shards[m.shard];
    const ElemRange unit{m.offset(x.t_me, x.tp), m.local_elems(x.t_me, x.tp)};
    for (int64_t r = 0; r < ge.size; ++r) {
      const ElemRange piece = intersect(shard_elements(s.param->local_shape, ge.size, r), unit);
      if (piece.count == 0) continue;
      const Piece p{k, piece.first - s.first_elem, piece.first - unit.first, piece.count};
      if (r == ge.rank && m.s_owner == ge.rank) ge.local.push_back(p);
      else if (r == ge.rank) ge.send[size_t(m.s_owner)].push_back(p);
      else if (m.s_owner == ge.rank) ge.recv[size_t(r)].push_back(p);
    }
    if (m.s_owner != ge.rank) continue;
    x.shard_owned.push_back(k);
    x.tl_offset[k] = x.tl_elems;
    x.tl_elems += unit.count;
    if (x.tp == 1) continue;
    if (m.tp_split >= 0 && m.t_owner == x.t_me) {
      x.global_offset[k] = x.global_elems;
      x.global_elems += m.rows * m.cols;
      x.tp_own.push_back({k, 0, 0, unit.count, x.t_me});
    }
    for (int64_t t = 0; t < x.tp; ++t) {
      if (t == x.t_me) continue;
      if (m.tp_split < 0) {  // replicated over tp: nothing to gather, the result goes out whole
        if (m.t_owner == x.t_me) x.scatter_out[size_t(t)].push_back({k, 0, 0, unit.count, t});
        else if (m.t_owner == t) x.scatter_in[size_t(t)].push_back({k, 0, 0, unit.count, t});
      } else if (m.t_owner == x.t_me) {
        x.gather_in[size_t(t)].push_back({k, 0, 0, m.local_elems(t, x.tp), t});
        x.scatter_out[size_t(t)].push_back(x.gather_in[size_t(t)].back());
      } else if (m.t_owner == t) {
        x.gather_out[size_t(t)].push_back({k, 0, 0, unit.count, x.t_me});
        x.scatter_in[size_t(t)].push_back(x.gather_out[size_t(t)].back());
      }
    }
  }
}

Muon::~Muon() = default;

const std::string& Muon::name() const {
  static const std::string n = "Muon";
  return n;
}

void Muon::set_step_count(int64_t t) {
  t_ = t;
  adam_->set_step_count(t);
}

std::vector<std::string> Muon::state_names(const Parameter& p) const {
  if (muon_orthogonalizes(p)) return {"momentum_buffer"};
  return adam_->state_names(p);
}

std::vector<Tensor> Muon::state_of(size_t shard) const {
  if (mom_offset_.at(shard) >= 0) return {mom_.view({shards_[shard].value.numel()}, mom_offset_[shard])};
  return adam_->state_of(size_t(adam_index_[shard]));
}

void Muon::step(float lr, float grad_scale) {
  ++t_;
  // The AdamW group, at its own base rate scaled by the same schedule.
  const double adam_lr = cfg_.adamw_lr.value_or(cfg_.lr);
  adam_->step(cfg_.lr > 0 ? float(double(lr) * adam_lr / cfg_.lr) : lr, grad_scale);
  if (matrices_.empty()) return;
  if (grad_scale != 1.0f)
    for (size_t i = 0; i < shards_.size(); ++i)
      if (mom_offset_[i] >= 0 && shards_[i].grad.numel() > 0) dev_.scale(shards_[i].grad, grad_scale);
  Exchange& x = *ex_;
  const float mu = float(cfg_.muon_momentum);
  // Momentum and the (Nesterov) direction U, both sharded like the gradients.
  Tensor u = dev_.empty({mom_elems_}, DType::kF32, MemCategory::kTemporaries);
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (mom_offset_[i] < 0) continue;
    const int64_t n = shards_[i].value.numel();
    if (n == 0) continue;
    const Tensor m = mom_.view({n}, mom_offset_[i]), ui = u.view({n}, mom_offset_[i]);
    dev_.scale(m, mu);
    dev_.add(m, shards_[i].grad, 1.0f - mu);
    if (cfg_.muon_use_nesterov) {
      dev_.copy(ui, shards_[i].grad);
      dev_.scale(ui, 1.0f - mu);
      dev_.add(ui, m, mu);
    } else {
      dev_.copy(ui, m);
    }
  }
  auto shard_view = [&](const Tensor& flat, const Piece& p) {
    return flat.view({p.len}, mom_offset_[matrices_[p.m].shard] + p.local_off);
  };
  Tensor tl = dev_.empty({x.tl_elems}, DType::kF32, MemCategory::kTemporaries);
  auto tl_view = [&](const Piece& p) { return tl.view({p.len}, x.tl_offset[p.m] + p.unit_off); };
  // Step 1: rows of U to each matrix's shard owner.
  for (GroupExchange& ge : x.groups) {
    for (const Piece& p : ge.local) dev_.copy(tl_view(p), shard_view(u, p));
    if (ge.collective())
      exchange(dev_, *ge.comm, ge.send, ge.recv, [&](const Piece& p, const Tensor& dst) { dev_.copy(dst, shard_view(u, p)); },
               [&](const Piece& p, const Tensor& v) { dev_.copy(tl_view(p), v); });
  }
  // Step 2: tp slabs to the tp owner, which assembles the global matrix.
  Tensor global = dev_.empty({x.global_elems}, DType::kF32, MemCategory::kTemporaries);
  auto matrix_of = [&](size_t k) -> Tensor {  // what the owner orthogonalizes, [rows, cols]
    const MuonMatrix& m = matrices_[k];
    return (x.global_offset[k] >= 0 ? global.view({m.rows * m.cols}, x.global_offset[k])
                                    : tl.view({m.rows * m.cols}, x.tl_offset[k]))
        .reshape({m.rows, m.cols});
  };
  auto own_tl = [&](const Piece& p) { return tl.view({p.len}, x.tl_offset[p.m]); };
  // Copies tp rank p.t's slab [local_rows(t) · local_cols(t)] between `flat` and the global matrix.
  auto slab = [&](const Piece& p, const Tensor& flat, bool into_global) {
    const MuonMatrix& m = matrices_[p.m];
    const Tensor g = matrix_of(p.m);
    const int64_t lr_ = m.local_rows(p.t, x.tp), lc = m.local_cols(p.t, x.tp), first = m.slab_first(p.t, x.tp);
    if (m.tp_split == 0) {
      const Tensor rows = g.reshape({m.rows * m.cols}).view({lr_ * lc}, first * m.cols);
      into_global ? dev_.copy(rows, flat) : dev_.copy(flat, rows);
    } else {
      const Tensor s = flat.reshape({lr_, lc});
      into_global ? dev_.copy_columns(g, first, s, 0, lc) : dev_.copy_columns(s, 0, g, first, lc);
    }
  };
  for (const Piece& p : x.tp_own) slab(p, own_tl(p), true);
  if (x.tp > 1)
    exchange(dev_, *comms_.tp, x.gather_out, x.gather_in, [&](const Piece& p, const Tensor& dst) { dev_.copy(dst, own_tl(p)); },
             [&](const Piece& p, const Tensor& v) { slab(p, v, true); });
  // Step 3: orthogonalize what this rank owns.
  last_flops_ = 0;
  for (size_t k : x.shard_owned) {
    const MuonMatrix& m = matrices_[k];
    if (m.t_owner != x.t_me) continue;
    newton_schulz_orthogonalize(dev_, matrix_of(k), int(cfg_.muon_num_ns_steps));
    last_flops_ += newton_schulz_flops(m.rows, m.cols, int(cfg_.muon_num_ns_steps));
  }
  // Step 2 backwards: slabs (or a tp-replicated matrix whole) from the tp owner.
  for (const Piece& p : x.tp_own) slab(p, own_tl(p), false);
  if (x.tp > 1)
    exchange(dev_, *comms_.tp, x.scatter_out, x.scatter_in,
             [&](const Piece& p, const Tensor& dst) {
               if (matrices_[p.m].tp_split < 0) dev_.copy(dst, own_tl(p));
               else slab(p, dst, false);
             },
             [&](const Piece& p, const Tensor& v) { dev_.copy(own_tl(p), v); });
  // Weight decay, then step 1 backwards and the update W -= lr·s·O piece by piece.
  const float decay = 1.0f - lr * float(cfg_.weight_decay);
  for (size_t i = 0; i < shards_.size(); ++i)
    if (mom_offset_[i] >= 0 && shards_[i].value.numel() > 0 && decay != 1.0f &&
        (shards_[i].param->weight_decay || cfg_.decay_embeddings_and_norms))
      dev_.scale(shards_[i].value, decay);
  auto apply = [&](const Piece& p, const Tensor& o) {
    const MuonMatrix& m = matrices_[p.m];
    const LocalShard& s = shards_[m.shard];
    dev_.add(s.value.view({p.len}, p.local_off), o, -lr * update_scale(cfg_, m.rows, m.cols));
  };
  for (GroupExchange& ge : x.groups) {
    for (const Piece& p : ge.local) apply(p, tl_view(p));
    if (ge.collective())
      exchange(dev_, *ge.comm, ge.recv, ge.send, [&](const Piece& p, const Tensor& dst) { dev_.copy(dst, tl_view(p)); },
               apply);
  }
}

}  // namespace meshtrain
