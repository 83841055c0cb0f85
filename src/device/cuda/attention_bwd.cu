// Grouped-query flash attention, backward (CudaDevice::attention_backward, the causal case; and
// CudaDevice::attention_block_backward, one block of context-parallel attention).
//
// FlashAttention-2 backward (Dao 2023, Algorithm 2; the recomputation scheme of Dao et al. 2022,
// Algorithm 4): probabilities are recomputed from q, k and the forward's lse,
// P = exp(scale·q·kᵀ − lse), and with D_i = Σ_d dO_i·O_i (precomputed once, attn_bwd_rowdot):
//   dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ∘ (dP − D),  dK = scale·dSᵀ·Q,  dQ = scale·dS·K.
// For a block of ring attention (Liu et al. 2023) lse and O are those of the whole merged
// attention, so P is the block's slice of the global probabilities and the per-block gradients
// sum to the full ones; the kernels then attend every key (or, CAUSAL, the diagonal block) and
// add into f32 gradients (ACC) instead of overwriting gradients of the activation dtype.
// dK/dV and dQ are separate kernels so every output element is written by exactly one thread
// with a fixed summation order — no atomics, bitwise deterministic, and the ACC
// read-modify-write is race-free:
//  - dK/dV: one block per (batch, kv head, key tile); it loops over the query heads of its GQA
//    group and over the query tiles it sees (CAUSAL: at or below the diagonal), accumulating in
//    registers.
//  - dQ: one block per (batch, query head, query tile), looping over the key tiles it sees
//    (recomputing S and dP, as FlashAttention-2's "dQ in a separate pass" variant).
// bf16 with Dh ∈ {64, 128} (16-byte aligned) runs the tensor-core kernels (mma.sync m16n8k16,
// fp32 accumulation, P and dS kept in registers and re-packed as A operands); f32 and other head
// dims run fp32 SIMT kernels with the same structure. Template parameters: T the input dtype,
// TG the gradients' (T, or f32 with ACC), CAUSAL the mask; CAUSAL kernels take
// Tk = Tq (seq_q) and ignore their seq_k_arg. Under a document mask (DocTable) P is also zero
// for keys before the query's document start; the dQ kernels skip the key tiles before a query
// tile's first document and the dK/dV kernels the query tiles after a key tile's last one
// (found by binary search: the starts never decrease along a sample).
#include <cmath>

#include "device/cuda/attention_common.cuh"
#include "device/cuda/cuda_device.hpp"

