#include "parallel/context/cp_attention.hpp"

#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>

#include "parallel/context/in_flight.hpp"
#include "parallel/context/ulysses_attention.hpp"

namespace meshtrain {

namespace {

using cp_detail::InFlight;
using cp_detail::wait_now;

constexpr int kTagKv = 1, kTagDkv = 2;  // MPI tags of the ring's two streams (NCCL matches in order)

/// Sizes of one rank's operands.
struct Sizes {
  int64_t b, c, hq, hkv, dh, chunks;
  int64_t q_chunk() const { return b * c * hq * dh; }    // elements of one [B, C, Hq, Dh] chunk
  int64_t kv_chunk() const { return b * c * hkv * dh; }  // elements of one [B, C, Hkv, Dh] chunk
  int64_t kv() const { return chunks * kv_chunk(); }     // elements of this rank's K (or V)
};

Sizes check(const char* fn, const SequenceShard& shard, int64_t batch, const Tensor& q, const Tensor& k,
            const Tensor& v) {
  const int64_t chunks = int64_t(shard.chunks.size());
  if (q.ndim() != 4 || k.shape() != v.shape() || k.ndim() != 4 || q.dim(0) != chunks * batch ||
      q.dim(1) != shard.chunk_len || k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1) || k.dim(3) != q.dim(3) ||
      q.dim(2) % k.dim(2))
    throw std::invalid_argument(std::string(fn) + ": q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) +
                                ", v " + shape_str(v.shape()) + " are not [chunks·B, C, H, Dh] with " +
                                std::to_string(chunks) + " chunks of C = " + std::to_string(shard.chunk_len) +
                                " and B = " + std::to_string(batch));
  return Sizes{batch, shard.chunk_len, q.dim(2), k.dim(2), q.dim(3), chunks};
}

/// K and V in one buffer [2, chunks·B·C·Hkv·Dh], so that one collective or one ring hop moves both.
Tensor pack_kv(Device& dev, const Tensor& k, const Tensor& v) {
  Tensor kv = dev.empty({2 * k.numel()}, k.dtype(), MemCategory::kCommunication);
  dev.copy(kv.view({k.numel()}, 0), k.reshape({k.numel()}));
  dev.copy(kv.view({v.numel()}, v.numel()), v.reshape({v.numel()}));
  return kv;
}

/// Whether document masking leaves key chunk gk wholly outside the mask of query chunk gq (gk <
/// gq): in every sample the document of gq's first token starts after gk's last token. Starts
/// do not decrease along a sample, so the first query's start is the chunk's smallest.
bool outside_documents(const DocumentMask& docs, int64_t batch, int64_t seq_len, int64_t c, int64_t gq, int64_t gk) {
  if (!docs.host_starts) return false;
  for (int64_t b = 0; b < batch; ++b)
    if (docs.host_starts[b * seq_len + gq * c] <= gk * c + c - 1) return false;
  return true;
}

/// Calls fn(qc, kc, mask, docs) for each pair of a local query chunk qc and a chunk kc of the K/V
/// block holding the global chunks `kv_chunks` that the causal mask lets attend: key chunk h
/// before query chunk g whole (kNone), h == g as the causal diagonal, h > g not at all; under
/// document masking, h < g not when it lies wholly outside the documents of g. docs: the
/// block's DocumentMask (the table at the two chunks' global positions).
template <class Fn>
void for_each_block(const SequenceShard& shard, int64_t batch, const std::vector<int64_t>& kv_chunks,
                    const DocumentMask& docs, Fn&& fn) {
  const int64_t c = shard.chunk_len;
  for (size_t qc = 0; qc < shard.chunks.size(); ++qc)
    for (size_t kc = 0; kc < kv_chunks.size(); ++kc) {
      const int64_t gq = shard.chunks[qc], gk = kv_chunks[kc];
      if (gk > gq || (gk < gq && outside_documents(docs, batch, shard.seq_len, c, gq, gk))) continue;
      DocumentMask block = docs;
      block.q_offset = gq * c, block.k_offset = gk * c;
      fn(int64_t(qc), int64_t(kc), gk == gq ? AttentionMask::kCausal : AttentionMask::kNone, block);
    }
}

/// The running result of a rank's queries: out f32 [chunks·B, C, Hq, Dh], lse f32 [chunks, B, Hq, C].
struct Partial {
  Tensor out, lse, out_b, lse_b;  // the last two: one block's result, reused
};

/// Forward of this rank's query chunks against the K/V `kv` ([2, chunks·B·C·Hkv·Dh]) of the cp
/// rank whose global chunks are `kv_chunks`, merged into `acc`; polls `overlapped` between blocks.
void forward_blocks(Device& dev, const Sizes& z, const SequenceShard& shard, const Tensor& q, const Tensor& kv,
                    const std::vector<int64_t>& kv_chunks, float scale, const DocumentMask& docs, Partial& acc,
                    InFlight* overlapped) {
  const Shape qs{z.b, z.c, z.hq, z.dh}, ks{z.b, z.c, z.hkv, z.dh};
  for_each_block(shard, z.b, kv_chunks, docs, [&](int64_t qc, int64_t kc, AttentionMask mask, const DocumentMask& d) {
    const int64_t qo = qc * z.q_chunk(), ko = kc * z.kv_chunk();
    dev.attention_block_forward(q.view(qs, qo), kv.view(ks, ko), kv.view(ks, z.kv() + ko), mask, acc.out_b,
                                acc.lse_b, scale, d);
    dev.attention_merge(acc.out.view(qs, qo), acc.lse.view({z.b, z.hq, z.c}, qc * z.b * z.hq * z.c), acc.out_b,
                        acc.lse_b);
    if (overlapped) overlapped->poll();
  });
}

/// Backward counterpart: dq f32 like q; dkv f32 [2, chunks·B·C·Hkv·Dh], the gradients of `kv`.
void backward_blocks(Device& dev, const Sizes& z, const SequenceShard& shard, const Tensor& q, const Tensor& out,
                     const Tensor& lse, const Tensor& dout, const Tensor& kv, const std::vector<int64_t>& kv_chunks,
                     float scale, const DocumentMask& docs, const Tensor& dq, const Tensor& dkv,
                     std::initializer_list<InFlight*> overlapped) {
  const Shape qs{z.b, z.c, z.hq, z.dh}, ks{z.b, z.c, z.hkv, z.dh};
  for_each_block(shard, z.b, kv_chunks, docs, [&](int64_t qc, int64_t kc, AttentionMask mask, const DocumentMask& d) {
    const int64_t qo = qc * z.q_chunk(), ko = kc * z.kv_chunk();
    dev.attention_block_backward(dout.view(qs, qo), q.view(qs, qo), kv.view(ks, ko), kv.view(ks, z.kv() + ko), mask,
                                 out.view(qs, qo), lse.view({z.b, z.hq, z.c}, qc * z.b * z.hq * z.c), scale,
                                 dq.view(qs, qo), dkv.view(ks, ko), dkv.view(ks, z.kv() + ko), d);
    for (InFlight* f : overlapped) f->poll();
  });
}

/// t (f32) in the activation dtype `dt`: t itself when dt is f32, else a cast copy.
Tensor to_dtype(Device& dev, const Tensor& t, DType dt, MemCategory cat) {
  if (t.dtype() == dt) return t;
  Tensor out = dev.empty(t.shape(), dt, cat);
  dev.cast(out, t);
  return out;
}

std::vector<int64_t> chunks_of(const ContextParallel& cp, const SequenceShard& shard, int64_t rank) {
  return sequence_shard(shard.seq_len, cp.size, rank, cp.balancer).chunks;
}

/// One ring hop: `send` to rank r + 1 and `recv` from r − 1, posted as one batch (one NCCL
/// group). Every rank posts its hops in the same order, which NCCL's in-order matching needs.
InFlight ring_hop(const ContextParallel& cp, const Tensor& send, const Tensor& recv, int tag) {
  const int next = int((cp.rank + 1) % cp.size), prev = int((cp.rank + cp.size - 1) % cp.size);
  return InFlight(cp.comm->send_recv_batch({{true, send, next, tag}, {false, recv, prev, tag}}));
}


}  // namespace

