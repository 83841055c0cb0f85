#pragma once
/// @file ParameterCatalog: every parameter of the whole model — global name, global shape,
/// this rank's tensor-parallel placement, init rule — built from the model arguments alone,
/// whether or not this rank holds the parameter (DESIGN.md, model parts). Under pipeline
/// parallelism a rank builds only its stages' layers, yet parallel HDF5 creates every dataset
/// collectively and the non-finite guard names parameters by a world-wide index: both iterate
/// the catalog, and each rank fills in the parameters it holds.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/model_args.hpp"
#include "model/parameter.hpp"
#include "model/tensor_parallel.hpp"

namespace meshtrain {

/// Parameter metadata without tensors (value / grad / compute undefined).
struct CatalogEntry {
  Parameter meta;        ///< name, global shape, tp-local shape and placement, init, weight decay
  int64_t block = -1;    ///< transformer block index, −1 for the embedding and the head
};

class ParameterCatalog {
 public:
  /// The parameters of the whole model of `args` in model order — tok_embeddings, layers.0 …
  /// layers.{L−1}, norm, output (no output.weight when tied: the head reads the embedding's) —
  /// with the tensor-parallel placement of rank tp.rank of tp.size (tp.comm is not used).
  /// @throws std::invalid_argument as the Transformer constructor for a tp that does not fit.
  ParameterCatalog(const ModelArgs& args, const TensorParallel& tp);

  const std::vector<CatalogEntry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  /// Position of `name` in model order, −1 when the model has no such parameter.
  int64_t index_of(const std::string& name) const;
  /// The entry named `name`. @throws std::out_of_range when absent.
  const CatalogEntry& at(const std::string& name) const;

 private:
  std::vector<CatalogEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace meshtrain