namespace meshtrain {

namespace cuda::attn {
namespace {

// ---------------------------------------------------------------------------------------------
// D = rowsum(dO ∘ O)
// ---------------------------------------------------------------------------------------------

/// D[b, h, t] = Σ_d dout[b, t, h, d] · out[b, t, h, d] in f32 (t < seq = Tq); one warp per
/// (b, t, h) row.
/// grid ceil(rows / 8), block 256.
template <class T>
__global__ void __launch_bounds__(256)
    attn_bwd_rowdot(const T* __restrict__ dout, const T* __restrict__ out, float* __restrict__ dvec, int64_t rows,
                    int seq, int hq, int dh) {
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps exit together
  const T* a = dout + row * dh;
  const T* c = out + row * dh;
  float s = 0.0f;
  for (int d = lane; d < dh; d += 32) s = fmaf(to_f(a[d]), to_f(c[d]), s);
  s = warp_sum(s);
  if (lane == 0) {
    // row = (b·T + t)·Hq + h  →  D index (b·Hq + h)·T + t.
    const int64_t h = row % hq, bt = row / hq, t = bt % seq, b = bt / seq;
    dvec[(b * hq + h) * seq + t] = s;
  }
}

// ---------------------------------------------------------------------------------------------
// SIMT kernels (f32 path; bf16 fallback)
// ---------------------------------------------------------------------------------------------

/// Dynamic smem of attn_bwd_dkdv_simt: K, V [16][dh] (the block's keys, read as broadcasts),
/// Q (pre-scaled), dO [32][dh + 1] (lane j reads row j: odd stride, conflict-free), lse, D and
/// the queries' first keys under the document mask [32]. dh = 256: 98 944 B.
inline size_t dkdv_simt_smem(int dh) {
  return sizeof(float) * (2 * size_t(kSimtRows) * dh + 2 * size_t(kSimtCols) * (dh + 1) + 3 * kSimtCols);
}

/// grid (B·Hkv, ceil(Tk / 16)), block 128; warp w owns keys k0 + 4w .. k0 + 4w + 3 with dims
/// lane + 32c in registers; queries stream 32 per tile, query q0 + j on lane j for the scores.
/// docs: the document mask (DocTable; starts nullptr = none).
template <class T, class TG, bool ACC, bool CAUSAL, int DHP>
__global__ void __launch_bounds__(kSimtThreads, 1)
    attn_bwd_dkdv_simt(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ dvec,
                       TG* __restrict__ dk, TG* __restrict__ dv, int seq_q, int seq_k_arg, int hq, int hkv,
                       int dh, float scale, DocTable docs) {
  // CAUSAL blocks are square; reading seq_q for both keeps one value live.
  const int seq_k = CAUSAL ? seq_q : seq_k_arg;
  constexpr int R = kSimtRowsPerWarp, NC = DHP / 32;
  extern __shared__ float smem[];
  const int ld = dh + 1;
  float* ks = smem;                    // [16][dh]
  float* vs = ks + kSimtRows * dh;     // [16][dh]
  float* qs = vs + kSimtRows * dh;     // [32][ld], multiplied by scale
  float* dos = qs + kSimtCols * ld;    // [32][ld]
  float* ls = dos + kSimtCols * ld;    // [32]
  float* dd = ls + kSimtCols;          // [32]
  int* fs = reinterpret_cast<int*>(dd + kSimtCols);  // [32] first key of each query

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bkv = blockIdx.x, b = bkv / hkv, kvh = bkv % hkv, group = hq / hkv;
  const int k0 = int(blockIdx.y) * kSimtRows;  // low key tiles (most queries) launch first
  const int64_t qstride = int64_t(hq) * dh, kstride = int64_t(hkv) * dh;
  const T* kg = k + int64_t(b) * seq_k * kstride + int64_t(kvh) * dh;
  const T* vg = v + int64_t(b) * seq_k * kstride + int64_t(kvh) * dh;

  for (int i = tid; i < kSimtRows * dh; i += kSimtThreads) {
    const int j = i / dh, c = i - j * dh, s = k0 + j;
    const bool ok = s < seq_k;
    ks[i] = ok ? to_f(kg[int64_t(s) * kstride + c]) : 0.0f;
    vs[i] = ok ? to_f(vg[int64_t(s) * kstride + c]) : 0.0f;
  }

  float dka[R][NC], dva[R][NC];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dka[r][c] = dva[r][c] = 0.0f;

  // CAUSAL: the query tiles holding a query ≥ k0; otherwise all of them. Under the document
  // mask only the queries before qend see a key of this block (the starts never decrease).
  const int qend = docs.starts ? doc_query_end(docs, b, min(k0 + kSimtRows, seq_k) - 1, seq_q) : seq_q;
  const int qt0 = CAUSAL ? k0 / kSimtCols : 0, n_qt = (qend + kSimtCols - 1) / kSimtCols;
  for (int hi = 0; hi < group; ++hi) {
    const int h = kvh * group + hi;
    const T* qg = q + int64_t(b) * seq_q * qstride + int64_t(h) * dh;
    const T* dog = dout + int64_t(b) * seq_q * qstride + int64_t(h) * dh;
    const float* lg = lse + (int64_t(b) * hq + h) * seq_q;
    const float* dg = dvec + (int64_t(b) * hq + h) * seq_q;
    for (int qt = qt0; qt < n_qt; ++qt) {
      const int q0 = qt * kSimtCols;
      __syncthreads();  // previous query tile consumed (and, first time, K/V staged)
      for (int i = tid; i < kSimtCols * dh; i += kSimtThreads) {
        const int j = i / dh, c = i - j * dh, t = q0 + j;
        const bool ok = t < seq_q;
        qs[j * ld + c] = ok ? to_f(qg[int64_t(t) * qstride + c]) * scale : 0.0f;
        dos[j * ld + c] = ok ? to_f(dog[int64_t(t) * qstride + c]) : 0.0f;
      }
      if (tid < kSimtCols) {
        const int t = q0 + tid;
        ls[tid] = t < seq_q ? lg[t] : 0.0f;
        dd[tid] = t < seq_q ? dg[t] : 0.0f;
        fs[tid] = !docs.starts ? 0 : t < seq_q ? doc_first_key(docs, b, t) : INT_MAX;
      }
      __syncthreads();

      // Lane j: scores s = (scale·q_j)·k_r and dP = dO_j·v_r for the warp's R keys.
      float sc[R], dp[R];
#pragma unroll
      for (int r = 0; r < R; ++r) sc[r] = dp[r] = 0.0f;
      const float* qrow = qs + lane * ld;
      const float* dorow = dos + lane * ld;
      const float* kw = ks + warp * R * dh;
      const float* vw = vs + warp * R * dh;
#pragma unroll 4
      for (int c = 0; c < dh; ++c) {
        const float qc = qrow[c], dc = dorow[c];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          sc[r] = fmaf(qc, kw[r * dh + c], sc[r]);
          dp[r] = fmaf(dc, vw[r * dh + c], dp[r]);
        }
      }
      const int query = q0 + lane;
      float p[R], ds[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int key = k0 + warp * R + r;
        // CAUSAL: implies key < T; otherwise keys ≥ Tk are computed but never stored.
        const bool valid = (!CAUSAL || query >= key) && query < seq_q && key >= fs[lane];
        p[r] = valid ? expf(sc[r] - ls[lane]) : 0.0f;
        ds[r] = p[r] * (dp[r] - dd[lane]);
      }

      // dV_r += Σ_j P_rj·dO_j, dK_r += Σ_j dS_rj·(scale·q_j); lane owns dims lane + 32c.
      const int jn = min(kSimtCols, seq_q - q0);
      for (int j = 0; j < jn; ++j) {
        float pj[R], sj[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          pj[r] = __shfl_sync(0xffffffffu, p[r], j);
          sj[r] = __shfl_sync(0xffffffffu, ds[r], j);
        }
        const float* qj = qs + j * ld;
        const float* doj = dos + j * ld;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int d = lane + 32 * c;
          if (d < dh) {
            const float qd = qj[d], dod = doj[d];
#pragma unroll
            for (int r = 0; r < R; ++r) {
              dva[r][c] = fmaf(pj[r], dod, dva[r][c]);
              dka[r][c] = fmaf(sj[r], qd, dka[r][c]);
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int key = k0 + warp * R + r;
    if (key >= seq_k) continue;  // warp-uniform
    const int64_t base = (int64_t(b) * seq_k + key) * kstride + int64_t(kvh) * dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) {
        store_out<TG, ACC>(dk + base + d, dka[r][c]);
        store_out<TG, ACC>(dv + base + d, dva[r][c]);
      }
    }
  }
}

/// Dynamic smem of attn_bwd_dq_simt: Q (pre-scaled), dO [16][dh] (broadcast reads), K, V
/// [32][dh + 1] (lane j reads row j). dh = 256: 98 560 B.
inline size_t dq_simt_smem(int dh) {
  return sizeof(float) * (2 * size_t(kSimtRows) * dh + 2 * size_t(kSimtCols) * (dh + 1));
}

/// grid (B·Hq, ceil(Tq / 16)), block 128; warp w owns query rows q0 + 4w .. q0 + 4w + 3 (dQ
/// dims lane + 32c in registers); keys stream 32 per tile, key k0 + j on lane j. docs: the
/// document mask (DocTable; starts nullptr = none).
template <class T, class TG, bool ACC, bool CAUSAL, int DHP>
__global__ void __launch_bounds__(kSimtThreads, 1)
    attn_bwd_dq_simt(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                     const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ dvec,
                     TG* __restrict__ dq, int seq_q, int seq_k_arg, int hq, int hkv, int dh, float scale,
                     DocTable docs) {
  // CAUSAL blocks are square; reading seq_q for both keeps one value live.
  const int seq_k = CAUSAL ? seq_q : seq_k_arg;
  constexpr int R = kSimtRowsPerWarp, NC = DHP / 32;
  extern __shared__ float smem[];
  const int ld = dh + 1;
  float* qs = smem;                    // [16][dh], multiplied by scale
  float* dos = qs + kSimtRows * dh;    // [16][dh]
  float* ks = dos + kSimtRows * dh;    // [32][ld]
  float* vs = ks + kSimtCols * ld;     // [32][ld]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bh = blockIdx.x, b = bh / hq, h = bh % hq, kvh = h / (hq / hkv);
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kSimtRows;  // heaviest first
  const int64_t qstride = int64_t(hq) * dh, kstride = int64_t(hkv) * dh;
  const T* qg = q + int64_t(b) * seq_q * qstride + int64_t(h) * dh;
  const T* dog = dout + int64_t(b) * seq_q * qstride + int64_t(h) * dh;
  const T* kg = k + int64_t(b) * seq_k * kstride + int64_t(kvh) * dh;
  const T* vg = v + int64_t(b) * seq_k * kstride + int64_t(kvh) * dh;

  for (int i = tid; i < kSimtRows * dh; i += kSimtThreads) {
    const int r = i / dh, c = i - r * dh, t = q0 + r;
    const bool ok = t < seq_q;
    qs[i] = ok ? to_f(qg[int64_t(t) * qstride + c]) * scale : 0.0f;
    dos[i] = ok ? to_f(dog[int64_t(t) * qstride + c]) : 0.0f;
  }
  float lr[R], dr[R], acc[R][NC];
  int fk[R];  // first key of each row under the document mask (0 without one)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = q0 + warp * R + r;
    lr[r] = t < seq_q ? lse[(int64_t(b) * hq + h) * seq_q + t] : 0.0f;
    dr[r] = t < seq_q ? dvec[(int64_t(b) * hq + h) * seq_q + t] : 0.0f;
    fk[r] = !docs.starts ? 0 : t < seq_q ? doc_first_key(docs, b, t) : INT_MAX;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
  }

  // Keys any row may attend: below kend and, under the document mask, from the first row's
  // document start (the starts never decrease).
  const int kend = CAUSAL ? min(q0 + kSimtRows, seq_q) : seq_k;
  const int n_kt = (kend + kSimtCols - 1) / kSimtCols;
  const int kt0 = docs.starts ? max(0, doc_first_key(docs, b, q0)) / kSimtCols : 0;
  for (int kt = kt0; kt < n_kt; ++kt) {
    const int k0 = kt * kSimtCols;
    __syncthreads();
    for (int i = tid; i < kSimtCols * dh; i += kSimtThreads) {
      const int j = i / dh, c = i - j * dh, s = k0 + j;
      const bool ok = s < seq_k;
      ks[j * ld + c] = ok ? to_f(kg[int64_t(s) * kstride + c]) : 0.0f;
      vs[j * ld + c] = ok ? to_f(vg[int64_t(s) * kstride + c]) : 0.0f;
    }
    __syncthreads();

    float sc[R], dp[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] = dp[r] = 0.0f;
    const float* krow = ks + lane * ld;
    const float* vrow = vs + lane * ld;
    const float* qw = qs + warp * R * dh;
    const float* dow = dos + warp * R * dh;
#pragma unroll 4
    for (int c = 0; c < dh; ++c) {
      const float kc = krow[c], vc = vrow[c];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        sc[r] = fmaf(qw[r * dh + c], kc, sc[r]);
        dp[r] = fmaf(dow[r * dh + c], vc, dp[r]);
      }
    }
    const int key = k0 + lane;
    float ds[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t = q0 + warp * R + r;
      // CAUSAL: implies key < T. Otherwise keys ≥ Tk are masked explicitly: their zero rows
      // would still get P = exp(−lse).
      const bool valid = (CAUSAL ? key <= t : key < seq_k) && t < seq_q && key >= fk[r];
      const float p = valid ? expf(sc[r] - lr[r]) : 0.0f;
      ds[r] = p * (dp[r] - dr[r]);
    }

    // dQ_r += Σ_j dS_rj·k_j (scale applied at the store).
    accumulate_weighted_rows(acc, ds, ks, ld, min(kSimtCols, kend - k0), dh, lane);
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = q0 + warp * R + r;
    if (t >= seq_q) continue;
    TG* row = dq + (int64_t(b) * seq_q + t) * qstride + int64_t(h) * dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) store_out<TG, ACC>(row + d, acc[r][c] * scale);
    }
  }
}