CpAttentionForward cp_attention_forward(Device& dev, const ContextParallel& cp, const SequenceShard& shard,
                                        int64_t batch, const Tensor& q, const Tensor& k, const Tensor& v,
                                        float scale, const DocumentMask& docs) {
  const Sizes z = check("cp_attention_forward", shard, batch, q, k, v);
  if (cp.rotate == CpRotate::kUlysses) return ulysses_forward(dev, cp, shard, batch, q, k, v, scale, docs);
  Partial acc;
  acc.out = dev.zeros(q.shape(), DType::kF32, MemCategory::kActivations);
  acc.lse = dev.empty({z.chunks, z.b, z.hq, z.c}, DType::kF32, MemCategory::kActivations);
  dev.fill(acc.lse, -std::numeric_limits<float>::infinity());  // nothing seen yet: the first merge copies
  acc.out_b = dev.empty({z.b, z.c, z.hq, z.dh}, DType::kF32, MemCategory::kCommunication);
  acc.lse_b = dev.empty({z.b, z.hq, z.c}, DType::kF32, MemCategory::kCommunication);
  Tensor kv = pack_kv(dev, k, v);
  if (cp.rotate == CpRotate::kAllGather) {
    Tensor all = dev.empty({cp.size * kv.numel()}, kv.dtype(), MemCategory::kCommunication);
    wait_now(cp.comm->all_gather(kv, all), cp.stats);
    for (int64_t r = 0; r < cp.size; ++r)
      forward_blocks(dev, z, shard, q, all.view({kv.numel()}, r * kv.numel()), chunks_of(cp, shard, r), scale, docs,
                     acc, nullptr);
  } else {  // the ring
    Tensor next = dev.empty(kv.shape(), kv.dtype(), MemCategory::kCommunication);
    for (int64_t s = 0; s < cp.size; ++s) {
      InFlight hop;
      if (s + 1 < cp.size)
        hop = ring_hop(cp, kv, next, kTagKv);
      forward_blocks(dev, z, shard, q, kv, chunks_of(cp, shard, (cp.rank - s + cp.size) % cp.size), scale, docs, acc,
                     &hop);
      hop.finish(cp.stats);
      std::swap(kv, next);
    }
  }
  CpAttentionForward r;
  r.out = to_dtype(dev, acc.out, q.dtype(), MemCategory::kActivations);
  r.saved = {q, k, v, r.out, acc.lse};
  return r;
}

