// Grouped-query flash attention, forward (CudaDevice::attention_forward, the causal case; and
// CudaDevice::attention_block_forward / attention_merge, one block of context-parallel attention
// and the log-sum-exp merge of blocks).
//
// Two kernels, one algorithm: the online-softmax tiling of FlashAttention (Dao et al. 2022,
// Algorithm 1) as reorganized by FlashAttention-2 (Dao 2023, Algorithm 1): a block owns a tile
// of query rows of one (batch, query head), streams the key/value rows it attends (CAUSAL: those
// at or below the diagonal; otherwise all Tk of them) through shared memory, keeps the running
// row max m, row sum l and the unnormalized output in registers, and normalizes once at the end;
// lse = m + log(l) (natural log of the scaled scores) is saved for the backward pass and for
// merges. The output type TO is the activation dtype for attention_forward and f32 for the block
// form, whose partial outputs are merged in f32 (Liu et al. 2023, Ring Attention).
//
//  - attn_fwd_tc<DH, TO, CAUSAL>: bf16, DH ∈ {64, 128}, tensor cores (mma.sync m16n8k16, fp32
//    accumulation), 64 query rows per block (4 warps x 16), key/value tiles of 64
//    double-buffered with cp.async. P never leaves registers: the S accumulators are re-packed
//    as the A operand of P·V.
//  - attn_fwd_simt<T, TO, CAUSAL, DHP>: fp32 math for f32 tensors (the 1e-5 correctness path)
//    and for bf16 with other head dims; 16 query rows per block, 32 keys per tile (one per lane).
//  - attn_merge: the elementwise log-sum-exp merge of two partial results.
// Under a document mask (DocTable) a query tile starts at the key tile holding its first row's
// document start, masks keys before each row's start where a tile reaches below the last row's,
// and a row that sees no key (a context-parallel block wholly outside its document) writes out 0
// and lse −inf, which attn_merge skips.
#include <cmath>

#include "device/cuda/attention_common.cuh"
#include "device/cuda/cuda_device.hpp"

