#include "plan/document_mask.hpp"

#include <cstddef>

namespace meshtrain {

double document_attention_share(double doc, double window) {
  if (doc <= 0 || window <= 0) return 1.0;
  if (doc >= window) return 1.0 - window / (3.0 * doc);
  const double r = doc / window;
  return r - r * r / 3.0;
}

double token_weighted_document_tokens(const std::vector<uint64_t>& doc_offsets) {
  double sum = 0, squares = 0;
  for (std::size_t i = 0; i + 1 < doc_offsets.size(); ++i) {
    const double l = double(doc_offsets[i + 1] - doc_offsets[i]);
    sum += l;
    squares += l * l;
  }
  return sum > 0 ? squares / sum : 0.0;
}

}  // namespace meshtrain
