#include "parallel/tp_gather.hpp"

namespace meshtrain {

std::vector<float> gather_tp_parameter(Device& dev, Communicator& tp, const Parameter& p) {
  std::vector<float> global(size_t(shape_numel(p.shape)));
  if (p.sharding.tp_dim < 0 || tp.size() == 1) {
    dev.download(global.data(), p.value, p.value.nbytes());
    return global;
  }
  // Every rank sends the largest slab's element count (the last slabs may be narrower).
  const size_t d = size_t(p.sharding.tp_dim);
  const int64_t slab = shape_numel(p.shape) / p.shape[d] * chunk_range(p.shape[d], tp.size(), 0).second;
  Tensor send = dev.zeros({slab}, DType::kF32, MemCategory::kCommunication);
  dev.copy(send.view({p.value.numel()}), p.value.reshape({p.value.numel()}));
  Tensor all = dev.empty({slab * tp.size()}, DType::kF32, MemCategory::kCommunication);
  tp.all_gather(send, all)->wait();
  std::vector<float> host(size_t(all.numel()));
  dev.download(host.data(), all, all.nbytes());
  Parameter slab_of = p;  // rank r's placement: the same parameter with r's slab
  for (int64_t r = 0; r < tp.size(); ++r) {
    const auto [first, count] = chunk_range(p.shape[d], tp.size(), r);
    slab_of.sharding.tp_first = first;
    slab_of.local_shape[d] = count;
    const int64_t n = shape_numel(slab_of.local_shape);
    for (int64_t i = 0; i < n; ++i) global[size_t(global_flat_index(slab_of, i))] = host[size_t(r * slab + i)];
  }
  return global;
}

}  // namespace meshtrain
