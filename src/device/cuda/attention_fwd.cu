// Causal grouped-query flash attention, forward (CudaDevice::attention_forward).
//
// Two kernels, one algorithm: the online-softmax tiling of FlashAttention (Dao et al. 2022,
// Algorithm 1) as reorganized by FlashAttention-2 (Dao 2023, Algorithm 1): a block owns a tile
// of query rows of one (batch, query head), streams the key/value rows at or below the diagonal
// through shared memory, keeps the running row max m, row sum l and the unnormalized output in
// registers, and normalizes once at the end; lse = m + log(l) (natural log of the scaled scores)
// is saved for the backward pass.
//
//  - attn_fwd_tc<DH>: bf16, DH ∈ {64, 128}, tensor cores (mma.sync m16n8k16, fp32 accumulation),
//    64 query rows per block (4 warps x 16), key/value tiles of 64 double-buffered with cp.async.
//    P never leaves registers: the S accumulators are re-packed as the A operand of P·V.
//  - attn_fwd_simt<T, DHP>: fp32 math for f32 tensors (the 1e-5 correctness path) and for bf16
//    with other head dims; 16 query rows per block, 32 keys per tile (one per lane).
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

/// grid (B·Hq, ceil(T / 16)), block 128, dynamic smem fwd_simt_smem(dh). DHP ≥ dh is the
/// per-warp register capacity of the head dim (lane owns dims lane + 32c, c < DHP / 32).
template <class T, int DHP>
__global__ void __launch_bounds__(kSimtThreads, 1)
    attn_fwd_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                  float* __restrict__ lse, int seq, int hq, int hkv, int dh, float scale) {
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
  const T* qg = q + int64_t(b) * seq * qstride + int64_t(h) * dh;
  const T* kg = k + int64_t(b) * seq * kstride + int64_t(kvh) * dh;
  const T* vg = v + int64_t(b) * seq * kstride + int64_t(kvh) * dh;

  // Scaling q first reproduces the reference's Σ_c (q_c·scale)·k_c rounding.
  for (int i = tid; i < kSimtRows * dh; i += kSimtThreads) {
    const int r = i / dh, c = i - r * dh, t = q0 + r;
    qs[i] = t < seq ? to_f(qg[int64_t(t) * qstride + c]) * scale : 0.0f;
  }

  float m[R], l[R], o[R][NC];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[r][c] = 0.0f;
  }

  const int kend = min(q0 + kSimtRows, seq);  // keys any row of this block may attend
  const int n_kt = (kend + kSimtCols - 1) / kSimtCols;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int k0 = kt * kSimtCols;
    __syncthreads();  // the previous tile is consumed before it is overwritten
    for (int i = tid; i < kSimtCols * dh; i += kSimtThreads) {
      const int j = i / dh, c = i - j * dh, s = k0 + j;
      const bool ok = s < seq;
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
      const bool valid = key <= t && key < seq;
      const float s = valid ? sc[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));
      // m_new is -inf only while a row has seen no valid key (never for rows < T, whose key 0
      // is in the first tile); a finite base keeps exp(−inf − base) = 0 instead of NaN.
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
    if (t >= seq) continue;  // warp-uniform
    const float inv = 1.0f / l[r];
    T* orow = out + (int64_t(b) * seq + t) * qstride + int64_t(h) * dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) orow[d] = from_f<T>(o[r][c] * inv);
    }
    if (lane == 0) lse[(int64_t(b) * hq + h) * seq + t] = m[r] + logf(l[r]);
  }
}

template <class T, int DHP>
void launch_fwd_simt(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, float scale, cudaStream_t stream) {
  const size_t smem = fwd_simt_smem(d.dh);
  allow_dynamic_smem(attn_fwd_simt<T, DHP>, smem);
  const dim3 grid(unsigned(d.b * d.hq), unsigned((d.t + kSimtRows - 1) / kSimtRows));
  attn_fwd_simt<T, DHP><<<grid, kSimtThreads, smem, stream>>>(
      static_cast<const T*>(q.raw()), static_cast<const T*>(k.raw()), static_cast<const T*>(v.raw()),
      static_cast<T*>(out.raw()), lse.f32(), d.t, d.hq, d.hkv, d.dh, scale);
  MT_CUDA_LAUNCH("attn_fwd_simt");
}

