#include "plan/activation_model.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace meshtrain {

namespace {

// Bytes alive in the activations category and their high-water mark.
struct Live {
  int64_t now = 0, peak = 0;
  int64_t phase = 0;  // the high-water mark since begin_phase()
  void alloc(int64_t b) {
    now += b;
    peak = std::max(peak, now);
    phase = std::max(phase, now);
  }
  void begin_phase() { phase = now; }
  void free(int64_t b) { now -= b; }
};

// The sizes one micro-batch's layers allocate (bytes; see the header's symbols).
struct Sizes {
  int64_t beta, N, n, D, Q, K, F, V, hq, hk;
  bool sp;      // sequence parallelism with tp > 1: gathers and reduce-scatters allocate
  bool qk_norm;
  bool cp = false;  // context parallelism: per-op checkpointing keeps the exchange's q and k too
  // Chunked cross-entropy ([model] loss_chunk_tokens = C, 0 < C < N): the head's logits exist
  // one [C, V] chunk at a time, and the forward keeps lse [N] f32 instead of [N, V] logits.
  int64_t C = 0;
  int64_t head_kept() const { return C > 0 ? N * 4 : N * V * beta; }
  // MoE
  int64_t E = 0, k = 0, H = 0, Hs = 0, rows_in = 0;
  bool ep = false, aux = false;
  int64_t b = 0;
  // A split backward (I of a zero-bubble schedule): the tensors the weight-gradient terms read
  // stay alive until W (model/weight_grad_queue.hpp) instead of dying with the backward.
  bool split = false;
  int64_t nD() const { return n * D * beta; }
  int64_t ND() const { return N * D * beta; }
};

// tp_enter: an all-gather into a new [N, D] tensor under sequence parallelism, else the input.
int64_t enter(Live& m, const Sizes& s) {
  if (!s.sp) return 0;
  m.alloc(s.ND());
  return s.ND();
}

// tp_exit of a [N, D] partial sum: under sequence parallelism a new [n, D] shard, the partial
// freed when the caller's local dies (the caller frees it); otherwise the sum in place.
void exit_alloc(Live& m, const Sizes& s) {
  if (s.sp) m.alloc(s.nD());
}

// Attention::forward on its normed input (alive, nD). Returns the bytes it saves (beside the
// normed input, which it saves itself without sequence parallelism: counted in the return).
// At return the output (nD) is alive; everything else not saved is freed.
int64_t attention_forward(Live& m, const Sizes& s, bool keep) {
  int64_t saved = s.sp ? enter(m, s) : s.nD();  // x: the gathered copy, or the normed input itself
  auto project = [&](int64_t width, int64_t heads) {
    m.alloc(s.N * width * s.beta);  // the projection
    saved += s.N * width * s.beta;
    if (s.qk_norm) {  // rmsnorm_forward saves its input and rstd; its output is the new q / k
      m.alloc(s.N * width * s.beta + s.N * heads * 4);
      saved += s.N * width * s.beta + s.N * heads * 4;
    }
  };
  project(s.Q, s.hq);
  project(s.K, s.hk);
  m.alloc(s.N * s.K * s.beta);  // v
  m.alloc(s.N * s.Q * s.beta);  // o
  m.alloc(s.N * s.hq * 4);      // lse
  saved += s.N * s.K * s.beta + s.N * s.Q * s.beta + s.N * s.hq * 4;
  m.alloc(s.ND());  // the output projection
  exit_alloc(m, s);
  if (s.sp) m.free(s.ND());
  // Not kept (activation checkpointing's first pass): the locals die at return. The normed
  // input (not ours without sp) is the caller's.
  if (!keep) m.free(saved - (s.sp ? 0 : s.nD()));
  return saved;
}

// FeedForward::forward on its normed input; the same contract as attention_forward.
int64_t ffn_forward(Live& m, const Sizes& s, int64_t width, bool keep) {
  int64_t saved = s.sp ? enter(m, s) : s.nD();
  m.alloc(3 * s.N * width * s.beta);  // a, b, h
  saved += 3 * s.N * width * s.beta;
  m.alloc(s.ND());
  exit_alloc(m, s);
  if (s.sp) m.free(s.ND());
  if (!keep) m.free(saved - (s.sp ? 0 : s.nD()));
  return saved;
}

// MoE::forward on its normed input [n, D] (routed experts on local tokens, shared experts
// tensor-parallel like a FeedForward). Returns the bytes saved besides the input.
int64_t moe_forward(Live& m, const Sizes& s, bool keep) {
  const int64_t n = s.n, R = n * s.k;
  int64_t saved = 0;
  const int64_t router = 2 * n * s.E * 4 + 2 * n * s.k * 4;  // logits, scores; topk, gates
  m.alloc(router);
  m.alloc(n * s.k * 4 + R * 4);  // rows (saved), src
  m.alloc(R * s.D * s.beta);     // xs
  saved += router + n * s.k * 4;
  int64_t re = R;
  if (s.ep) {
    m.alloc(2 * s.E * 4);       // counts sent and received
    m.free(s.E * 4);            // the sent counts die with start_exchange
    re = s.rows_in;
    m.alloc(2 * re * 4);        // perm, inv_perm
    m.alloc(re * s.D * s.beta); // xe, in (local expert, source) order
    saved += s.E * 4 + 2 * re * 4;
  }
  saved += re * s.D * s.beta;   // xe (xs itself without ep)
  m.alloc(3 * re * s.H * s.beta + re * s.D * s.beta);  // a, b, h; the experts' output
  saved += 3 * re * s.H * s.beta;
  if (s.ep) m.alloc(R * s.D * s.beta);  // the output back in this rank's order
  saved += R * s.D * s.beta;            // y
  m.alloc(s.nD());                      // the combined output
  if (s.aux) {
    m.alloc(n * 4 + s.b * s.E * 4);  // sample ids, coefficients
    saved += n * 4 + s.b * s.E * 4;
  }
  m.free(R * 4);  // src
  if (s.ep) m.free(R * s.D * s.beta + re * s.D * s.beta);  // xs and the experts' output rows
  if (s.Hs > 0) {  // the shared experts: a FeedForward over the same input
    saved += ffn_forward(m, s, s.Hs, true) - (s.sp ? 0 : s.nD());
    m.free(s.nD());  // its output, added into ours
  }
  if (!keep) m.free(saved);
  return saved;
}

// FeedForward::backward with its saved tensors alive; dout [n, D] alive (the caller's).
// Leaves dx [n, D] alive and frees what it saved.
// Split: only dh, the partial dx and the saved a, b die; dout (gathered), da, db, h and the
// input stay for W (w2 reads dout and h, w1 and w3 da, db and the input).
void ffn_backward(Live& m, const Sizes& s, int64_t width, int64_t saved) {
  const int64_t dout_g = enter(m, s);
  m.alloc(3 * s.N * width * s.beta);  // dh, da, db
  m.alloc(s.ND());                    // dx
  exit_alloc(m, s);
  if (s.split) {
    m.free(s.N * width * s.beta + (s.sp ? s.ND() : 0) + 2 * s.N * width * s.beta);
    return;
  }
  m.free(dout_g + 3 * s.N * width * s.beta + (s.sp ? s.ND() : 0));
  m.free(saved);  // its saved tensors, the normed input included, die with its locals
}

// MoE::backward with its saved tensors (`saved`, without its input) and its input alive.
// Leaves dx [n, D] alive; frees the rest, the input included.
// Split: the experts' terms keep the gradient rows at the experts, h, da, db and xe, the
// gate's keeps its logits' gradient (activation dtype) and the input; the shared experts keep
// what a FeedForward keeps.
void moe_backward(Live& m, const Sizes& s, int64_t saved) {
  const int64_t n = s.n, R = n * s.k;
  int64_t shared = 0;
  if (s.Hs > 0) {  // the shared experts first: their saved tensors die at once, their dx stays
    const int64_t dout_g = enter(m, s);
    m.alloc(3 * s.N * s.Hs * s.beta + s.ND());
    exit_alloc(m, s);
    const int64_t sh_saved = (s.sp ? s.ND() : 0) + 3 * s.N * s.Hs * s.beta;
    if (s.split)  // dh, the partial dx and the saved a, b die
      m.free(s.N * s.Hs * s.beta + (s.sp ? s.ND() : 0) + 2 * s.N * s.Hs * s.beta);
    else
      m.free(dout_g + 3 * s.N * s.Hs * s.beta + (s.sp ? s.ND() : 0) + sh_saved);
    saved -= sh_saved;
    shared = s.nD();
  }
  const int64_t re = s.ep ? s.rows_in : R;
  const int64_t temps = R * s.D * s.beta + n * s.k * 4                 // dy, dgates
                        + (s.ep ? re * s.D * s.beta : 0)                 // dy at the experts
                        + 3 * re * s.H * s.beta                          // dh, da, db
                        + 2 * re * s.D * s.beta                          // dxe, dxe3
                        + (s.ep ? R * s.D * s.beta : 0)                  // dxs back here
                        + (s.aux ? n * s.E * 4 : 0) + n * s.E * 4        // balance-loss and router grads
                        + (s.beta != 4 ? n * s.E * s.beta : 0);          // dlogits in the activation dtype
  m.alloc(temps);
  m.alloc(s.nD());  // dx
  if (s.split) {
    const int64_t kept_temps = re * s.D * s.beta /* dy at the experts */ + 2 * re * s.H * s.beta /* da, db */ +
                               (s.beta != 4 ? n * s.E * s.beta : n * s.E * 4) /* the gate's dy */;
    const int64_t kept_saved = re * s.H * s.beta /* h */ + re * s.D * s.beta /* xe */;
    m.free(temps - kept_temps + shared + saved - kept_saved);
    return;
  }
  m.free(temps + shared + saved + s.nD() /* the input */);
}

// Attention::backward with its saved tensors alive; dh [n, D] alive. Leaves dx [n, D].
void attention_backward(Live& m, const Sizes& s, int64_t saved) {
  const int64_t dout_g = enter(m, s);
  m.alloc(s.N * s.Q * s.beta);                            // d_o
  m.alloc(s.N * s.Q * s.beta);                            // dq
  m.alloc(2 * s.N * s.K * s.beta);                        // dk, dv
  if (s.qk_norm) {  // each norm's backward allocates a new gradient and frees its saved pair
    m.alloc(s.N * s.K * s.beta);
    if (!s.split) m.free(s.N * s.K * s.beta + s.N * s.hk * 4);
    m.alloc(s.N * s.Q * s.beta);
    if (!s.split) m.free(s.N * s.Q * s.beta + s.N * s.hq * 4);
    saved -= s.N * s.K * s.beta + s.N * s.hk * 4 + s.N * s.Q * s.beta + s.N * s.hq * 4;
  }
  m.alloc(s.ND());  // dx
  exit_alloc(m, s);
  if (s.split) {
    // d_o, the partial dx and the attention kernel's q, k, v and lse die; dout (gathered), o,
    // dq, dk, dv (and the q/k norms' pairs and outputs) and the input stay for W.
    m.free(s.N * s.Q * s.beta + (s.sp ? s.ND() : 0) + s.N * (s.Q + 2 * s.K) * s.beta + s.N * s.hq * 4);
    return;
  }
  const int64_t grads = s.N * s.Q * s.beta * 2 + 2 * s.N * s.K * s.beta + (s.qk_norm ? s.N * (s.Q + s.K) * s.beta : 0);
  m.free(dout_g + grads + (s.sp ? s.ND() : 0));
  m.free(saved);  // its saved tensors, the normed input included
}

// What per-operator checkpointing (selective_ac_option = "op", SavedTensors::op) keeps of a
// block between its forward and its backward, beside the block input: the 1st, 3rd, … matmul's
// output (wq as a copy, wv; w1 and w2 as a copy of a dense FFN or of the shared experts), the
// attention kernel's output and log-sum-exp (under cp the exchange's whole state: q and k too),
// under sequence parallelism each reduce-scatter's shard (a copy), and with ep the all-to-alls'
// outputs (the received counts, the experts' rows and their results back here). The router
// and the routed experts are recomputed.
int64_t per_op_stash(const Sizes& s, bool moe) {
  int64_t kept = s.N * s.Q * s.beta /* wq */ + s.N * s.K * s.beta /* wv */ + s.N * s.Q * s.beta /* o */ +
                 s.N * s.hq * 4 /* lse */;
  if (s.cp) kept += s.N * (s.Q + s.K) * s.beta;
  const auto ffn = [&](int64_t width) { return s.N * width * s.beta /* w1 */ + s.ND() /* w2 */ + (s.sp ? s.nD() : 0); };
  if (s.sp) kept += s.nD();
  if (!moe) return kept + ffn(s.F);
  if (s.ep) kept += s.E * 4 + s.rows_in * s.D * s.beta + s.n * s.k * s.D * s.beta;
  return kept + (s.Hs > 0 ? ffn(s.Hs) : 0);
}

struct BlockSaved {
  int64_t attn = 0, ffn = 0;  // what each sub-layer saved (including a normed input it keeps)
  int64_t total = 0;          // + the block input, the two rstd and the residual h
};

// TransformerBlock::forward; the input x [n, D] is alive (the previous unit's output) and is
// saved by the first norm. At return the output [n, D] is alive.
BlockSaved block_forward(Live& m, const Sizes& s, bool moe, bool keep) {
  BlockSaved b;
  m.alloc(s.nD() + s.n * 4);  // attention_norm: y1, rstd1
  b.attn = attention_forward(m, s, keep);
  if (s.sp || !keep) m.free(s.nD());  // y1: a temporary unless attention saved it
  // h (the attention output, alive) is saved by add_rmsnorm; y2 and rstd2:
  m.alloc(s.nD() + s.n * 4);
  b.ffn = moe ? moe_forward(m, s, keep) + s.nD() : ffn_forward(m, s, s.F, keep);
  if (s.sp || !keep || moe) {
    // y2 is a temporary unless the FFN saved it (moe saves its input: counted in b.ffn).
    if (!(moe && keep)) m.free(s.nD());
  }
  if (!keep) m.free(s.nD() + 2 * s.n * 4);  // h, rstd1, rstd2 die; the input is the executor's
  b.total = s.nD() /* input */ + s.n * 4 + b.attn + s.nD() /* h */ + s.n * 4 + b.ffn;
  return b;
}

// TransformerBlock::backward with its saved tensors alive and dout [n, D] alive (the
// executor's, freed after the call). Leaves dx [n, D] alive.
void block_backward(Live& m, const Sizes& s, bool moe, const BlockSaved& b) {
  if (moe)
    moe_backward(m, s, b.ffn - s.nD());
  else
    ffn_backward(m, s, s.F, b.ffn);
  // ffn_norm's backward (residual): dh; frees rstd2, h and the FFN's dx (split: its weight
  // term reads all three).
  m.alloc(s.nD());
  if (!s.split) m.free(s.n * 4 + s.nD() + s.nD());
  attention_backward(m, s, b.attn);
  // attention_norm's backward: dx; frees rstd1, the block input, the attention's dx, and dh at
  // the block's return (split: the norm's term keeps the first three; wo's keeps dh unless
  // sequence parallelism gathered a copy of it).
  m.alloc(s.nD());
  if (!s.split)
    m.free(s.n * 4 + s.nD() + s.nD() + s.nD());
  else if (s.sp)
    m.free(s.nD());
}

}  // namespace

