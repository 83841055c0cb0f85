#pragma once
/// @file Async tensor parallelism: sequence parallelism's all-gather and reduce-scatter fused
/// with the matmuls next to them and cut into tp ring steps, so each step's transfer overlaps
/// the matmul of a row block already at hand — Wang et al. 2023 ("Overlap Communication with
/// Dependent Computation via Decomposition in Large Deep Learning Models", ASPLOS '23), the
/// micro-pipelined TP that PyTorch's fused all-gather-matmul / matmul-reduce-scatter and
/// TorchTitan's `enable_async_tensor_parallel` implement.
///
/// Sequence parallelism (model/tensor_parallel.hpp) splits the N = B·T rows of the residual
/// stream into tp contiguous blocks of n = N/tp rows, block j on tp rank j. Ranks form a ring:
/// rank r sends to r+1 and receives from r−1 (mod tp).
///
///  - all_gather_matmul (a column-parallel region's entry: x [n, D] → y_i = x · W_iᵀ [N, out_i]).
///    At step s = 0 … tp−1 rank r holds block b = r − s: it passes that block on to r+1 while
///    receiving block r − s − 1 from r−1, and meanwhile multiplies block b into rows b of every
///    output. After tp steps it has every block (the gathered x [N, D], kept for the weight
///    gradients) and every row of every output. Each output row comes from a GEMM on the same
///    row as tp_enter + a whole matmul: the results equal the synchronous ones, bit for bit where
///    the device's GEMM gives a block the same rows as the whole (the cpu device, with blocks of
///    a multiple of 16 rows; ~1e-7 relative otherwise).
///  - matmul_reduce_scatter (a row-parallel region's exit: Σ_ranks a · Wᵀ [N, D] → [n, D]).
///    An accumulator for block b starts on rank b+1 as that rank's partial product of rows b,
///    and travels the ring: each rank it reaches adds its own partial product of those rows
///    (computed while the accumulator was in flight) and passes it on, so after tp − 1 hops it
///    ends on rank b holding the sum over every rank. Only the summation order differs from a
///    reduce-scatter: ((P_{b+1} + P_{b+2}) + …) + P_b, the same for tp 2 (a + b == b + a).
///
/// Backward uses the same two operators with the roles swapped: the row-parallel layer's
/// output gradient dout [n, D] enters through all_gather_matmul (dh = dout · W2, gathered dout
/// kept for dW2), and the column-parallel layers' input gradient Σ_i dy_i · W_i leaves through
/// matmul_reduce_scatter. The weight gradients read the whole gathered tensors, computed as
/// linear_backward computes them (or recorded for the split backward's W pass).
///
/// Transfers are Communicator::send_recv_batch pairs with tags of their own (MPI: independent
/// non-blocking transfers; NCCL: one group on the communication stream), so every device runs
/// it. Float8 linears (the recipe's casts of each GEMM operand, layers/primitives.hpp): W's cast
/// and A's amax are taken once over the whole operand, as the synchronous path takes them, and
/// only the GEMM is cut into row blocks (linear_rows_gemm), so the results are the same. The
/// gathered operand's amax is known before its blocks arrive: tensorwise, the max over tp of
/// each rank's block amax (one all-reduce of one float); rowwise, each block's own rows. A
/// columnwise-scaled left operand (none of TorchAO's recipes has one) would keep the
/// synchronous collectives (tp_region_*). The
/// embedding, the output head and the routed experts keep the synchronous collectives too —
/// TorchTitan also applies async TP only to the blocks' sequence-parallel linears. Per-operator
/// checkpointing sees the fused entry's outputs as the same kMatmul operators as before (a
/// replay recomputes the fused operator whole and takes the kept outputs from its stash) and the
/// fused exit as one kCollective operator, kept as the reduce-scatter's output is.
#include <vector>

#include "model/layers/primitives.hpp"
#include "model/tensor_parallel.hpp"