template <class T>
void fwd_simt(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, float scale, cudaStream_t stream) {
  switch (simt_dh_cap(d.dh)) {
    case 32: return launch_fwd_simt<T, 32>(d, q, k, v, out, lse, scale, stream);
    case 64: return launch_fwd_simt<T, 64>(d, q, k, v, out, lse, scale, stream);
    case 128: return launch_fwd_simt<T, 128>(d, q, k, v, out, lse, scale, stream);
    default: return launch_fwd_simt<T, 256>(d, q, k, v, out, lse, scale, stream);
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

/// grid (B·Hq, ceil(T / 64)), block 128 (warp w owns query rows q0 + 16w .. q0 + 16w + 15),
/// dynamic smem fwd_tc_smem<DH>(). scale_log2 = scale · log2(e): scores are kept in base-2 units
/// so each probability is one exp2f. Pointers 16-byte aligned.
template <int DH>
__global__ void __launch_bounds__(kTcThreads)
    attn_fwd_tc(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                bf16* __restrict__ out, float* __restrict__ lse, int seq, int hq, int hkv, float scale_log2) {
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
  const bf16* qg = q + int64_t(b) * seq * qstride + int64_t(h) * DH;
  const bf16* kg = k + int64_t(b) * seq * kstride + int64_t(kvh) * DH;
  const bf16* vg = v + int64_t(b) * seq * kstride + int64_t(kvh) * DH;

  // Key tiles 0..qt: with 64-row query and key tiles, tile qt holds the diagonal and every key
  // < min(q0 + 64, T); tiles before it are entirely visible (all their keys < q0 ≤ every row).
  const int n_kt = qt + 1;

  load_tile_async<kTcRows, DH>(qs, qg, qstride, q0, seq);
  load_tile_async<kFwdBk, DH>(ks, kg, kstride, 0, seq);
  load_tile_async<kFwdBk, DH>(vs, vg, kstride, 0, seq);
  cp_async_commit();

  uint32_t qf[KS][4];
  float o[ND][4];
#pragma unroll
  for (int i = 0; i < ND; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  // Each thread holds rows g = lane/4 and g + 8 of its warp's 16 (index rr = 0, 1); m is in
  // scaled base-2 units, l is this thread's partial row sum (reduced over the quad at the end).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_kt) {
      // Buffer buf^1 was last read in iteration kt-1, which ended with __syncthreads.
      load_tile_async<kFwdBk, DH>(ks + (buf ^ 1) * kFwdBk * LD, kg, kstride, (kt + 1) * kFwdBk, seq);
      load_tile_async<kFwdBk, DH>(vs + (buf ^ 1) * kFwdBk * LD, vg, kstride, (kt + 1) * kFwdBk, seq);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile kt
    cp_async_wait<1>();
    __syncthreads();

    if (kt == 0) {
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

    // To base-2 scaled units, then the causal mask on the diagonal tile (k0 == q0, so local
    // indices compare directly; keys ≥ T there are also > every row < T).
#pragma unroll
    for (int i = 0; i < NB; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[i][e] *= scale_log2;
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

  // Epilogue: full row sums, normalize, store rows < T.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int t = q0 + warp * 16 + (lane >> 2) + rr * 8;
    if (t >= seq) continue;
    const float inv = 1.0f / l[rr];
    bf16* orow = out + (int64_t(b) * seq + t) * qstride + int64_t(h) * DH + ((lane & 3) << 1);
#pragma unroll
    for (int i = 0; i < ND; ++i)
      *reinterpret_cast<uint32_t*>(orow + i * 8) = pack_bf16(o[i][2 * rr] * inv, o[i][2 * rr + 1] * inv);
    // Natural log of Σ exp(scaled score): m is in base-2 units.
    if ((lane & 3) == 0) lse[(int64_t(b) * hq + h) * seq + t] = m[rr] * kLn2 + logf(l[rr]);
  }
}

template <int DH>
void launch_fwd_tc(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, float scale, cudaStream_t stream) {
  constexpr size_t smem = fwd_tc_smem<DH>();
  allow_dynamic_smem(attn_fwd_tc<DH>, smem);
  const dim3 grid(unsigned(d.b * d.hq), unsigned((d.t + kTcRows - 1) / kTcRows));
  attn_fwd_tc<DH><<<grid, kTcThreads, smem, stream>>>(
      static_cast<const bf16*>(q.raw()), static_cast<const bf16*>(k.raw()), static_cast<const bf16*>(v.raw()),
      static_cast<bf16*>(out.raw()), lse.f32(), d.t, d.hq, d.hkv, scale * kLog2e);
  MT_CUDA_LAUNCH("attn_fwd_tc");
}

}  // namespace
}  // namespace cuda::attn

/// Causal GQA flash-attention forward (Device::attention_forward). bf16 tensors with Dh 64 or
/// 128 and 16-byte aligned data run the tensor-core FlashAttention-2 kernel; everything else
/// (f32, other head dims, misaligned views) the fp32 SIMT kernel.
/// @throws std::invalid_argument on inconsistent shapes (see attn::check_qkv; out like q, lse
///         [B, Hq, T]) or dtypes (q, k, v, out one of f32 / bf16; lse f32).
void CudaDevice::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, float scale) {
  using namespace cuda::attn;
  static constexpr const char* kFn = "attention_forward";
  const Dims d = check_qkv(kFn, q, k, v);
  require_shape(kFn, "out", out, q.shape());
  require_shape(kFn, "lse", lse, {q.dim(0), q.dim(2), q.dim(1)});
  cuda::require_float(q, kFn, "q");
  for (const Tensor* t : {&k, &v, &out}) cuda::require_same(q, *t, kFn);
  cuda::require_dtype(lse, DType::kF32, kFn, "lse");
  if (d.b == 0 || d.t == 0) return;

  const bool tc = q.dtype() == DType::kBF16 && (d.dh == 64 || d.dh == 128) && aligned16(q) && aligned16(k) &&
                  aligned16(v) && aligned16(out);
  if (tc) {
    if (d.dh == 64)
      launch_fwd_tc<64>(d, q, k, v, out, lse, scale, compute_);
    else
      launch_fwd_tc<128>(d, q, k, v, out, lse, scale, compute_);
    return;
  }
  MT_DISPATCH_FLOAT(q.dtype(), T, fwd_simt<T>(d, q, k, v, out, lse, scale, compute_));
}

}  // namespace meshtrain
