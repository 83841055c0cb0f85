#include "model/parameter_catalog.hpp"

#include <stdexcept>

#include "model/layers/embedding.hpp"
#include "model/layers/transformer_block.hpp"

namespace meshtrain {

ParameterCatalog::ParameterCatalog(const ModelArgs& args, const TensorParallel& tp) {
  // The layers' constructors are the one source of names, shapes, placements and init rules;
  // building them allocates no tensors (a 126-block catalog costs microseconds).
  auto add = [&](Layer& layer, int64_t block) {
    for (Parameter* p : layer.parameters()) {
      CatalogEntry e;
      e.meta = *p;
      e.meta.sharding.tp_size = tp.size;
      e.block = block;
      index_.emplace(e.meta.name, entries_.size());
      entries_.push_back(std::move(e));
    }
  };
  Embedding emb(args, tp);
  add(emb, -1);
  for (int64_t i = 0; i < args.n_layers; ++i) {
    TransformerBlock b(args, int(i), tp);
    add(b, i);
  }
  OutputHead head(args, &emb.weight, tp);
  add(head, -1);
}

int64_t ParameterCatalog::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? -1 : int64_t(it->second);
}

const CatalogEntry& ParameterCatalog::at(const std::string& name) const {
  const int64_t i = index_of(name);
  if (i < 0) throw std::out_of_range("parameter catalog: no parameter " + name);
  return entries_[size_t(i)];
}

}  // namespace meshtrain