namespace meshtrain {

namespace cuda::attn {
namespace {

// ---------------------------------------------------------------------------------------------
// SIMT kernel
// ---------------------------------------------------------------------------------------------

/// Dynamic shared memory of attn_fwd_simt for head dim dh: Q [16][dh] (pre-scaled), K and V
/// [32][dh + 1] (odd stride: lane j reading row j column c hits bank (j·(dh+1) + c) mod 32,
/// distinct over the warp).
inline size_t fwd_simt_smem(int dh) {
  return sizeof(float) * (size_t(kSimtRows) * dh + 2 * size_t(kSimtCols) * (dh + 1));
}

/// grid (B·Hq, ceil(Tq / 16)), block 128, dynamic smem fwd_simt_smem(dh). DHP ≥ dh is the
/// per-warp register capacity of the head dim (lane owns dims lane + 32c, c < DHP / 32). CAUSAL
/// takes Tk = Tq (seq_k_arg is ignored). docs: the document mask (DocTable; starts nullptr =
/// none); a row that sees no key gets out 0 and lse −inf.
template <class T, class TO, bool CAUSAL, int DHP>
__global__ void __launch_bounds__(kSimtThreads, 1)
    attn_fwd_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, TO* __restrict__ out,
                  float* __restrict__ lse, int seq_q, int seq_k_arg, int hq, int hkv, int dh, float scale,
                  DocTable docs) {
  // CAUSAL blocks are square; reading seq_q for both keeps one value live.
  const int seq_k = CAUSAL ? seq_q : seq_k_arg;
  constexpr int R = kSimtRowsPerWarp, NC = DHP / 32;
  extern __shared__ float smem[];
  const int ld = dh + 1;
  float* qs = smem;                    // [kSimtRows][dh], already multiplied by scale
  float* ks = qs + kSimtRows * dh;     // [kSimtCols][ld]
  float* vs = ks + kSimtCols * ld;     // [kSimtCols][ld]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bh = blockIdx.x, b = bh / hq, h = bh % hq, kvh = h / (hq / hkv);
  // Heaviest (last) query tiles are launched first so the causal triangle's long blocks do not
  // form the tail of the grid.
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kSimtRows;
  const int64_t qstride = int64_t(hq) * dh, kstride = int64_t(hkv) * dh;
  const T* qg = q + int64_t(b) * seq_q * qstride + int64_t(h) * dh;
  const T* kg = k + int64_t(b) * seq_k * kstride + int64_t(kvh) * dh;
  const T* vg = v + int64_t(b) * seq_k * kstride + int64_t(kvh) * dh;

  // Scaling q first reproduces the reference's Σ_c (q_c·scale)·k_c rounding.
  for (int i = tid; i < kSimtRows * dh; i += kSimtThreads) {
    const int r = i / dh, c = i - r * dh, t = q0 + r;
    qs[i] = t < seq_q ? to_f(qg[int64_t(t) * qstride + c]) * scale : 0.0f;
  }

  // fk[r]: the first key row r sees under the document mask (0 without one; rows ≥ Tq, never
  // stored, see none).
  float m[R], l[R], o[R][NC];
  int fk[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[r][c] = 0.0f;
    const int t = q0 + warp * R + r;
    fk[r] = !docs.starts ? 0 : t < seq_q ? doc_first_key(docs, b, t) : INT_MAX;
  }

  // Keys any row of this block may attend: from the first row's document start (the starts
  // never decrease, so the earlier tiles hold no visible key) to kend.
  const int kend = CAUSAL ? min(q0 + kSimtRows, seq_q) : seq_k;
  const int n_kt = (kend + kSimtCols - 1) / kSimtCols;
  const int kt0 = docs.starts ? max(0, doc_first_key(docs, b, q0)) / kSimtCols : 0;
  for (int kt = kt0; kt < n_kt; ++kt) {
    const int k0 = kt * kSimtCols;
    __syncthreads();  // the previous tile is consumed before it is overwritten
    for (int i = tid; i < kSimtCols * dh; i += kSimtThreads) {
      const int j = i / dh, c = i - j * dh, s = k0 + j;
      const bool ok = s < seq_k;
      ks[j * ld + c] = ok ? to_f(kg[int64_t(s) * kstride + c]) : 0.0f;
      vs[j * ld + c] = ok ? to_f(vg[int64_t(s) * kstride + c]) : 0.0f;
    }
    __syncthreads();

    // Lane j scores key k0 + j against the warp's R query rows.
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] = 0.0f;
    const float* krow = ks + lane * ld;
    const float* qw = qs + warp * R * dh;
#pragma unroll 4
    for (int c = 0; c < dh; ++c) {
      const float kc = krow[c];
#pragma unroll
      for (int r = 0; r < R; ++r) sc[r] = fmaf(qw[r * dh + c], kc, sc[r]);
    }

    const int key = k0 + lane;
    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t = q0 + warp * R + r;
      const bool valid = (!CAUSAL || key <= t) && key < seq_k && key >= fk[r];
      const float s = valid ? sc[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));
      // m_new is -inf only while a row has seen no valid key (without a document mask never for
      // rows < Tq once Tk ≥ 1, key 0 being in the first tile); a finite base keeps
      // exp(−inf − base) = 0, not NaN.
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = expf(m[r] - base);
      p[r] = valid ? expf(s - base) : 0.0f;
      l[r] = l[r] * alpha + warp_sum(p[r]);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < NC; ++c) o[r][c] *= alpha;
    }

    // O += P·V: lane owns dims lane + 32c; key j's probability is broadcast from lane j. Later
    // keys are masked for every row.
    accumulate_weighted_rows(o, p, vs, ld, min(kSimtCols, kend - k0), dh, lane);
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = q0 + warp * R + r;
    if (t >= seq_q) continue;  // warp-uniform
    // l = 0: the row saw no key (document mask): out 0 (o is 0) and lse −inf, CpuDevice's values.
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    TO* orow = out + (int64_t(b) * seq_q + t) * qstride + int64_t(h) * dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) store_out<TO, false>(orow + d, o[r][c] * inv);
    }
    if (lane == 0) lse[(int64_t(b) * hq + h) * seq_q + t] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