namespace {
ActivationPrediction replay_all(const ActivationShape& a);

// FNV-1a over a memo key's integers.
struct IntsHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ uint64_t(x)) * 1099511628211ull;
    return size_t(h);
  }
};

// One micro-batch through one stage (replay_all): the high-water mark, what its forward keeps,
// the bytes alive at the end, and the highest bytes alive during each unit's phases.
struct Replay {
  int64_t peak = 0, kept = 0, end = 0;  // end: bytes alive when the backward has returned
  std::vector<int64_t> fwd, bwd, after;  // per unit, forward order
};

// A rank's in-flight states grouped by (running stage, stages that have run a backward), the
// groups in that key's order: what replay_all merges per group. Cached per states_id (ids name
// contents and are never reused): every replay of the rank's shapes groups the same list, and a
// map keyed by a vector per state cost more than the merge itself.
struct StateGroups {
  std::vector<size_t> group_of;                            // per state
  std::vector<std::pair<size_t, std::vector<char>>> keys;  // per group, ascending
};

std::shared_ptr<const StateGroups> group_states(const std::vector<SimulationResult::InFlightState>& states) {
  std::map<std::pair<size_t, std::vector<char>>, size_t> index;
  for (const SimulationResult::InFlightState& st : states) index.try_emplace({size_t(st.running), st.backed}, 0);
  auto g = std::make_shared<StateGroups>();
  for (auto& [key, i] : index) {
    i = g->keys.size();
    g->keys.push_back(key);
  }
  for (const SimulationResult::InFlightState& st : states) g->group_of.push_back(index.at({size_t(st.running), st.backed}));
  return g;
}

