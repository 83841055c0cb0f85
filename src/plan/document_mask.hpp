#pragma once
/// @file Attention's cost under document masking (`[model] attn_mask_type = "block_causal"`):
/// each token attends only to earlier tokens of its own document inside a packed window, and the
/// attention kernels skip key blocks wholly outside the mask, so the work follows the documents.
///
/// Convention (doc/plan.md): documents of `doc` tokens packed end to end, a window of `window`
/// tokens starting anywhere. A window then holds whole documents and two cut ones, and the
/// attended (query, key) pairs are Σ l² / 2 over its segments against window² / 2 causal:
///   doc ≤ window: share = doc / window − doc² / (3·window²)   (E Σ l² = window·doc − doc²/3)
///   doc ≥ window: share = 1 − window / (3·doc)                (at most one boundary inside)
/// The two agree at doc = window (2/3). For documents of varied lengths `doc` is the
/// token-weighted mean E[l²] / E[l] (the length of the document an average token sits in), which
/// is what Σ l² over a long window counts. FLOPs and MFU keep counting attention as causal, as
/// TorchTitan and `meshtrain train` do; only the predicted time follows the mask.
#include <cstdint>
#include <vector>

namespace meshtrain {

/// The share of causal attention's FLOPs document masking leaves (the formulas above), in
/// (0, 1]; 1 for doc ≤ 0 (no document lengths: counted as causal) or window ≤ 0. Throws nothing.
double document_attention_share(double doc, double window);

/// The token-weighted mean document length E[l²] / E[l] of a split whose documents start at
/// `doc_offsets` ([documents + 1], ascending, TokenSplit's); 0 when it holds no document.
/// Throws nothing.
double token_weighted_document_tokens(const std::vector<uint64_t>& doc_offsets);

}  // namespace meshtrain
