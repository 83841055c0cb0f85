#pragma once
/// @file Shared pieces of the grouped-query flash-attention kernels (attention_fwd.cu,
/// attention_bwd.cu): host-side argument checks, the tile constants, and the
/// register-level tensor-core helpers (cp.async, ldmatrix, mma.sync m16n8k16 bf16) used by the
/// FlashAttention-2 kernels (Dao 2023, "FlashAttention-2: Faster Attention with Better
/// Parallelism and Work Partitioning", Algorithms 1 and 2). Fragment layouts follow the PTX ISA
/// sections "Matrix Fragments for mma.m16n8k16" and "ldmatrix".
///
/// Conventions of every kernel: q [B, Tq, Hq, Dh], k, v [B, Tk, Hkv, Dh], out / dout / dq like
/// q, dk / dv like k (row-major, so row t of head h starts at (b·T + t)·H·Dh + h·Dh), lse and the
/// backward's D = rowsum(dO ∘ O) f32 [B, Hq, Tq]. Query head h reads kv head h / (Hq / Hkv).
/// CAUSAL kernels (Device::attention_forward / _backward, and the diagonal block of
/// attention_block_*) have Tq == Tk and query t attends keys s ≤ t; the others (a key block
/// wholly before the query block, Liu et al. 2023, Ring Attention) attend every key. Every
/// kernel also takes a DocTable: under document masking (TorchTitan's block_causal) a query
/// attends only keys at or after its document's start, key tiles wholly before a query tile's
/// documents are skipped (FlashAttention-2's varlen / block-sparse idea, Dao 2023 §3), and so
/// are, in the dK/dV kernels, query tiles wholly after a key tile's documents.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "device/cuda/kernel_common.cuh"
#include "device/device.hpp"

namespace meshtrain::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- SIMT (f32 math) kernels: the f32 path and the bf16 fallback for Dh ∉ {64, 128} ----
// A block is 4 warps. Each warp owns kSimtRowsPerWarp rows of the "resident" side (queries in
// forward and dQ, keys in dK/dV) with the head dimension spread over its lanes (dim d on lane
// d % 32), while the streamed side (keys, resp. queries) is staged in shared memory 32 rows at a
// time, one row per lane, so a lane computes a whole dot product without cross-lane reductions.
// Their __launch_bounds__ name a minimum of 1 block per SM: with the default, ptxas capped
// several instantiations at 64 registers and spilled.
constexpr int kSimtThreads = 128;
constexpr int kSimtRowsPerWarp = 4;
constexpr int kSimtRows = 4 * kSimtRowsPerWarp;  // resident rows per block
constexpr int kSimtCols = 32;                    // streamed rows per tile (one per lane)
constexpr int kSimtMaxDh = 256;

// ---- tensor-core (bf16, Dh ∈ {64, 128}) kernels ----
// 4 warps per block, 16 resident rows per warp (the M of one m16n8k16 MMA).
constexpr int kTcThreads = 128;
constexpr int kTcRows = 64;

/// Sizes of one attention call, as ints (checked to fit): tq queries and tk keys per sequence.
struct Dims {
  int b, tq, tk, hq, hkv, dh;
};

/// Checks q [B, Tq, Hq, Dh], k and v [B, Tk, Hkv, Dh] of one attention call named `fn` and
/// returns the sizes; `same_t` requires Tk == Tq (the causal kernels). @throws
/// std::invalid_argument unless they are 4-D and consistent, Hq is a positive multiple of Hkv,
/// Dh is even and in [2, 256], and Tq, Tk fit the launch grid.
inline Dims check_qkv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v, bool same_t = true) {
  const std::string shapes =
      " (q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " + shape_str(v.shape()) + ")";
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw std::invalid_argument(std::string(fn) + ": q, k, v must be 4-D [B, T, H, Dh]" + shapes);
  if (k.shape() != v.shape() || k.dim(0) != q.dim(0) || k.dim(3) != q.dim(3) || (same_t && k.dim(1) != q.dim(1)))
    throw std::invalid_argument(std::string(fn) + ": k and v must be [B, " + (same_t ? "T" : "Tk") +
                                ", Hkv, Dh] matching q" + shapes);
  const int64_t hq = q.dim(2), hkv = k.dim(2), dh = q.dim(3), tq = q.dim(1), tk = k.dim(1), b = q.dim(0);
  if (hq < 1 || hkv < 1 || hq % hkv != 0)
    throw std::invalid_argument(std::string(fn) + ": query heads Hq must be a positive multiple of kv heads Hkv" +
                                shapes);
  if (dh < 2 || dh > kSimtMaxDh || dh % 2 != 0)
    throw std::invalid_argument(std::string(fn) + ": head dim Dh must be even and in [2, " +
                                std::to_string(kSimtMaxDh) + "]" + shapes);
  // Query / key tiles index grid.y (≤ 65535 blocks of the smallest tile, 16 rows); batch × heads
  // index grid.x.
  if (tq > int64_t(65535) * kSimtRows || tk > int64_t(65535) * kSimtRows || b * hq > INT_MAX)
    throw std::invalid_argument(std::string(fn) + ": sequence or batch too large for the launch grid" + shapes);
  return Dims{int(b), int(tq), int(tk), int(hq), int(hkv), int(dh)};
}