template <class T, class TG, bool ACC, bool CAUSAL, int DHP>
void launch_bwd_simt(const Dims& d, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& lse, const Tensor& dvec, float scale, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv, const DocTable& docs, cudaStream_t stream) {
  const auto* dop = static_cast<const T*>(dout.raw());
  const auto* qp = static_cast<const T*>(q.raw());
  const auto* kp = static_cast<const T*>(k.raw());
  const auto* vp = static_cast<const T*>(v.raw());

  const size_t smem_kv = dkdv_simt_smem(d.dh);
  allow_dynamic_smem(attn_bwd_dkdv_simt<T, TG, ACC, CAUSAL, DHP>, smem_kv);
  const dim3 grid_kv(unsigned(d.b * d.hkv), unsigned((d.tk + kSimtRows - 1) / kSimtRows));
  attn_bwd_dkdv_simt<T, TG, ACC, CAUSAL, DHP><<<grid_kv, kSimtThreads, smem_kv, stream>>>(
      dop, qp, kp, vp, lse.f32(), dvec.f32(), static_cast<TG*>(dk.raw()), static_cast<TG*>(dv.raw()), d.tq, d.tk,
      d.hq, d.hkv, d.dh, scale, docs);
  MT_CUDA_LAUNCH("attn_bwd_dkdv_simt");

  const size_t smem_q = dq_simt_smem(d.dh);
  allow_dynamic_smem(attn_bwd_dq_simt<T, TG, ACC, CAUSAL, DHP>, smem_q);
  const dim3 grid_q(unsigned(d.b * d.hq), unsigned((d.tq + kSimtRows - 1) / kSimtRows));
  attn_bwd_dq_simt<T, TG, ACC, CAUSAL, DHP><<<grid_q, kSimtThreads, smem_q, stream>>>(
      dop, qp, kp, vp, lse.f32(), dvec.f32(), static_cast<TG*>(dq.raw()), d.tq, d.tk, d.hq, d.hkv, d.dh, scale,
      docs);
  MT_CUDA_LAUNCH("attn_bwd_dq_simt");
}