CpAttentionGrads cp_attention_backward(Device& dev, const ContextParallel& cp, const SequenceShard& shard,
                                       int64_t batch, const std::vector<Tensor>& saved, const Tensor& dout,
                                       float scale, const DocumentMask& docs) {
  if (cp.rotate == CpRotate::kUlysses) return ulysses_backward(dev, cp, shard, batch, saved, dout, scale, docs);
  if (saved.size() != 5) throw std::invalid_argument("cp_attention_backward: saved tensors are not forward's");
  const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
  const Sizes z = check("cp_attention_backward", shard, batch, q, k, v);
  if (dout.shape() != q.shape())
    throw std::invalid_argument("cp_attention_backward: dout " + shape_str(dout.shape()) + " is not q's " +
                                shape_str(q.shape()));
  Tensor dq = dev.zeros(q.shape(), DType::kF32, MemCategory::kActivations);
  Tensor kv = pack_kv(dev, k, v);
  Tensor dkv = dev.empty({kv.numel()}, DType::kF32, MemCategory::kCommunication);  // this rank's K/V gradients
  if (cp.rotate == CpRotate::kAllGather) {
    Tensor all = dev.empty({cp.size * kv.numel()}, kv.dtype(), MemCategory::kCommunication);
    wait_now(cp.comm->all_gather(kv, all), cp.stats);
    Tensor dall = dev.zeros({cp.size * kv.numel()}, DType::kF32, MemCategory::kCommunication);
    for (int64_t r = 0; r < cp.size; ++r)
      backward_blocks(dev, z, shard, q, out, lse, dout, all.view({kv.numel()}, r * kv.numel()),
                      chunks_of(cp, shard, r), scale, docs, dq, dall.view({kv.numel()}, r * kv.numel()), {});
    wait_now(cp.comm->reduce_scatter(dall, dkv, ReduceOp::kSum), cp.stats);
  } else {  // the ring, with the K/V gradients travelling behind their K/V
    Tensor next = dev.empty(kv.shape(), kv.dtype(), MemCategory::kCommunication);
    // The partial sum of block b starts at the rank that computes it second (step 1) and ends at
    // b's owner after cp − 1 hops; the owner's own share (step 0) never travels.
    Tensor own = dev.zeros({kv.numel()}, DType::kF32, MemCategory::kCommunication);
    Tensor mine = dev.empty({kv.numel()}, DType::kF32, MemCategory::kCommunication);      // this step's share
    Tensor arrived = dev.empty({kv.numel()}, DType::kF32, MemCategory::kCommunication);   // partial sum from r − 1
    Tensor sending = dev.empty({kv.numel()}, DType::kF32, MemCategory::kCommunication);   // in flight to r + 1
    InFlight grads;  // the partial sums' hop: send `sending`, receive `arrived`
    for (int64_t s = 0; s < cp.size; ++s) {
      InFlight hop;
      if (s + 1 < cp.size)
        hop = ring_hop(cp, kv, next, kTagKv);
      if (s > 0) dev.fill(mine, 0.0f);
      backward_blocks(dev, z, shard, q, out, lse, dout, kv, chunks_of(cp, shard, (cp.rank - s + cp.size) % cp.size),
                      scale, docs, dq, s == 0 ? own : mine, {&hop, &grads});
      if (s > 0) {
        grads.finish(cp.stats);  // `arrived` holds the partial sum of this step's block; `sending` is free
        if (s > 1) dev.add(mine, arrived, 1.0f);
        std::swap(mine, sending);
        // After the last step the partial sum that arrives is every other rank's share of this
        // rank's K/V gradient.
        grads = ring_hop(cp, sending, arrived, kTagDkv);
      }
      hop.finish(cp.stats);
      std::swap(kv, next);
    }
    grads.finish(cp.stats);
    dev.add(own, arrived, 1.0f);
    dkv = own;
  }
  CpAttentionGrads g;
  g.dq = to_dtype(dev, dq, q.dtype(), MemCategory::kActivations);
  g.dk = to_dtype(dev, dkv.view(k.shape(), 0), k.dtype(), MemCategory::kActivations);
  g.dv = to_dtype(dev, dkv.view(v.shape(), z.kv()), v.dtype(), MemCategory::kActivations);
  return g;
}

}  // namespace meshtrain