/// check_qkv for one block of Device::attention_block_forward / _backward: any Tk with
/// kNone, Tk == Tq with kCausal (the diagonal block). @throws std::invalid_argument as
/// check_qkv, and for kCausal with Tq != Tk.
inline Dims check_block_qkv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask) {
  const Dims d = check_qkv(fn, q, k, v, false);
  if (mask == AttentionMask::kCausal && d.tq != d.tk)
    throw std::invalid_argument(std::string(fn) + ": mask kCausal (the diagonal block) needs Tq == Tk (q " +
                                shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ")");
  return d;
}

/// The document mask of one kernel launch (DocumentMask, `[model] attn_mask_type =
/// "block_causal"`), passed by value: starts = doc_start i32 [B, seq] in device memory (nullptr:
/// no document mask), q_off / k_off the global positions of the call's first query / key row.
/// Query i of sample b sees key s (both call-local) only when s + k_off ≥ starts[b·seq + q_off + i],
/// on top of the causal rule. Documents are contiguous, so the starts never decrease along a
/// sample and every row's visible keys are one range: the kernels skip key tiles below a query
/// tile's first start and query tiles past the last query of a key tile's documents.
struct DocTable {
  const int32_t* starts = nullptr;
  int seq = 0, q_off = 0, k_off = 0;
};

/// The DocTable of `docs` for a call of sizes d named `fn` ({} when docs is inactive).
/// @throws std::invalid_argument unless docs.doc_start is i32 [B, T] with T covering queries
///         q_offset … q_offset + Tq − 1 and keys k_offset … k_offset + Tk − 1 (T < 2³¹), the
///         rule of CpuDevice's kernels.
inline DocTable doc_table(const char* fn, const Dims& d, const DocumentMask& docs) {
  if (!docs.active()) return {};
  const Tensor& t = docs.doc_start;
  if (t.dtype() != DType::kI32 || t.ndim() != 2 || t.dim(0) != d.b || docs.q_offset < 0 || docs.k_offset < 0 ||
      t.dim(1) < docs.q_offset + d.tq || t.dim(1) < docs.k_offset + d.tk || t.dim(1) > INT_MAX)
    throw std::invalid_argument(std::string(fn) + ": doc_start must be i32 [B = " + std::to_string(d.b) +
                                ", T] covering queries from " + std::to_string(docs.q_offset) + " and keys from " +
                                std::to_string(docs.k_offset) + ", got " + dtype_name(t.dtype()) + " " +
                                shape_str(t.shape()));
  return DocTable{t.i32(), int(t.dim(1)), int(docs.q_offset), int(docs.k_offset)};
}

/// The first key (call-local; may be < 0, meaning key 0, or past the last key, meaning none)
/// that query i (call-local, < Tq) of sample b sees under the document mask t (t.starts set).
__device__ __forceinline__ int doc_first_key(const DocTable& t, int b, int i) {
  return __ldg(t.starts + int64_t(b) * t.seq + t.q_off + i) - t.k_off;
}

/// How many leading queries of sample b (of seq_q) see some key ≤ key (call-local) under the
/// document mask t (t.starts set): the first i with doc_first_key(i) > key, by binary search
/// (the starts never decrease), seq_q when none. Queries from there on see no key ≤ key.
__device__ __forceinline__ int doc_query_end(const DocTable& t, int b, int key, int seq_q) {
  int lo = 0, hi = seq_q;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (doc_first_key(t, b, mid) > key)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/// The document mask's bounds for one tensor-core query tile (kTcRows rows from q0, warp w owning
/// rows q0 + 16w …): fk, the first keys of this thread's rows g = lane / 4 and g + 8 (rows ≥ Tq,
/// never stored, see none); kt0, the first key tile of BK keys holding a key any row sees (the
/// starts never decrease, so it is the first row's); fk_last, the last row's first key: a key
/// tile starting below it needs the per-element mask, one at or above it is visible to every
/// row. All 0 without a mask (docs.starts nullptr).
struct TileDocs {
  int fk[2] = {0, 0};
  int kt0 = 0, fk_last = 0;
};
template <int BK>
__device__ __forceinline__ TileDocs tile_docs(const DocTable& docs, int b, int q0, int seq_q, int warp, int lane) {
  TileDocs r;
  if (!docs.starts) return r;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int t = q0 + warp * 16 + (lane >> 2) + rr * 8;
    r.fk[rr] = t < seq_q ? doc_first_key(docs, b, t) : INT_MAX;
  }
  r.kt0 = max(0, doc_first_key(docs, b, q0)) / BK;
  r.fk_last = doc_first_key(docs, b, min(q0 + kTcRows, seq_q) - 1);
  return r;
}