template <class T, class TG, bool ACC, bool CAUSAL>
void bwd_simt(const Dims& d, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& lse, const Tensor& dvec, float scale, const Tensor& dq, const Tensor& dk,
              const Tensor& dv, const DocTable& docs, cudaStream_t stream) {
  switch (simt_dh_cap(d.dh)) {
    case 32:
      return launch_bwd_simt<T, TG, ACC, CAUSAL, 32>(d, dout, q, k, v, lse, dvec, scale, dq, dk, dv, docs, stream);
    case 64:
      return launch_bwd_simt<T, TG, ACC, CAUSAL, 64>(d, dout, q, k, v, lse, dvec, scale, dq, dk, dv, docs, stream);
    case 128:
      return launch_bwd_simt<T, TG, ACC, CAUSAL, 128>(d, dout, q, k, v, lse, dvec, scale, dq, dk, dv, docs, stream);
    default:
      return launch_bwd_simt<T, TG, ACC, CAUSAL, 256>(d, dout, q, k, v, lse, dvec, scale, dq, dk, dv, docs, stream);
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernels (FlashAttention-2 backward)
// ---------------------------------------------------------------------------------------------

constexpr int kBwdBk = 64;  // keys per dK/dV block (4 warps x 16 key rows)

/// Query rows per tile streamed by the dK/dV kernel: 64 for DH = 64; 32 for DH = 128, which
/// halves the Sᵀ / dPᵀ accumulators so 2 x 64 dK/dV accumulators fit without spilling.
template <int DH>
constexpr int dkdv_bq() { return DH <= 64 ? 64 : 32; }
/// Keys per tile streamed by the dQ kernel: 64 for DH = 64, 32 for DH = 128 (keeps shared memory
/// at 68 KiB instead of 102 KiB).
template <int DH>
constexpr int dq_bk() { return DH <= 64 ? 64 : 32; }

/// Shared memory of attn_bwd_dkdv_tc: K, V [64][DH+8] bf16; Q, dO [2][BQ][DH+8] bf16; lse, D
/// [2][BQ] f32; the queries' document starts [2][BQ] i32 (DH = 64: 56 832 B; DH = 128: 70 400 B).
template <int DH>
constexpr size_t dkdv_tc_smem() {
  constexpr int bq = dkdv_bq<DH>();
  return sizeof(bf16) * size_t(2 * kBwdBk + 4 * bq) * (DH + 8) + sizeof(float) * 6 * bq;
}

/// dK/dV for one (batch, kv head, 64-key tile); grid (B·Hkv, ceil(Tk / 64)), block 128, dynamic
/// smem dkdv_tc_smem<DH>(). Warp w owns keys k0 + 16w .. k0 + 16w + 15, so every product is
/// computed "key-major" (M = keys): Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q with
/// Pᵀ, dSᵀ re-packed from accumulators — no transposes through shared memory. The (query head,
/// query tile) pairs of the GQA group are one flat, double-buffered cp.async stream. docs: the
/// document mask (DocTable; starts nullptr = none): only the query tiles before the end of the
/// key tile's last document are streamed.
template <int DH, class TG, bool ACC, bool CAUSAL>
__global__ void __launch_bounds__(kTcThreads)
    attn_bwd_dkdv_tc(const bf16* __restrict__ dout, const bf16* __restrict__ q, const bf16* __restrict__ k,
                     const bf16* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ dvec,
                     TG* __restrict__ dk, TG* __restrict__ dv, int seq_q, int seq_k_arg, int hq, int hkv,
                     float scale, float scale_log2, DocTable docs) {
  // CAUSAL blocks are square; reading seq_q for both keeps one value live.
  const int seq_k = CAUSAL ? seq_q : seq_k_arg;
  constexpr int BQ = dkdv_bq<DH>(), LD = DH + 8, KS = DH / 16, NB = BQ / 8, ND = DH / 8;
  // With DH = 64 the warp's K and V A-fragments (2 x 16 registers) stay in registers for the
  // whole kernel; with DH = 128 they would not fit next to the accumulators and are re-read
  // from shared memory each tile.
  constexpr bool kKeepKV = DH <= 64;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);  // [64][LD]
  bf16* vs = ks + kBwdBk * LD;                    // [64][LD]
  bf16* qs = vs + kBwdBk * LD;                    // [2][BQ][LD]
  bf16* dos = qs + 2 * BQ * LD;                   // [2][BQ][LD]
  float* ls = reinterpret_cast<float*>(dos + 2 * BQ * LD);  // [2][BQ]
  float* dd = ls + 2 * BQ;                                  // [2][BQ]
  int32_t* fs = reinterpret_cast<int32_t*>(dd + 2 * BQ);    // [2][BQ] doc_start of each query

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bkv = blockIdx.x, b = bkv / hkv, kvh = bkv % hkv, group = hq / hkv;
  const int k0 = int(blockIdx.y) * kBwdBk;  // low key tiles (most query tiles) launch first
  const int64_t qstride = int64_t(hq) * DH, kstride = int64_t(hkv) * DH;
  const bf16* kg = k + int64_t(b) * seq_k * kstride + int64_t(kvh) * DH;
  const bf16* vg = v + int64_t(b) * seq_k * kstride + int64_t(kvh) * DH;

  // Query tiles qt0 .. n_qt-1 of each head: CAUSAL, those holding every query ≥ k0 (the causal
  // ones); otherwise all of them; under the document mask only up to the last query that sees
  // a key of this tile (the starts never decrease, so those queries are a prefix).
  const int qend = docs.starts ? doc_query_end(docs, b, min(k0 + kBwdBk, seq_k) - 1, seq_q) : seq_q;
  const int qt0 = CAUSAL ? k0 / BQ : 0, n_qt = (qend + BQ - 1) / BQ, per_head = max(0, n_qt - qt0),
            n_it = group * per_head;
  const int32_t* starts = docs.starts ? docs.starts + int64_t(b) * docs.seq + docs.q_off : nullptr;

  // Issues the loads of step `it` (query head kvh·group + it / per_head, tile qt0 + it % per_head)
  // into buffer `buf`. Rows ≥ Tq read as zero (and lse = D = 0), masked below.
  auto load_step = [&](int it, int buf) {
    const int h = kvh * group + it / per_head, qrow0 = (qt0 + it % per_head) * BQ;
    const int64_t head_off = int64_t(b) * seq_q * qstride + int64_t(h) * DH;
    load_tile_async<BQ, DH>(qs + buf * BQ * LD, q + head_off, qstride, qrow0, seq_q);
    load_tile_async<BQ, DH>(dos + buf * BQ * LD, dout + head_off, qstride, qrow0, seq_q);
    const int64_t stat_off = (int64_t(b) * hq + h) * seq_q;
    if (tid < 2 * BQ) {
      const int i = tid % BQ, t = qrow0 + i;
      const bool ok = t < seq_q;
      const float* src = (tid < BQ ? lse : dvec) + stat_off + (ok ? t : 0);
      cp_async_4((tid < BQ ? ls : dd) + buf * BQ + i, src, ok);
    }
    if (starts && tid < BQ) {
      const int t = qrow0 + tid;
      cp_async_4(fs + buf * BQ + tid, starts + (t < seq_q ? t : 0), t < seq_q);
    }
  };

  load_tile_async<kBwdBk, DH>(ks, kg, kstride, k0, seq_k);
  load_tile_async<kBwdBk, DH>(vs, vg, kstride, k0, seq_k);
  if (n_it > 0) load_step(0, 0);
  cp_async_commit();

  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int i = 0; i < ND; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[i][e] = dva[i][e] = 0.0f;
  uint32_t kreg[kKeepKV ? KS : 1][4], vreg[kKeepKV ? KS : 1][4];

  for (int it = 0; it < n_it; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_it) load_step(it + 1, buf ^ 1);  // buf^1 last read in step it-1
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    if constexpr (kKeepKV) {
      if (it == 0) {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          ldsm_x4(kreg[s], ks + a_off(lane, warp * 16, s * 16, LD));
          ldsm_x4(vreg[s], vs + a_off(lane, warp * 16, s * 16, LD));
        }
      }
    }
    const int q0 = (qt0 + it % per_head) * BQ;
    const bf16* qb = qs + buf * BQ * LD;
    const bf16* dob = dos + buf * BQ * LD;
    const float* lb = ls + buf * BQ;
    const float* db = dd + buf * BQ;

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 16 keys x BQ queries per warp.
    float st[NB][4], dpt[NB][4];
    mma_pair<NB, KS, kKeepKV>(st, dpt, kreg, vreg, ks, vs, warp * 16, qb, dob, LD, lane);
    // Document mask: needed when the key tile starts before the last query's document (the
    // largest start of the tile); global key positions compare with the staged starts.
    const int32_t* fb = fs + buf * BQ;
    const bool doc_mask = starts && k0 + docs.k_off < fb[min(BQ, seq_q - q0) - 1];

    // Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), zero where query < key (CAUSAL) or query ≥ Tq
    // (tile padding, whose zero rows must not contribute); dSᵀ = Pᵀ ∘ (dPᵀ − D). Only tiles
    // crossing the diagonal or the end of the queries need the mask. Keys ≥ Tk (padding of the
    // key tile) get rows of garbage that are never stored.
    const bool need_mask = (CAUSAL && q0 < k0 + kBwdBk) || q0 + BQ > seq_q;
#pragma unroll
    for (int i = 0; i < NB; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = i * 8 + ((lane & 3) << 1) + (e & 1);
        float p = exp2f(fmaf(st[i][e], scale_log2, -lb[col] * kLog2e));
        if (need_mask || doc_mask) {
          const int key = k0 + warp * 16 + (lane >> 2) + ((e >> 1) << 3), query = q0 + col;
          if ((CAUSAL && query < key) || query >= seq_q || (doc_mask && key + docs.k_off < fb[col])) p = 0.0f;
        }
        st[i][e] = p;
        dpt[i][e] = p * (dpt[i][e] - db[col]);
      }

    // dV += Pᵀ·dO, dK += dSᵀ·Q (k = queries; dO and Q as [k][n] row-major tiles → .trans).
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      uint32_t pa[4], sa[4];
      acc_to_a(pa, st, kk);
      acc_to_a(sa, dpt, kk);
#pragma unroll
      for (int n2 = 0; n2 < ND / 2; ++n2) {
        uint32_t f[4];
        ldsm_x4_trans(f, dob + a_off(lane, kk * 16, n2 * 16, LD));
        mma_bf16_16816(dva[2 * n2], pa, f[0], f[1]);
        mma_bf16_16816(dva[2 * n2 + 1], pa, f[2], f[3]);
        ldsm_x4_trans(f, qb + a_off(lane, kk * 16, n2 * 16, LD));
        mma_bf16_16816(dka[2 * n2], sa, f[0], f[1]);
        mma_bf16_16816(dka[2 * n2 + 1], sa, f[2], f[3]);
      }
    }
    __syncthreads();  // buffer buf is free for step it+2's loads (issued in step it+1)
  }
  cp_async_wait<0>();  // no copy may still be in flight at exit (a key tile no query sees)

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int key = k0 + warp * 16 + (lane >> 2) + rr * 8;
    if (key >= seq_k) continue;
    const int64_t off = (int64_t(b) * seq_k + key) * kstride + int64_t(kvh) * DH + ((lane & 3) << 1);
