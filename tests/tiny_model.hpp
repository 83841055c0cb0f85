#pragma once
// A small model shape shared by unit tests and the gradient-dump tool: big enough to exercise
// grouped-query attention and several blocks, small enough to run in milliseconds.
#include "config/model_args.hpp"

namespace meshtrain::testing {

inline ModelArgs tiny_model_args(int64_t dim = 32, int64_t layers = 3, int64_t heads = 4, int64_t kv_heads = 2,
                                 int64_t vocab = 50) {
  ModelArgs a;
  a.dim = dim;
  a.n_layers = layers;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = dim / heads;
  a.vocab_size = vocab;
  a.multiple_of = 16;
  return a;
}

}  // namespace meshtrain::testing