/// @throws std::invalid_argument unless t has shape s.
inline void require_shape(const char* fn, const char* arg, const Tensor& t, const Shape& s) {
  if (t.shape() != s)
    throw std::invalid_argument(std::string(fn) + ": " + arg + " must be " + shape_str(s) + ", got " +
                                shape_str(t.shape()));
}

/// Whether t's first element is 16-byte aligned (tensor-core kernels copy 16-byte chunks; a
/// view at an odd element offset is not, and then takes the SIMT path).
inline bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.raw()) & 15u) == 0; }

/// The SIMT kernels' compile-time head-dim capacity for a runtime dh (≤ 256): the smallest of
/// 32, 64, 128, 256 that holds it (each lane owns cap / 32 dims).
inline int simt_dh_cap(int dh) { return dh <= 32 ? 32 : dh <= 64 ? 64 : dh <= 128 ? 128 : 256; }

/// Opts `kernel` into `bytes` of dynamic shared memory when above the 48 KiB default
/// (cudaFuncAttributeMaxDynamicSharedMemorySize). @throws std::runtime_error on failure.
template <class Kernel>
inline void allow_dynamic_smem(Kernel* kernel, size_t bytes) {
  if (bytes > 48u * 1024u)
    MT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// ---- device helpers of the tensor-core kernels (sm_80+) ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte asynchronous global → shared copy; when !valid nothing is read and the 16 bytes are
/// zero-filled (src-size 0), so padded tile rows hold zeros rather than stale data.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
#endif
}
/// 4-byte variant (per-row f32 statistics), zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 4 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i
/// receives matrix i with lane l holding row l/4, columns 2(l%4), 2(l%4)+1.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#endif
}
/// As ldsm_x4 but transposed: lane l holds rows 2(l%4), 2(l%4)+1 of column l/4.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#endif
}

/// d[16x8] += a[16x16] · b[16x8], bf16 inputs, f32 accumulation. With g = lane / 4 and
/// c = 2·(lane % 4): a = {(g, c..c+1), (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9)} as (row,
/// k) pairs; b = {(k c..c+1, col g), (k c+8..c+9, col g)}; d = {(g, c), (g, c+1), (g+8, c),
/// (g+8, c+1)}.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/// Two floats as a bf16x2 register, `lo` in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

/// Writes one output element: converted to TO, or, when ACC, added to the f32 value already
/// there (the block backward accumulates into f32 gradients). Every element has exactly one
/// writing thread in every kernel, so the read-modify-write needs no atomics and is
/// deterministic.
template <class TO, bool ACC>
__device__ __forceinline__ void store_out(TO* p, float v) {
  static_assert(!ACC || std::is_same_v<TO, float>, "accumulated outputs are f32");
  if constexpr (ACC)
    *p += v;
  else
    *p = from_f<TO>(v);
}

/// store_out for two adjacent elements (a fragment's column pair): one bf16x2 or float2 access,
/// so p must be 4-byte (bf16) or 8-byte (f32) aligned.
template <class TO, bool ACC>
__device__ __forceinline__ void store_out2(TO* p, float lo, float hi) {
  static_assert(!ACC || std::is_same_v<TO, float>, "accumulated outputs are f32");
  if constexpr (std::is_same_v<TO, float>) {
    float2* p2 = reinterpret_cast<float2*>(p);
    if constexpr (ACC) {
      const float2 old = *p2;
      lo += old.x;
      hi += old.y;
    }
    *p2 = make_float2(lo, hi);
  } else {
    *reinterpret_cast<uint32_t*>(p) = pack_bf16(lo, hi);
  }
}

