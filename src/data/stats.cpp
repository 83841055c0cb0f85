#include "data/stats.hpp"

#include <cmath>
#include <vector>

#include "util/errors.hpp"

namespace meshtrain {

double unigram_entropy(const TokenSplit& split, int64_t vocab_size) {
  if (split.tokens.empty()) throw DataError("unigram entropy of an empty split");
  std::vector<int64_t> counts(size_t(vocab_size), 0);
  for (int32_t t : split.tokens) ++counts.at(size_t(t));
  const double n = double(split.tokens.size());
  double h = 0;
  for (int64_t c : counts)
    if (c) h -= double(c) / n * std::log(double(c) / n);
  return h;
}

}  // namespace meshtrain