template <class T, class TO, bool CAUSAL, int DHP>
void launch_fwd_simt(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, float scale, const DocTable& docs, cudaStream_t stream) {
  const size_t smem = fwd_simt_smem(d.dh);
  allow_dynamic_smem(attn_fwd_simt<T, TO, CAUSAL, DHP>, smem);
  const dim3 grid(unsigned(d.b * d.hq), unsigned((d.tq + kSimtRows - 1) / kSimtRows));
  attn_fwd_simt<T, TO, CAUSAL, DHP><<<grid, kSimtThreads, smem, stream>>>(
      static_cast<const T*>(q.raw()), static_cast<const T*>(k.raw()), static_cast<const T*>(v.raw()),
      static_cast<TO*>(out.raw()), lse.f32(), d.tq, d.tk, d.hq, d.hkv, d.dh, scale, docs);
  MT_CUDA_LAUNCH("attn_fwd_simt");
}

template <class T, class TO, bool CAUSAL>
void fwd_simt(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, float scale, const DocTable& docs, cudaStream_t stream) {
  switch (simt_dh_cap(d.dh)) {
    case 32: return launch_fwd_simt<T, TO, CAUSAL, 32>(d, q, k, v, out, lse, scale, docs, stream);
    case 64: return launch_fwd_simt<T, TO, CAUSAL, 64>(d, q, k, v, out, lse, scale, docs, stream);
    case 128: return launch_fwd_simt<T, TO, CAUSAL, 128>(d, q, k, v, out, lse, scale, docs, stream);
    default: return launch_fwd_simt<T, TO, CAUSAL, 256>(d, q, k, v, out, lse, scale, docs, stream);
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (FlashAttention-2 forward)
// ---------------------------------------------------------------------------------------------

constexpr int kFwdBk = 64;  // keys per tile (= kTcRows, so a query tile's diagonal is one key tile)

/// Shared memory of attn_fwd_tc: Q [64][DH+8], K and V [2 buffers][64][DH+8], bf16
/// (DH = 64: 46080 B; DH = 128: 87040 B).
template <int DH>
constexpr size_t fwd_tc_smem() {
  return sizeof(bf16) * size_t(kTcRows + 4 * kFwdBk) * (DH + 8);
}

/// grid (B·Hq, ceil(Tq / 64)), block 128 (warp w owns query rows q0 + 16w .. q0 + 16w + 15),
/// dynamic smem fwd_tc_smem<DH>(). scale_log2 = scale · log2(e): scores are kept in base-2 units
/// so each probability is one exp2f. Pointers 16-byte aligned. CAUSAL takes Tk = Tq
/// (seq_k_arg is ignored). docs: the document mask (DocTable; starts nullptr = none); a row
/// that sees no key gets out 0 and lse −inf.
template <int DH, class TO, bool CAUSAL>
__global__ void __launch_bounds__(kTcThreads)
    attn_fwd_tc(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                TO* __restrict__ out, float* __restrict__ lse, int seq_q, int seq_k_arg, int hq, int hkv,
                float scale_log2, DocTable docs) {
  // CAUSAL blocks are square; reading seq_q for both keeps one value live.
  const int seq_k = CAUSAL ? seq_q : seq_k_arg;
  constexpr int LD = DH + 8, KS = DH / 16, NB = kFwdBk / 8, ND = DH / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);  // [64][LD]
  bf16* ks = qs + kTcRows * LD;                  // [2][64][LD]
  bf16* vs = ks + 2 * kFwdBk * LD;               // [2][64][LD]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bh = blockIdx.x, b = bh / hq, h = bh % hq, kvh = h / (hq / hkv);
  const int qt = int(gridDim.y) - 1 - int(blockIdx.y);  // heaviest tiles first
  const int q0 = qt * kTcRows;
  const int64_t qstride = int64_t(hq) * DH, kstride = int64_t(hkv) * DH;
  const bf16* qg = q + int64_t(b) * seq_q * qstride + int64_t(h) * DH;
  const bf16* kg = k + int64_t(b) * seq_k * kstride + int64_t(kvh) * DH;
  const bf16* vg = v + int64_t(b) * seq_k * kstride + int64_t(kvh) * DH;

  // CAUSAL: key tiles 0..qt; with 64-row query and key tiles, tile qt holds the diagonal and
  // every key < min(q0 + 64, T); tiles before it are entirely visible (all their keys < q0 ≤
  // every row). Otherwise every key tile.
  const int n_kt = CAUSAL ? qt + 1 : (seq_k + kFwdBk - 1) / kFwdBk;
  // Document mask: key tiles before td.kt0 hold no key any row sees.
  const TileDocs td = tile_docs<kFwdBk>(docs, b, q0, seq_q, warp, lane);
  const int kt0 = td.kt0;

  load_tile_async<kTcRows, DH>(qs, qg, qstride, q0, seq_q);
  if (kt0 < n_kt) {
    load_tile_async<kFwdBk, DH>(ks, kg, kstride, kt0 * kFwdBk, seq_k);
    load_tile_async<kFwdBk, DH>(vs, vg, kstride, kt0 * kFwdBk, seq_k);
  }
  cp_async_commit();

  uint32_t qf[KS][4];
  float o[ND][4];
#pragma unroll
  for (int i = 0; i < ND; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  // Each thread holds rows g = lane/4 and g + 8 of its warp's 16 (index rr = 0, 1); m is in
  // scaled base-2 units, l is this thread's partial row sum (reduced over the quad at the end).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int kt = kt0; kt < n_kt; ++kt) {
    const int buf = (kt - kt0) & 1;
    if (kt + 1 < n_kt) {
      // Buffer buf^1 was last read in iteration kt-1, which ended with __syncthreads.
      load_tile_async<kFwdBk, DH>(ks + (buf ^ 1) * kFwdBk * LD, kg, kstride, (kt + 1) * kFwdBk, seq_k);
      load_tile_async<kFwdBk, DH>(vs + (buf ^ 1) * kFwdBk * LD, vg, kstride, (kt + 1) * kFwdBk, seq_k);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile kt
    cp_async_wait<1>();
    __syncthreads();

    if (kt == kt0) {
#pragma unroll
      for (int s = 0; s < KS; ++s) ldsm_x4(qf[s], qs + a_off(lane, warp * 16, s * 16, LD));
    }
    const bf16* kb = ks + buf * kFwdBk * LD;
    const bf16* vb = vs + buf * kFwdBk * LD;

    // S = Q·Kᵀ for the warp's 16 rows x 64 keys.
    float sacc[NB][4];
#pragma unroll
    for (int i = 0; i < NB; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
#pragma unroll
      for (int n2 = 0; n2 < NB / 2; ++n2) {
        uint32_t kf[4];
        ldsm_x4(kf, kb + b_off(lane, n2 * 16, s * 16, LD));
        mma_bf16_16816(sacc[2 * n2], qf[s], kf[0], kf[1]);
        mma_bf16_16816(sacc[2 * n2 + 1], qf[s], kf[2], kf[3]);
      }
    }

    // To base-2 scaled units, then the mask: CAUSAL, on the diagonal tile (k0 == q0, so local
    // indices compare directly; keys ≥ T there are also > every row < T); otherwise only the
    // zero-filled keys ≥ Tk of a partial last tile, whose score 0 must not count.
#pragma unroll
    for (int i = 0; i < NB; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[i][e] *= scale_log2;
    if constexpr (CAUSAL) {
      if (kt == qt) {
#pragma unroll
        for (int i = 0; i < NB; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = warp * 16 + (lane >> 2) + ((e >> 1) << 3);
            const int key = i * 8 + ((lane & 3) << 1) + (e & 1);
            if (key > row) sacc[i][e] = -INFINITY;
          }
      }
    } else {
      // Valid keys of this tile, less this thread's column offset, so each element compares
      // against a constant.
      const int kn = seq_k - kt * kFwdBk - ((lane & 3) << 1);
      if (kt == n_kt - 1) {
#pragma unroll
        for (int i = 0; i < NB; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (i * 8 + (e & 1) >= kn) sacc[i][e] = -INFINITY;
      }
    }
    // Document mask: keys before the row's document start, in tiles that reach below the last
    // row's start (tiles wholly at or above it are visible to every row of the tile).
    if (docs.starts && kt * kFwdBk < td.fk_last) {
#pragma unroll
      for (int i = 0; i < NB; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kt * kFwdBk + i * 8 + ((lane & 3) << 1) + (e & 1) < td.fk[e >> 1]) sacc[i][e] = -INFINITY;
    }

    // Online softmax (FlashAttention-2 Algorithm 1, lines 8-10), per row rr.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < NB; ++i) mx = fmaxf(mx, fmaxf(sacc[i][2 * rr], sacc[i][2 * rr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a quad share a row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[rr], mx);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // no NaN from (−inf) − (−inf)
      const float alpha = exp2f(m[rr] - base);
      m[rr] = m_new;
      float rs = 0.0f;
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const float p0 = exp2f(sacc[i][2 * rr] - base), p1 = exp2f(sacc[i][2 * rr + 1] - base);
        sacc[i][2 * rr] = p0;
        sacc[i][2 * rr + 1] = p1;
        rs += p0 + p1;
      }
      l[rr] = l[rr] * alpha + rs;
#pragma unroll
      for (int i = 0; i < ND; ++i) {
        o[i][2 * rr] *= alpha;
        o[i][2 * rr + 1] *= alpha;
      }
    }

    // O += P·V with P re-packed from the S accumulators as bf16 A fragments.
#pragma unroll
    for (int kk = 0; kk < kFwdBk / 16; ++kk) {
      uint32_t pa[4];
      acc_to_a(pa, sacc, kk);
#pragma unroll
      for (int n2 = 0; n2 < ND / 2; ++n2) {
        uint32_t vf[4];
        ldsm_x4_trans(vf, vb + a_off(lane, kk * 16, n2 * 16, LD));
        mma_bf16_16816(o[2 * n2], pa, vf[0], vf[1]);
        mma_bf16_16816(o[2 * n2 + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer buf before iteration kt+1 refills it
  }
  cp_async_wait<0>();  // no copy may still be in flight at exit (a query tile that saw no key tile)

  // Epilogue: full row sums, normalize, store rows < Tq. l = 0: the row saw no key (document
  // mask): out 0 (o is 0) and lse −inf, CpuDevice's values.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int t = q0 + warp * 16 + (lane >> 2) + rr * 8;
    if (t >= seq_q) continue;
    const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
    TO* orow = out + (int64_t(b) * seq_q + t) * qstride + int64_t(h) * DH + ((lane & 3) << 1);
#pragma unroll
    for (int i = 0; i < ND; ++i) store_out2<TO, false>(orow + i * 8, o[i][2 * rr] * inv, o[i][2 * rr + 1] * inv);
    // Natural log of Σ exp(scaled score): m is in base-2 units.
    if ((lane & 3) == 0)
      lse[(int64_t(b) * hq + h) * seq_q + t] = l[rr] > 0.0f ? m[rr] * kLn2 + logf(l[rr]) : -INFINITY;
  }
}

template <int DH, class TO, bool CAUSAL>
void launch_fwd_tc(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, float scale, const DocTable& docs, cudaStream_t stream) {
  constexpr size_t smem = fwd_tc_smem<DH>();
  allow_dynamic_smem(attn_fwd_tc<DH, TO, CAUSAL>, smem);
  const dim3 grid(unsigned(d.b * d.hq), unsigned((d.tq + kTcRows - 1) / kTcRows));
  attn_fwd_tc<DH, TO, CAUSAL><<<grid, kTcThreads, smem, stream>>>(
      static_cast<const bf16*>(q.raw()), static_cast<const bf16*>(k.raw()), static_cast<const bf16*>(v.raw()),
      static_cast<TO*>(out.raw()), lse.f32(), d.tq, d.tk, d.hq, d.hkv, scale * kLog2e, docs);
  MT_CUDA_LAUNCH("attn_fwd_tc");
}

/// Runs the forward of one checked call (d.tq ≥ 1, d.tk ≥ 1): the tensor-core kernel for bf16
/// with Dh 64 or 128 and 16-byte aligned data, else the fp32 SIMT kernel. The output is f32
/// when F32_OUT, else q's dtype. docs: the document mask (starts nullptr = none).
template <bool F32_OUT, bool CAUSAL>
void forward(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
             float scale, const DocTable& docs, cudaStream_t stream) {
  const bool tc = q.dtype() == DType::kBF16 && (d.dh == 64 || d.dh == 128) && aligned16(q) && aligned16(k) &&
                  aligned16(v) && aligned16(out);
  if (tc) {
    using TO = std::conditional_t<F32_OUT, float, bf16>;
    if (d.dh == 64)
      launch_fwd_tc<64, TO, CAUSAL>(d, q, k, v, out, lse, scale, docs, stream);
    else
      launch_fwd_tc<128, TO, CAUSAL>(d, q, k, v, out, lse, scale, docs, stream);
    return;
  }
  MT_DISPATCH_FLOAT(q.dtype(), T,
                    (fwd_simt<T, std::conditional_t<F32_OUT, float, T>, CAUSAL>(d, q, k, v, out, lse, scale, docs,
                                                                                stream)));
}

// ---------------------------------------------------------------------------------------------
// Log-sum-exp merge of two partial results
// ---------------------------------------------------------------------------------------------

/// One warp per (b, t, h) row of out [B, T, H, Dh]; grid ceil(rows / 8), block 256. Merges the
/// block's row (out_b, lse_b) into the running one (out, lse) in place.
__global__ void __launch_bounds__(256)
    attn_merge(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ out_b,
               const float* __restrict__ lse_b, int64_t rows, int64_t seq, int64_t heads, int64_t dh) {
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps exit together
  // row = (b·T + t)·H + h  →  lse index (b·H + h)·T + t.
  const int64_t h = row % heads, bt = row / heads, t = bt % seq, b = bt / seq;
  const int64_t li = (b * heads + h) * seq + t;
  // Only lane 0 touches lse: it reads both values, broadcasts them, and alone writes the result,
  // so no lane can read an already-merged lse.
  float a = 0.0f, c = 0.0f;
  if (lane == 0) {
    a = lse[li];
    c = lse_b[li];
  }
  a = __shfl_sync(0xffffffffu, a, 0);
  c = __shfl_sync(0xffffffffu, c, 0);
  float* o = out + row * dh;
  const float* ob = out_b + row * dh;
  // The order of the two special cases is CpuDevice's: when both are −inf, out stays.
  if (c == -INFINITY) return;  // the block saw no key: nothing to merge
  if (a == -INFINITY) {        // nothing seen yet: take the block's values
    for (int64_t d = lane; d < dh; d += 32) o[d] = ob[d];
    if (lane == 0) lse[li] = c;
    return;
  }
  // σ(x) and log σ(x) from e = exp(−|x|) ∈ (0, 1], which cannot overflow (the direct
  // 1 / (1 + exp(−x)) does for x < −88); x = lse_b − lse.
  const float x = c - a, e = expf(-fabsf(x));
  const float w = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);  // σ(lse_b − lse)
  for (int64_t d = lane; d < dh; d += 32) o[d] = fmaf(-w, o[d] - ob[d], o[d]);
  // lse − log σ(lse − lse_b) = max(lse, lse_b) + log(1 + exp(−|lse − lse_b|)).
  if (lane == 0) lse[li] = fmaxf(a, c) + log1pf(e);
}

}  // namespace
}  // namespace cuda::attn

/// Causal GQA flash-attention forward (Device::attention_forward). bf16 tensors with Dh 64 or
/// 128 and 16-byte aligned data run the tensor-core FlashAttention-2 kernel; everything else
/// (f32, other head dims, misaligned views) the fp32 SIMT kernel.
/// @throws std::invalid_argument on inconsistent shapes (see attn::check_qkv; out like q, lse
///         [B, Hq, T]) or dtypes (q, k, v, out one of f32 / bf16; lse f32).
void CudaDevice::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, float scale, const DocumentMask& docs) {
  using namespace cuda::attn;
  static constexpr const char* kFn = "attention_forward";
  const Dims d = check_qkv(kFn, q, k, v);
  const DocTable dt = doc_table(kFn, d, docs);
  require_shape(kFn, "out", out, q.shape());
  require_shape(kFn, "lse", lse, {q.dim(0), q.dim(2), q.dim(1)});
  cuda::require_float(q, kFn, "q");
  for (const Tensor* t : {&k, &v, &out}) cuda::require_same(q, *t, kFn);
  cuda::require_dtype(lse, DType::kF32, kFn, "lse");
  if (d.b == 0 || d.tq == 0) return;
  forward<false, true>(d, q, k, v, out, lse, scale, dt, compute_);
}

/// One block of context-parallel attention (Device::attention_block_forward): the same kernels
/// as attention_forward, causal or unmasked, with an f32 output.
/// @throws std::invalid_argument on inconsistent shapes (attn::check_block_qkv; out like q, lse
///         [B, Hq, Tq]) or dtypes (q, k, v one of f32 / bf16; out, lse f32).
void CudaDevice::attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask,
                                         const Tensor& out, const Tensor& lse, float scale, const DocumentMask& docs) {
  using namespace cuda::attn;
  static constexpr const char* kFn = "attention_block_forward";
  const Dims d = check_block_qkv(kFn, q, k, v, mask);
  const DocTable dt = doc_table(kFn, d, docs);
  require_shape(kFn, "out", out, q.shape());
  require_shape(kFn, "lse", lse, {q.dim(0), q.dim(2), q.dim(1)});
  cuda::require_float(q, kFn, "q");
  for (const Tensor* t : {&k, &v}) cuda::require_same(q, *t, kFn);
  cuda::require_dtype(out, DType::kF32, kFn, "out");
  cuda::require_dtype(lse, DType::kF32, kFn, "lse");
  if (d.b == 0 || d.tq == 0) return;
  if (d.tk == 0) {
    // No key (kNone only): the empty softmax, which attention_merge treats as "nothing seen".
    fill(out, 0.0f);
    fill(lse, -INFINITY);
    return;
  }
  if (mask == AttentionMask::kCausal)
    forward<true, true>(d, q, k, v, out, lse, scale, dt, compute_);
  else
    forward<true, false>(d, q, k, v, out, lse, scale, dt, compute_);
}

