#include "train/stage_parts.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace meshtrain {

ModelPart model_part_of(const std::vector<StageLayers>& split, const std::vector<int>& stages) {
  ModelPart part;
  part.embedding = part.head = false;
  std::vector<int> sorted = stages;
  std::sort(sorted.begin(), sorted.end());
  for (int s : sorted) {
    if (s < 0 || size_t(s) >= split.size())
      throw std::invalid_argument("model_part_of: stage " + std::to_string(s) + " of " + std::to_string(split.size()));
    const StageLayers& st = split[size_t(s)];
    part.embedding |= st.embedding;
    part.head |= st.head;
    for (int64_t i = 0; i < st.num_layers; ++i) part.layers.push_back(st.first_layer + i);
  }
  return part;
}

std::pair<size_t, size_t> stage_unit_range(const Transformer& model, const StageLayers& stage) {
  const std::vector<int64_t> blocks = model.block_index();
  const bool emb = model.part().embedding, head = model.part().head;
  size_t first = SIZE_MAX, last = 0;
  for (size_t u = 0; u < blocks.size(); ++u) {
    const bool is_emb = emb && u == 0, is_head = head && u + 1 == blocks.size();
    const bool mine = (is_emb && stage.embedding) || (is_head && stage.head) ||
                      (!is_emb && !is_head && blocks[u] >= stage.first_layer &&
                       blocks[u] < stage.first_layer + stage.num_layers);
    if (!mine) continue;
    first = std::min(first, u);
    last = u + 1;
  }
  const size_t expected = size_t(stage.num_layers) + (stage.embedding ? 1 : 0) + (stage.head ? 1 : 0);
  if (first == SIZE_MAX || last - first != expected)
    throw std::invalid_argument("stage_unit_range: the model part does not hold stage " + describe(stage));
  return {first, last};
}

void sum_tied_embedding_grads(Device& dev, const Transformer& model, const std::vector<LocalShard>& shards,
                              Communicator& pp, int first_rank, int last_rank) {
  if (!model.args().tie_word_embeddings || first_rank == last_rank) return;
  const int me = pp.rank();
  if (me != first_rank && me != last_rank) return;
  const int peer = me == first_rank ? last_rank : first_rank;
  for (const LocalShard& ls : shards) {
    if (ls.param->name != "tok_embeddings.weight" || ls.grad.numel() == 0) continue;
    Tensor theirs = dev.empty(ls.grad.shape(), ls.grad.dtype(), MemCategory::kCommunication);
    // One batch: on NCCL, a receive and a send posted as two calls are two groups run in order
    // on one stream, so both ranks would wait in their receive forever (stream_order.hpp).
    auto works = pp.send_recv_batch({{false, theirs, peer, 0}, {true, ls.grad, peer, 0}});
    for (auto& w : works) w->wait();
    dev.add(ls.grad, theirs, 1.0f);
  }
}

}  // namespace meshtrain