std::shared_ptr<const StateGroups> cached_groups(const ActivationShape& a) {
  if (a.states_id <= 0) return group_states(*a.states);
  static std::mutex mu;
  static std::unordered_map<int64_t, std::shared_ptr<const StateGroups>> memo;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = memo.find(a.states_id);
    if (it != memo.end()) return it->second;
  }
  std::shared_ptr<const StateGroups> g = group_states(*a.states);
  std::lock_guard<std::mutex> lock(mu);
  return memo.emplace(a.states_id, std::move(g)).first->second;
}
}  // namespace

// Not memoized here: the memory model keeps each rank's prediction by its own (shorter) key,
// and a memo keyed by the stage lists cost the planner more than the replays it never saved.
std::shared_ptr<const ActivationPrediction> predict_activations(const ActivationShape& a) {
  if (!a.stages || a.stages->empty()) throw std::invalid_argument("predict_activations: no stage");
  return std::make_shared<const ActivationPrediction>(replay_all(a));
}

namespace {
ActivationPrediction replay_all(const ActivationShape& a) {
  const ModelArgs& g = a.args;
  if (a.micro_batch < 1 || a.seq_len < 1 || a.cp < 1 || a.tp < 1 || a.ep < 1 || a.in_flight < 1)
    throw std::invalid_argument("predict_activations: sizes must be >= 1");
  if (a.seq_len % a.cp || g.n_heads % a.tp || g.n_kv_heads % a.tp)
    throw std::invalid_argument("predict_activations: seq_len " + std::to_string(a.seq_len) + " over cp " +
                                std::to_string(a.cp) + " or heads over tp " + std::to_string(a.tp) + " do not split");
  Sizes s{};
  s.beta = a.act_bytes;
  s.b = a.micro_batch;
  s.N = a.micro_batch * (a.seq_len / a.cp);
  s.sp = a.tp > 1 && a.sequence_parallel;
  s.n = s.sp ? s.N / a.tp : s.N;
  s.D = g.dim;
  s.hq = g.n_heads / a.tp;
  s.hk = g.n_kv_heads / a.tp;
  s.Q = s.hq * g.head_dim;
  s.K = s.hk * g.head_dim;
  s.F = g.ffn_dim() / a.tp;
  s.V = (g.vocab_size + a.tp - 1) / a.tp;
  s.qk_norm = g.qk_norm;
  s.cp = a.cp > 1;
  // OutputHead::chunk_rows: a chunk as large as the micro-batch is the unchunked head.
  s.C = g.loss_chunk_tokens > 0 && g.loss_chunk_tokens < s.N ? g.loss_chunk_tokens : 0;
  if (g.num_experts > 0) {
    s.E = g.num_experts;
    s.k = g.top_k;
    s.H = g.moe_inter_dim;
    s.Hs = g.num_shared_experts * g.moe_inter_dim / a.tp;
    s.ep = a.ep > 1;
    s.rows_in = s.n * g.top_k;  // balanced routing: as many rows arrive as leave
    s.aux = g.aux_loss_coeff > 0;
  }

  ActivationPrediction out;
  const int64_t T = a.seq_len;  // RoPE tables cover the whole sequence on every rank
  out.persistent = 2 * T * (g.head_dim / 2) * 4;
  const int64_t context = 2 * s.N * 4;  // token ids and targets (i32) of the micro-batch

  const bool per_op = a.recompute_every < 0;  // every block, its kept operators' outputs stashed
  auto recomputed = [&](int64_t block) {
    return a.recompute_every == 1 || per_op || (a.recompute_every > 1 && block % a.recompute_every == 0);
  };
  // One micro-batch through stage `st`, forward then backward, with `held` bytes of other
  // micro-batches alive (`split`: the backward is the I of a split one, Sizes::split); returns
  // the high-water mark and sets `kept` to what its forward keeps.
  auto replay_raw = [&](const ActivationShape::Stage& st, int64_t held, bool split) {
    Sizes sz = s;
    sz.split = split;
    Replay r;
    Live m;
    m.alloc(out.persistent + held);
    std::vector<BlockSaved> saved(st.blocks.size());
    std::vector<int64_t> stash(st.blocks.size(), 0);  // per-op checkpointing's kept outputs
    const int64_t start = m.now;
    m.alloc(context);
    m.begin_phase();
    if (st.embedding) {
      m.alloc(sz.ND());  // the looked-up rows of every local token
      if (sz.sp) {
        m.alloc(sz.nD());
        m.free(sz.ND());
      }
      r.fwd.push_back(m.phase);
    } else {
      m.alloc(sz.nD());  // the stage input received from the previous stage
    }
    for (size_t i = 0; i < st.blocks.size(); ++i) {
      m.begin_phase();
      saved[i] = block_forward(m, sz, g.is_moe_layer(st.blocks[i]), !recomputed(st.blocks[i]));
      if (per_op) {  // counted once the block's locals are gone (the copies' transient is not modelled)
        stash[i] = per_op_stash(sz, g.is_moe_layer(st.blocks[i]));
        m.alloc(stash[i]);
      }
      r.fwd.push_back(m.phase);
    }
    m.begin_phase();
    if (st.head) {
      m.alloc(sz.nD() + sz.n * 4);   // norm output and rstd
      if (sz.sp) {                  // the gathered normed input; the shard is freed
        m.alloc(sz.ND());
        m.free(sz.nD());
      }
      if (sz.C > 0) {  // lse kept; each chunk's logits die with the chunk
        m.alloc(sz.head_kept());
        m.alloc(sz.C * sz.V * sz.beta);
        m.free(sz.C * sz.V * sz.beta);
      } else {
        m.alloc(sz.head_kept());  // logits, overwritten in place by their gradient
      }
      r.fwd.push_back(m.phase);
    } else {
      m.free(sz.nD());              // the stage output, sent
    }
    r.kept = m.now - start;
    std::vector<int64_t> bwd, after;  // reverse order, flipped below
    m.begin_phase();
    if (st.head) {
      m.alloc(sz.ND());  // dh
      if (sz.C > 0) {  // each chunk's logits recomputed and turned into their gradient
        m.alloc(sz.C * sz.V * sz.beta);
        m.free(sz.C * sz.V * sz.beta);
      }
      if (sz.sp) {
        m.alloc(sz.nD());
        m.free(sz.ND());
      }
      m.alloc(sz.nD());  // the norm's dx
      // Split: the output projection's term reads h and the logits' gradient, the norm's its
      // input, rstd and dh: nothing dies before W. A chunked head computes its weight gradient
      // in B (OutputHead), so h and lse die there; only the norm's operands wait for W.
      if (!sz.split) m.free(sz.n * 4 + sz.nD() /* input */ + sz.ND() + sz.head_kept() + sz.nD() /* dh */);
      else if (sz.C > 0) m.free(sz.ND() + sz.head_kept());
      bwd.push_back(m.phase);
      after.push_back(m.now);
    } else {
      m.alloc(sz.nD());  // the gradient received from the next stage
    }
    for (size_t i = st.blocks.size(); i-- > 0;) {
      m.begin_phase();
      const bool moe = g.is_moe_layer(st.blocks[i]);
      if (recomputed(st.blocks[i])) {
        m.free(stash[i]);  // the replay hands the stash on as the saved tensors it stands for
        const int64_t before = m.now;
        saved[i] = block_forward(m, sz, moe, true);
        m.free(m.now - before - (saved[i].total - sz.nD()));  // the rerun's output, dropped
      }
      block_backward(m, sz, moe, saved[i]);
      // The incoming gradient, replaced by the block's dx (split without sequence parallelism:
      // w2 — of the FFN or the shared experts — reads it as its dout).
      if (!sz.split || sz.sp || (moe && sz.Hs == 0)) m.free(sz.nD());
      bwd.push_back(m.phase);
      after.push_back(m.now);
    }
    if (st.embedding) {
      m.begin_phase();
      const int64_t gathered = enter(m, sz);
      if (!sz.split) m.free(gathered);  // split: the scatter-add's term reads it at W
      bwd.push_back(m.phase);
      after.push_back(m.now);
    }
    r.bwd.assign(bwd.rbegin(), bwd.rend());
    r.after.assign(after.rbegin(), after.rend());
    r.peak = m.peak;
    r.end = m.now;
    return r;
  };
  // A stage's replay with nothing else held depends on the sizes and on which of its blocks are
  // recomputed or MoE, not on the rank's in-flight states: the pipeline ranks of every schedule
  // and micro-batch count over one split repeat a few stage shapes, so those replays are kept
  // (per thread, bounded) and only the merges below run per rank.
  thread_local std::unordered_map<std::vector<int64_t>, Replay, IntsHash> stage_memo;
  const std::vector<int64_t> shape_key = {g.dim, g.n_heads, g.n_kv_heads, g.head_dim, g.vocab_size, g.ffn_dim(),
                                          g.num_experts, g.top_k, g.moe_inter_dim, g.num_shared_experts,
                                          int64_t(g.qk_norm), int64_t(g.aux_loss_coeff > 0), a.micro_batch, a.seq_len,
                                          a.cp, a.tp, a.ep, int64_t(a.sequence_parallel), a.act_bytes,
                                          int64_t(per_op), s.C};
  // Cleared here only, before this call's replays: the references stage_replay hands out stay
  // valid through the call (an unordered_map's elements survive its rehashes).
  if (stage_memo.size() > 16384) stage_memo.clear();
  thread_local std::vector<int64_t> key;  // reused: no allocation per lookup
  auto stage_replay = [&](const ActivationShape::Stage& st, bool split) -> const Replay& {
    key.assign(shape_key.begin(), shape_key.end());
    key.insert(key.end(), {int64_t(st.embedding), int64_t(st.head), int64_t(split), int64_t(st.blocks.size())});
    for (int64_t b : st.blocks) key.push_back(int64_t(recomputed(b)) + 2 * int64_t(g.is_moe_layer(b)));
    const auto it = stage_memo.find(key);
    if (it != stage_memo.end()) return it->second;
    return stage_memo.emplace(key, replay_raw(st, 0, split)).first->second;
  };
  auto replay = [&](const ActivationShape::Stage& st, int64_t held, bool split) {
    return held != 0 ? replay_raw(st, held, split) : stage_replay(st, split);
  };

  const std::vector<ActivationShape::Stage>& stages = *a.stages;
  // Earlier micro-batches of a pipeline schedule hold their forwards' bytes (those of the
  // stage keeping the most) while one more runs through the stage that peaks highest.
  int64_t biggest = 0;
  for (const ActivationShape::Stage& st : stages) {
    const Replay& one = stage_replay(st, false);
    biggest = std::max(biggest, one.kept);
    out.per_microbatch_rank += one.kept;
    out.after_step = std::max(out.after_step, one.end);
  }
  out.per_microbatch = biggest;
  // Started micro-batches' contexts (pipeline rounds of m; one receive posted ahead), for
  // `flight` stage micro-batches in flight.
  auto contexts = [&](int64_t flight) {
    return a.pp_microbatches > 0 ? std::max<int64_t>(0, a.pp_microbatches - flight) * context + s.nD() : 0;
  };
  auto keep_if_higher = [&](Replay r, size_t i) {
    if (r.peak <= out.peak) return;
    out.peak = r.peak;
    out.stage = i;
    out.forward_by_unit = std::move(r.fwd);
    out.backward_by_unit = std::move(r.bwd);
    out.after_backward_by_unit = std::move(r.after);
  };
  if (!a.states) {
    const int64_t held = (a.in_flight - 1) * biggest + contexts(a.in_flight);
    for (size_t i = 0; i < stages.size(); ++i) keep_if_higher(replay(stages[i], held, false), i);
    return out;
  }
  // Each state: its held micro-batches' kept bytes and its pending ones' weight-gradient
  // operands, stage by stage, while one runs (a W runs on what is held). A replay only adds
  // to what it starts with, so each stage's is made once and shifted.
  bool split = false;
  for (const SimulationResult::InFlightState& st : *a.states)
    for (int p : st.pending) split |= p > 0;
  std::vector<const Replay*> base(stages.size());
  std::vector<int64_t> pending(stages.size(), 0);  // a micro-batch's bytes from its I to its W
  for (size_t i = 0; i < stages.size(); ++i) {
    base[i] = &stage_replay(stages[i], split);
    if (split) pending[i] = base[i]->end - stage_replay(stages[i], false).end;
  }
  // Per (stage, stages that have run a backward), the highest bytes alive at each unit's phase
  // over the states of that kind: a forward state's forward phases, a backward state's backward
  // phases, and for a W every phase at what is held (it allocates nothing of its own).
  using Phase = SimulationResult::InFlightState::Phase;
  const std::shared_ptr<const StateGroups> groups = cached_groups(a);
  std::vector<Replay> merged(groups->keys.size());
  std::vector<char> fresh(merged.size(), 1);
  auto raise = [](std::vector<int64_t>& into, const std::vector<int64_t>& from, int64_t add) {
    for (size_t u = 0; u < into.size() && u < from.size(); ++u) into[u] = std::max(into[u], from[u] + add);
  };
  auto raise_to = [](std::vector<int64_t>& into, int64_t level) {
    for (int64_t& x : into) x = std::max(x, level);
  };
  for (size_t k = 0; k < a.states->size(); ++k) {
    const SimulationResult::InFlightState& st = (*a.states)[k];
    if (st.running < 0 || size_t(st.running) >= stages.size() || st.held.size() != stages.size() ||
        st.pending.size() != stages.size())
      throw std::invalid_argument("predict_activations: an in-flight state does not match the rank's stages");
    int64_t held = 0, flight = st.phase == Phase::kWeight ? 0 : 1;
    for (size_t i = 0; i < stages.size(); ++i) {
      held += st.held[i] * base[i]->kept + st.pending[i] * pending[i];
      flight += st.held[i] + st.pending[i];
    }
    held += contexts(flight);
    const size_t i = size_t(st.running);
    const Replay& r = *base[i];
    const size_t gi = groups->group_of[k];
    Replay& m = merged[gi];
    if (fresh[gi]) {  // the group's phase arrays, shaped like its stage's replay, from zero
      m.fwd.assign(r.fwd.size(), 0);
      m.bwd.assign(r.bwd.size(), 0);
      m.after.assign(r.after.size(), 0);
      fresh[gi] = 0;
    }
    if (st.phase == Phase::kForward) {
      raise(m.fwd, r.fwd, held);
    } else if (st.phase == Phase::kBackward) {
      raise(m.bwd, r.bwd, held);
      raise(m.after, r.after, held);
    } else {
      for (std::vector<int64_t>* v : {&m.fwd, &m.bwd, &m.after}) raise_to(*v, out.persistent + held);
    }
  }
  for (size_t gi = 0; gi < merged.size(); ++gi) {
    Replay& m = merged[gi];
    const auto& key = groups->keys[gi];
    m.peak = 0;
    for (const std::vector<int64_t>* v : {&m.fwd, &m.bwd, &m.after})
      for (int64_t x : *v) m.peak = std::max(m.peak, x);
    out.groups.push_back({key.first, key.second, m.fwd, m.bwd, m.after});
    keep_if_higher(std::move(m), key.first);
  }
  return out;
}
}  // namespace

}  // namespace meshtrain
