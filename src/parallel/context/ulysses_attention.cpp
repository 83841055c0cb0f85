#include "parallel/context/ulysses_attention.hpp"

#include <stdexcept>
#include <string>

#include "parallel/context/in_flight.hpp"

namespace meshtrain {

namespace {

/// x [chunks·B, C, H, Dh] (this rank's tokens, chunk-major) → [B, T, H/cp, Dh]: the whole
/// sequence of this rank's heads, in global token order.
Tensor seq_to_heads(Device& dev, const ContextParallel& cp, const SequenceShard& shard, int64_t batch,
                    const Tensor& x, MemCategory cat) {
  const int64_t n = x.dim(0) * x.dim(1), h = x.dim(2), dh = x.dim(3), hl = h / cp.size, w = hl * dh;
  const int64_t c = shard.chunk_len, t = shard.seq_len;
  const Tensor x2 = x.reshape({n, h * dh});
  Tensor send = dev.empty({cp.size * n * w}, x.dtype(), MemCategory::kCommunication);
  Tensor recv = dev.empty(send.shape(), x.dtype(), MemCategory::kCommunication);
  for (int64_t j = 0; j < cp.size; ++j) dev.copy_columns(send.view({n, w}, j * n * w), 0, x2, j * w, w);
  cp_detail::wait_now(cp.comm->all_to_all(send, recv), cp.stats);
  Tensor out = dev.empty({batch, t, hl, dh}, x.dtype(), cat);
  const Tensor out2 = out.reshape({batch, t * w});
  for (int64_t j = 0; j < cp.size; ++j) {
    const std::vector<int64_t> chunks = sequence_shard(t, cp.size, j, cp.balancer).chunks;
    for (size_t k = 0; k < chunks.size(); ++k)
      dev.copy_columns(out2, chunks[k] * c * w, recv.view({batch, c * w}, j * n * w + int64_t(k) * batch * c * w), 0,
                       c * w);
  }
  return out;
}

/// The inverse: y [B, T, H/cp, Dh] → [chunks·B, C, H, Dh] with H = h.
Tensor heads_to_seq(Device& dev, const ContextParallel& cp, const SequenceShard& shard, int64_t batch,
                    const Tensor& y, int64_t h, MemCategory cat) {
  const int64_t hl = y.dim(2), dh = y.dim(3), w = hl * dh, c = shard.chunk_len, t = shard.seq_len;
  const int64_t chunks = int64_t(shard.chunks.size()), n = chunks * batch * c;
  const Tensor y2 = y.reshape({batch, t * w});
  Tensor send = dev.empty({cp.size * n * w}, y.dtype(), MemCategory::kCommunication);
  Tensor recv = dev.empty(send.shape(), y.dtype(), MemCategory::kCommunication);
  for (int64_t j = 0; j < cp.size; ++j) {
    const std::vector<int64_t> its = sequence_shard(t, cp.size, j, cp.balancer).chunks;
    for (size_t k = 0; k < its.size(); ++k)
      dev.copy_columns(send.view({batch, c * w}, j * n * w + int64_t(k) * batch * c * w), 0, y2, its[k] * c * w,
                       c * w);
  }
  cp_detail::wait_now(cp.comm->all_to_all(send, recv), cp.stats);
  Tensor out = dev.empty({chunks * batch, c, h, dh}, y.dtype(), cat);
  const Tensor out2 = out.reshape({n, h * dh});
  for (int64_t j = 0; j < cp.size; ++j) dev.copy_columns(out2, j * w, recv.view({n, w}, j * n * w), 0, w);
  return out;
}

void check_heads(const ContextParallel& cp, const Tensor& q, const Tensor& k) {
  if (q.dim(2) % cp.size || k.dim(2) % cp.size)
    throw std::invalid_argument("ulysses attention: this rank's " + std::to_string(q.dim(2)) + " query and " +
                                std::to_string(k.dim(2)) + " kv heads are not divisible by cp " +
                                std::to_string(cp.size));
}

}  // namespace

CpAttentionForward ulysses_forward(Device& dev, const ContextParallel& cp, const SequenceShard& shard, int64_t batch,
                                   const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                   const DocumentMask& docs) {
  check_heads(cp, q, k);
  const Tensor qh = seq_to_heads(dev, cp, shard, batch, q, MemCategory::kActivations);
  const Tensor kh = seq_to_heads(dev, cp, shard, batch, k, MemCategory::kActivations);
  const Tensor vh = seq_to_heads(dev, cp, shard, batch, v, MemCategory::kActivations);
  Tensor oh = dev.empty(qh.shape(), qh.dtype(), MemCategory::kActivations);
  Tensor lse = dev.empty({batch, qh.dim(2), shard.seq_len}, DType::kF32, MemCategory::kActivations);
  dev.attention_forward(qh, kh, vh, oh, lse, scale, docs);  // the whole sequence in global order
  CpAttentionForward r;
  r.out = heads_to_seq(dev, cp, shard, batch, oh, q.dim(2), MemCategory::kActivations);
  r.saved = {qh, kh, vh, oh, lse};
  return r;
}

CpAttentionGrads ulysses_backward(Device& dev, const ContextParallel& cp, const SequenceShard& shard, int64_t batch,
                                  const std::vector<Tensor>& saved, const Tensor& dout, float scale,
                                  const DocumentMask& docs) {
  if (saved.size() != 5) throw std::invalid_argument("ulysses_backward: saved tensors are not forward's");
  const Tensor &qh = saved[0], &kh = saved[1], &vh = saved[2], &oh = saved[3], &lse = saved[4];
  const Tensor doh = seq_to_heads(dev, cp, shard, batch, dout, MemCategory::kCommunication);
  Tensor dqh = dev.empty(qh.shape(), qh.dtype(), MemCategory::kCommunication);
  Tensor dkh = dev.empty(kh.shape(), kh.dtype(), MemCategory::kCommunication);
  Tensor dvh = dev.empty(vh.shape(), vh.dtype(), MemCategory::kCommunication);
  dev.attention_backward(doh, qh, kh, vh, oh, lse, scale, dqh, dkh, dvh, docs);
  CpAttentionGrads g;
  g.dq = heads_to_seq(dev, cp, shard, batch, dqh, qh.dim(2) * cp.size, MemCategory::kActivations);
  g.dk = heads_to_seq(dev, cp, shard, batch, dkh, kh.dim(2) * cp.size, MemCategory::kActivations);
  g.dv = heads_to_seq(dev, cp, shard, batch, dvh, vh.dim(2) * cp.size, MemCategory::kActivations);
  return g;
}

}  // namespace meshtrain