/// The A fragment (16 rows x 16 k) for k-step kk of a 16-row block held as m16n8 accumulators
/// c[n-block][4] (n-blocks 2kk and 2kk+1), rounded to bf16: how P and dS stay in registers
/// between the two MMAs of a FlashAttention-2 step.
template <int NB>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[NB][4], int kk) {
  a[0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/// Smem byte offset pattern of ldmatrix.x4 for a row-major [rows][ld] bf16 tile:
///  - a_off: the A fragment of rows r0..r0+15, k-columns k0..k0+15 (also the B fragments of
///    a [k][n] row-major tile with .trans: k-rows r0..r0+15, n-columns k0..k0+7 → regs 0,1 and
///    k0+8..k0+15 → regs 2,3);
///  - b_off: the B fragments of a [n][k] row-major tile (i.e. Bᵀ stored), n-rows r0..r0+7 →
///    regs 0,1 and r0+8..r0+15 → regs 2,3, k-columns k0..k0+15.
__device__ __forceinline__ int a_off(int lane, int r0, int k0, int ld) {
  return (r0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3);
}
__device__ __forceinline__ int b_off(int lane, int r0, int k0, int ld) {
  return (r0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3);
}

/// Issues the cp.async copies of rows [r0, r0 + ROWS) of one head (row r at g + r·stride, DH
/// contiguous bf16) into a shared tile [ROWS][DH + 8]; rows ≥ n are zero-filled. All
/// kTcThreads threads of the block must call it. The 8-element row padding shifts consecutive
/// rows by 16 bytes (mod 128), so the 8 row addresses of every ldmatrix hit distinct banks.
template <int ROWS, int DH>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* g, int64_t stride, int r0, int n) {
  constexpr int kChunks = DH / 8, kLd = DH + 8;
  static_assert(ROWS * kChunks % kTcThreads == 0, "tile chunks must split evenly over the block");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / kTcThreads; ++it) {
    const int i = it * kTcThreads + int(threadIdx.x);
    const int r = i / kChunks, c = i % kChunks, t = r0 + r;
    const bool ok = t < n;
    cp_async_16(s + r * kLd + c * 8, g + (ok ? int64_t(t) * stride : 0) + c * 8, ok);
  }
}

/// Two warp-level products over one shared k loop, as backward recomputes them side by side
/// (S = A₁·B₁ᵀ with dP = A₂·B₂ᵀ, or their transposes): c1 = A₁·B₁ᵀ and c2 = A₂·B₂ᵀ, fp32, for
/// the warp's 16 rows × NB·8 columns. The A fragments come from registers r1 / r2 ([KS][4], the
/// k-steps of 16) when KEEP, else from the [*, ld] shared tiles a1 / a2 at row `row0`; B from the
/// [NB·8, KS·16] row-major shared tiles b1 / b2. c1, c2 are overwritten.
template <int NB, int KS, bool KEEP, int RK>
__device__ __forceinline__ void mma_pair(float (&c1)[NB][4], float (&c2)[NB][4], const uint32_t (&r1)[RK][4],
                                         const uint32_t (&r2)[RK][4], const bf16* a1, const bf16* a2, int row0,
                                         const bf16* b1, const bf16* b2, int ld, int lane) {
#pragma unroll
  for (int i = 0; i < NB; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) c1[i][e] = c2[i][e] = 0.0f;
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    uint32_t f1[4], f2[4];
    if constexpr (KEEP) {
#pragma unroll
      for (int e = 0; e < 4; ++e) f1[e] = r1[s][e], f2[e] = r2[s][e];
    } else {
      ldsm_x4(f1, a1 + a_off(lane, row0, s * 16, ld));
      ldsm_x4(f2, a2 + a_off(lane, row0, s * 16, ld));
    }
#pragma unroll
    for (int n2 = 0; n2 < NB / 2; ++n2) {
      uint32_t f[4];
      ldsm_x4(f, b1 + b_off(lane, n2 * 16, s * 16, ld));
      mma_bf16_16816(c1[2 * n2], f1, f[0], f[1]);
      mma_bf16_16816(c1[2 * n2 + 1], f1, f[2], f[3]);
      ldsm_x4(f, b2 + b_off(lane, n2 * 16, s * 16, ld));
      mma_bf16_16816(c2[2 * n2], f2, f[0], f[1]);
      mma_bf16_16816(c2[2 * n2 + 1], f2, f[2], f[3]);
    }
  }
}

/// SIMT accumulation of weighted shared-memory rows (P·V in forward, dS·K for dQ): acc[r][c] +=
/// Σ_{j < jn} w_j[r] · rows[j·ld + lane + 32c] for the dims lane + 32c < dh, where lane j holds
/// the weights w_j[0..R) of row j (broadcast with __shfl_sync). jn ≤ 32, warp-uniform.
template <int R, int NC>
__device__ __forceinline__ void accumulate_weighted_rows(float (&acc)[R][NC], const float (&w)[R], const float* rows,
                                                         int ld, int jn, int dh, int lane) {
  for (int j = 0; j < jn; ++j) {
    float wj[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wj[r] = __shfl_sync(0xffffffffu, w[r], j);
    const float* row = rows + j * ld;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) {
        const float x = row[d];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][c] = fmaf(wj[r], x, acc[r][c]);
      }
    }
  }
}

}  // namespace meshtrain::cuda::attn