namespace meshtrain {

/// Whether the layers run their tp regions through the fused operators below: tp > 1,
/// sequence parallelism and TensorParallel::async (TorchTitan applies async TP under the same
/// conditions; config refuses it without sequence parallelism). Throws nothing.
bool async_tp_active(const TensorParallel& tp);

/// One GEMM of a fused operator: linear layer `w` (a Parameter of the calling layer) and which
/// of its GEMMs — kForward: A · Wᵀ [rows, out]; kInputGrad: A · W [rows, in].
struct TpGemm {
  const Parameter* w = nullptr;
  LinearGemm gemm = LinearGemm::kForward;
};

/// What all_gather_matmul returns: the gathered left operand and one product per TpGemm.
struct AllGatherMatmul {
  Tensor gathered;           ///< [N, K]: tp_enter(a_local), rank order
  std::vector<Tensor> outs;  ///< outs[i] [N, cols_i] = gathered · op(W_i), kActivations
};

/// All-gather over tp of a_local [n, K] along the rows (N = n·tp), fused with the GEMMs `gemms`
/// whose left operand is the gathered [N, K] (K = in for kForward, out for kInputGrad), in tp
/// ring steps (file comment). Equal to tp_enter followed by one linear GEMM per entry (bitwise
/// where the device's GEMM rows do not depend on the row count: on the cpu device when n is a
/// multiple of 16). Float8 linears read their operands through their recipe's casts.
/// Collective over tp: every rank calls it with the same shapes. Source: Wang et al. 2023;
/// PyTorch's fused_all_gather_matmul (torch.distributed._symmetric_memory), as TorchTitan uses it.
/// @throws std::invalid_argument unless async_tp_active(tp), on an empty `gemms`, a GEMM whose
/// inner size is not K, or a Float8 cast of A by columns (linear_rows_separable); CommError.
AllGatherMatmul all_gather_matmul(Device& dev, const TensorParallel& tp, const Tensor& a_local,
                                  const std::vector<TpGemm>& gemms);

/// Σ_i lhs[i] · op(W_i) over this rank's lhs[i] [N, K_i] (a row-parallel layer's partial sum,
/// or the column-parallel layers' summed input gradients), reduce-scattered over tp along the
/// rows: returns this rank's block [N/tp, cols] (kActivations) of the sum over tp, in tp ring
/// steps (file comment). Equal to the products accumulated in `gemms` order (beta 0, then 1)
/// followed by tp_exit, up to the order of the sum over ranks (bitwise for tp 2). Collective over
/// tp. Source: Wang et al. 2023; PyTorch's fused_matmul_reduce_scatter, as TorchTitan uses it.
/// @throws std::invalid_argument unless async_tp_active(tp), on sizes that do not match
/// (lhs.size() != gemms.size(), rows not divisible by tp or differing, output widths differing)
/// or a Float8 cast of A by columns; CommError.
Tensor matmul_reduce_scatter(Device& dev, const TensorParallel& tp, const std::vector<Tensor>& lhs,
                             const std::vector<TpGemm>& gemms);

/// The tp regions of the blocks' attention and feed-forward layers (Megatron-LM's column- then
/// row-parallel pairs), synchronous or async as ctx.tp says — TorchTitan's async TP covers the
/// same linears; with tp == 1 they are the plain linear maps.

/// Entry of a column-parallel region: x_local [n, D] → gathered [N, D] (tp_enter) and, under
/// async TP, outs[i] = x · W_iᵀ [N, out_i] of `weights` (all_gather_matmul); otherwise outs is
/// empty (synchronous TP, no tp, or a weight whose A cast is not separable by rows) and the
/// layer runs linear_forward on `gathered` itself. @throws CommError.
AllGatherMatmul tp_region_enter(const StepContext& ctx, const Tensor& x_local,
                                const std::vector<const Parameter*>& weights);

/// Exit of a row-parallel region in forward: h [N, K] · Wᵀ reduced over tp → [n, D] (sequence
/// parallel) or [N, D]. Synchronous: a kMatmul operator then tp_exit_kept; async: one kCollective
/// operator (matmul_reduce_scatter), whose output per-operator checkpointing keeps as it keeps
/// the reduce-scatter's. @throws CommError.
Tensor tp_region_exit(const StepContext& ctx, SavedTensors& saved, const Tensor& h, const Parameter& w);

/// Backward of tp_region_exit: dout_local [n, D] (sequence parallel) → dh = dout · W [N, K], with
/// w's weight gradient from the gathered dout and h [N, K] (computed, or deferred as
/// linear_backward defers it). Async:
/// all_gather_matmul; else tp_enter + linear_backward. @throws CommError.
Tensor tp_region_exit_backward(const StepContext& ctx, const Tensor& dout_local, const Tensor& h, const Parameter& w);

/// Backward of tp_region_enter: the input gradient Σ_i dys[i] · W_i reduced over tp → [n, D],
/// with each W_i's weight gradient from dys[i] [N, out_i] and the gathered x [N, D]. Async:
/// matmul_reduce_scatter; else linear_backward accumulating dx, then tp_exit. @throws CommError.
Tensor tp_region_enter_backward(const StepContext& ctx, const std::vector<Tensor>& dys, const Tensor& x,
                                const std::vector<const Parameter*>& weights);

}  // namespace meshtrain