/// Log-sum-exp merge of a block into the running result (Device::attention_merge), one warp
/// per (b, t, h) row, in place on out and lse.
/// @throws std::invalid_argument unless out, out_b are 4-D [B, T, H, Dh] of one shape and lse,
///         lse_b [B, H, T], all f32.
void CudaDevice::attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  using namespace cuda::attn;
  static constexpr const char* kFn = "attention_merge";
  if (out.ndim() != 4)
    throw std::invalid_argument(std::string(kFn) + ": out must be 4-D [B, T, H, Dh], got " + shape_str(out.shape()));
  const Shape ls{out.dim(0), out.dim(2), out.dim(1)};
  require_shape(kFn, "out_b", out_b, out.shape());
  require_shape(kFn, "lse", lse, ls);
  require_shape(kFn, "lse_b", lse_b, ls);
  cuda::require_dtype(out, DType::kF32, kFn, "out");
  cuda::require_dtype(out_b, DType::kF32, kFn, "out_b");
  cuda::require_dtype(lse, DType::kF32, kFn, "lse");
  cuda::require_dtype(lse_b, DType::kF32, kFn, "lse_b");
  const int64_t rows = out.dim(0) * out.dim(1) * out.dim(2);
  if (rows == 0) return;
  const int64_t blocks = (rows + 7) / 8;
  if (blocks > INT_MAX)
    throw std::invalid_argument(std::string(kFn) + ": too many rows for the launch grid, out " +
                                shape_str(out.shape()));
  attn_merge<<<unsigned(blocks), 256, 0, compute_>>>(out.f32(), lse.f32(), out_b.f32(), lse_b.f32(), rows,
                                                     out.dim(1), out.dim(2), out.dim(3));
  MT_CUDA_LAUNCH("attn_merge");
}

}  // namespace meshtrain
