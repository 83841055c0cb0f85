#pragma once
/// @file Token statistics.
#include "data/token_store.hpp"

namespace meshtrain {

/// Entropy of the empirical unigram distribution of `split`'s tokens, −Σ p·ln p in nats: the
/// cross-entropy of the best model that knows only token frequencies (measured on the split
/// itself, so it is a slightly optimistic baseline). @throws DataError on an empty split.
double unigram_entropy(const TokenSplit& split, int64_t vocab_size);

}  // namespace meshtrain