#pragma unroll
    for (int i = 0; i < ND; ++i) {
      store_out2<TG, ACC>(dk + off + i * 8, dka[i][2 * rr] * scale, dka[i][2 * rr + 1] * scale);
      store_out2<TG, ACC>(dv + off + i * 8, dva[i][2 * rr], dva[i][2 * rr + 1]);
    }
  }
}

/// Shared memory of attn_bwd_dq_tc: Q, dO [64][DH+8]; K, V [2][BK][DH+8], bf16 (DH = 64:
/// 55 296 B; DH = 128: 69 632 B).
template <int DH>
constexpr size_t dq_tc_smem() {
  return sizeof(bf16) * size_t(2 * kTcRows + 4 * dq_bk<DH>()) * (DH + 8);
}

/// dQ for one (batch, query head, 64-query tile); grid (B·Hq, ceil(Tq / 64)), block 128 (warp w
/// owns query rows q0 + 16w ..), dynamic smem dq_tc_smem<DH>(). Per key tile: S = Q·Kᵀ,
/// dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += dS·K (K as a [k][n] tile → .trans). docs: the
/// document mask (DocTable; starts nullptr = none): key tiles below the first row's document
/// start are skipped.
template <int DH, class TG, bool ACC, bool CAUSAL>
__global__ void __launch_bounds__(kTcThreads)
    attn_bwd_dq_tc(const bf16* __restrict__ dout, const bf16* __restrict__ q, const bf16* __restrict__ k,
                   const bf16* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ dvec,
                   TG* __restrict__ dq, int seq_q, int seq_k_arg, int hq, int hkv, float scale,
                   float scale_log2, DocTable docs) {
  // CAUSAL blocks are square; reading seq_q for both keeps one value live.
  const int seq_k = CAUSAL ? seq_q : seq_k_arg;
  constexpr int BK = dq_bk<DH>(), LD = DH + 8, KS = DH / 16, NB = BK / 8, ND = DH / 8;
  constexpr bool kKeepQ = DH <= 64;  // Q and dO A-fragments in registers (see attn_bwd_dkdv_tc)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);  // [64][LD]
  bf16* dos = qs + kTcRows * LD;                  // [64][LD]
  bf16* ks = dos + kTcRows * LD;                  // [2][BK][LD]
  bf16* vs = ks + 2 * BK * LD;                    // [2][BK][LD]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bh = blockIdx.x, b = bh / hq, h = bh % hq, kvh = h / (hq / hkv);
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kTcRows;  // heaviest first
  const int64_t qstride = int64_t(hq) * DH, kstride = int64_t(hkv) * DH;
  const int64_t head_off = int64_t(b) * seq_q * qstride + int64_t(h) * DH;
  const bf16* kg = k + int64_t(b) * seq_k * kstride + int64_t(kvh) * DH;
  const bf16* vg = v + int64_t(b) * seq_k * kstride + int64_t(kvh) * DH;

  // CAUSAL: key tiles holding keys < min(q0 + 64, T); the last one always reaches past q0, so
  // it (and any other tile with k0 + BK > q0) is masked. Otherwise every key tile; a partial
  // last one is masked.
  const int kend = CAUSAL ? min(q0 + kTcRows, seq_q) : seq_k, n_kt = (kend + BK - 1) / BK;
  // Document mask: key tiles before td.kt0 hold no key any row sees.
  const TileDocs td = tile_docs<BK>(docs, b, q0, seq_q, warp, lane);
  const int kt0 = td.kt0;

  load_tile_async<kTcRows, DH>(qs, q + head_off, qstride, q0, seq_q);
  load_tile_async<kTcRows, DH>(dos, dout + head_off, qstride, q0, seq_q);
  if (kt0 < n_kt) {
    load_tile_async<BK, DH>(ks, kg, kstride, kt0 * BK, seq_k);
    load_tile_async<BK, DH>(vs, vg, kstride, kt0 * BK, seq_k);
  }
  cp_async_commit();

  // This thread's rows g and g + 8 of the warp: lse in base-2 units and D (0 past Tq: those
  // rows' Q and dO are zero, so everything stays finite, and they are never stored).
  float l2[2], dr[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int t = q0 + warp * 16 + (lane >> 2) + rr * 8;
    const int64_t si = (int64_t(b) * hq + h) * seq_q + t;
    l2[rr] = t < seq_q ? lse[si] * kLog2e : 0.0f;
    dr[rr] = t < seq_q ? dvec[si] : 0.0f;
  }

  float acc[ND][4];
#pragma unroll
  for (int i = 0; i < ND; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  uint32_t qreg[kKeepQ ? KS : 1][4], doreg[kKeepQ ? KS : 1][4];

  for (int kt = kt0; kt < n_kt; ++kt) {
    const int buf = (kt - kt0) & 1;
    if (kt + 1 < n_kt) {
      load_tile_async<BK, DH>(ks + (buf ^ 1) * BK * LD, kg, kstride, (kt + 1) * BK, seq_k);
      load_tile_async<BK, DH>(vs + (buf ^ 1) * BK * LD, vg, kstride, (kt + 1) * BK, seq_k);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    if constexpr (kKeepQ) {
      if (kt == kt0) {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          ldsm_x4(qreg[s], qs + a_off(lane, warp * 16, s * 16, LD));
          ldsm_x4(doreg[s], dos + a_off(lane, warp * 16, s * 16, LD));
        }
      }
    }
    const int k0 = kt * BK;
    const bf16* kb = ks + buf * BK * LD;
    const bf16* vb = vs + buf * BK * LD;

    float sacc[NB][4], dpa[NB][4];
    mma_pair<NB, KS, kKeepQ>(sacc, dpa, qreg, doreg, qs, dos, warp * 16, kb, vb, LD, lane);

    // Without CAUSAL the zero-filled keys ≥ Tk must be masked too: their P = exp(−lse) is not
    // zero (and may overflow, and inf · 0 = NaN in dS·K).
    // Under the document mask, keys before the row's document start in tiles that reach below
    // the last row's start.
    const bool need_mask = CAUSAL ? k0 + BK > q0 : k0 + BK > seq_k;
    const bool doc_mask = docs.starts && k0 < td.fk_last;
#pragma unroll
    for (int i = 0; i < NB; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = e >> 1;
        float p = exp2f(fmaf(sacc[i][e], scale_log2, -l2[rr]));
        if (need_mask || doc_mask) {
          const int row = q0 + warp * 16 + (lane >> 2) + rr * 8;
          const int key = k0 + i * 8 + ((lane & 3) << 1) + (e & 1);
          if (CAUSAL ? key > row : key >= seq_k) p = 0.0f;  // CAUSAL: also keys ≥ T for rows < T
          if (key < td.fk[rr]) p = 0.0f;                    // fk = 0 without a document mask
        }
        sacc[i][e] = p * (dpa[i][e] - dr[rr]);  // dS
      }

#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t sa[4];
      acc_to_a(sa, sacc, kk);
#pragma unroll
      for (int n2 = 0; n2 < ND / 2; ++n2) {
        uint32_t f[4];
        ldsm_x4_trans(f, kb + a_off(lane, kk * 16, n2 * 16, LD));
        mma_bf16_16816(acc[2 * n2], sa, f[0], f[1]);
        mma_bf16_16816(acc[2 * n2 + 1], sa, f[2], f[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // no copy may still be in flight at exit (a query tile that sees no key tile)

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int t = q0 + warp * 16 + (lane >> 2) + rr * 8;
    if (t >= seq_q) continue;
    TG* row = dq + (int64_t(b) * seq_q + t) * qstride + int64_t(h) * DH + ((lane & 3) << 1);
#pragma unroll
    for (int i = 0; i < ND; ++i) store_out2<TG, ACC>(row + i * 8, acc[i][2 * rr] * scale, acc[i][2 * rr + 1] * scale);
  }
}

template <int DH, class TG, bool ACC, bool CAUSAL>
void launch_bwd_tc(const Dims& d, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& lse, const Tensor& dvec, float scale, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const DocTable& docs, cudaStream_t stream) {
  const auto* dop = static_cast<const bf16*>(dout.raw());
  const auto* qp = static_cast<const bf16*>(q.raw());
  const auto* kp = static_cast<const bf16*>(k.raw());
  const auto* vp = static_cast<const bf16*>(v.raw());

  constexpr size_t smem_kv = dkdv_tc_smem<DH>();
  allow_dynamic_smem(attn_bwd_dkdv_tc<DH, TG, ACC, CAUSAL>, smem_kv);
  const dim3 grid_kv(unsigned(d.b * d.hkv), unsigned((d.tk + kBwdBk - 1) / kBwdBk));
  attn_bwd_dkdv_tc<DH, TG, ACC, CAUSAL><<<grid_kv, kTcThreads, smem_kv, stream>>>(
      dop, qp, kp, vp, lse.f32(), dvec.f32(), static_cast<TG*>(dk.raw()), static_cast<TG*>(dv.raw()), d.tq, d.tk,
      d.hq, d.hkv, scale, scale * kLog2e, docs);
  MT_CUDA_LAUNCH("attn_bwd_dkdv_tc");

  constexpr size_t smem_q = dq_tc_smem<DH>();
  allow_dynamic_smem(attn_bwd_dq_tc<DH, TG, ACC, CAUSAL>, smem_q);
  const dim3 grid_q(unsigned(d.b * d.hq), unsigned((d.tq + kTcRows - 1) / kTcRows));
  attn_bwd_dq_tc<DH, TG, ACC, CAUSAL><<<grid_q, kTcThreads, smem_q, stream>>>(
      dop, qp, kp, vp, lse.f32(), dvec.f32(), static_cast<TG*>(dq.raw()), d.tq, d.tk, d.hq, d.hkv, scale,
      scale * kLog2e, docs);
  MT_CUDA_LAUNCH("attn_bwd_dq_tc");
}

/// Runs the backward of one checked call (d.tq ≥ 1, d.tk ≥ 1) after D = rowsum(dout ∘ out):
/// D into an f32 temporary [B, Hq, Tq], then the dK/dV and dQ kernels (tensor cores for bf16
/// with Dh 64 or 128 and 16-byte aligned data, fp32 SIMT otherwise). ACC: the gradients are
/// f32 and accumulated; else they have q's dtype and are overwritten. docs: the document mask
/// (starts nullptr = none).
template <bool ACC, bool CAUSAL>
void backward(Allocator* alloc, const Dims& d, const Tensor& dout, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& out, const Tensor& lse, float scale, const Tensor& dq, const Tensor& dk,
              const Tensor& dv, const DocTable& docs, cudaStream_t stream) {
  Tensor dvec = Tensor::empty(alloc, {q.dim(0), q.dim(2), q.dim(1)}, DType::kF32, MemCategory::kTemporaries);
  const int64_t rows = int64_t(d.b) * d.tq * d.hq;
  MT_DISPATCH_FLOAT(q.dtype(), T, {
    attn_bwd_rowdot<T><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(
        static_cast<const T*>(dout.raw()), static_cast<const T*>(out.raw()), dvec.f32(), rows, d.tq, d.hq, d.dh);
    MT_CUDA_LAUNCH("attn_bwd_rowdot");
  });

  bool tc = q.dtype() == DType::kBF16 && (d.dh == 64 || d.dh == 128);
  for (const Tensor* t : {&dout, &q, &k, &v, &dq, &dk, &dv}) tc = tc && aligned16(*t);
  if (tc) {
    using TG = std::conditional_t<ACC, float, bf16>;
    if (d.dh == 64)
      launch_bwd_tc<64, TG, ACC, CAUSAL>(d, dout, q, k, v, lse, dvec, scale, dq, dk, dv, docs, stream);
    else
      launch_bwd_tc<128, TG, ACC, CAUSAL>(d, dout, q, k, v, lse, dvec, scale, dq, dk, dv, docs, stream);
    return;
  }
  MT_DISPATCH_FLOAT(q.dtype(), T,
                    (bwd_simt<T, std::conditional_t<ACC, float, T>, ACC, CAUSAL>(d, dout, q, k, v, lse, dvec, scale,
                                                                                 dq, dk, dv, docs, stream)));
}

/// The shapes both backward entry points require: dout, out, dq like q; dk, dv like k; lse
/// [B, Hq, Tq]. @throws std::invalid_argument naming `fn` and the first mismatch.
void require_backward_shapes(const char* fn, const Tensor& q, const Tensor& k, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  require_shape(fn, "dout", dout, q.shape());
  require_shape(fn, "out", out, q.shape());
  require_shape(fn, "dq", dq, q.shape());
  require_shape(fn, "dk", dk, k.shape());
  require_shape(fn, "dv", dv, k.shape());
  require_shape(fn, "lse", lse, {q.dim(0), q.dim(2), q.dim(1)});
}

}  // namespace
}  // namespace cuda::attn

/// Causal GQA flash-attention backward (Device::attention_backward): dq [B, T, Hq, Dh], dk, dv
/// [B, T, Hkv, Dh] overwritten, deterministic (no atomics). Computes D = rowsum(dout ∘ out) into
/// an f32 temporary [B, Hq, T], then the dK/dV and dQ kernels (tensor cores for bf16 with Dh 64
/// or 128 and 16-byte aligned data, fp32 SIMT otherwise).
/// @throws std::invalid_argument on inconsistent shapes (attn::check_qkv; dout, out, dq like q;
///         dk, dv like k; lse [B, Hq, T]) or dtypes (all tensors but lse share f32 or bf16; lse
///         f32).
void CudaDevice::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, float scale, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv, const DocumentMask& docs) {
  using namespace cuda::attn;
  static constexpr const char* kFn = "attention_backward";
  const Dims d = check_qkv(kFn, q, k, v);
  const DocTable dt = doc_table(kFn, d, docs);
  require_backward_shapes(kFn, q, k, dout, out, lse, dq, dk, dv);
  cuda::require_float(q, kFn, "q");
  for (const Tensor* t : {&k, &v, &out, &dout, &dq, &dk, &dv}) cuda::require_same(q, *t, kFn);
  cuda::require_dtype(lse, DType::kF32, kFn, "lse");
  if (d.b == 0 || d.tq == 0) return;
  backward<false, true>(allocator(), d, dout, q, k, v, out, lse, scale, dq, dk, dv, dt, compute_);
}

/// Backward of one block of context-parallel attention (Device::attention_block_backward) with
/// the merged forward's out and lse: the kernels of attention_backward, causal or unmasked,
/// adding into f32 gradients. Deterministic (no atomics: every gradient element has one writer).
/// @throws std::invalid_argument on inconsistent shapes (attn::check_block_qkv; dout, out, dq
///         like q; dk, dv like k; lse [B, Hq, Tq]) or dtypes (q, k, v, dout, out share f32 or
///         bf16; lse, dq, dk, dv f32).
void CudaDevice::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                          AttentionMask mask, const Tensor& out, const Tensor& lse, float scale,
                                          const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                          const DocumentMask& docs) {
  using namespace cuda::attn;
  static constexpr const char* kFn = "attention_block_backward";
  const Dims d = check_block_qkv(kFn, q, k, v, mask);
  const DocTable dt = doc_table(kFn, d, docs);
  require_backward_shapes(kFn, q, k, dout, out, lse, dq, dk, dv);
  cuda::require_float(q, kFn, "q");
  for (const Tensor* t : {&k, &v, &out, &dout}) cuda::require_same(q, *t, kFn);
  cuda::require_dtype(lse, DType::kF32, kFn, "lse");
  cuda::require_dtype(dq, DType::kF32, kFn, "dq");
  cuda::require_dtype(dk, DType::kF32, kFn, "dk");
  cuda::require_dtype(dv, DType::kF32, kFn, "dv");
  // No query or no key: every gradient term is an empty sum, so there is nothing to add.
  if (d.b == 0 || d.tq == 0 || d.tk == 0) return;
  if (mask == AttentionMask::kCausal)
    backward<true, true>(allocator(), d, dout, q, k, v, out, lse, scale, dq, dk, dv, dt, compute_);
  else
    backward<true, false>(allocator(), d, dout, q, k, v, out, lse, scale, dq, dk, dv, dt, compute_);
}

}  // namespace meshtrain
