#pragma once
/// @file From a pipeline split (parallel/pipeline/stage_split.hpp) to what one rank builds: the
/// model part holding its stages, each stage's range of the part's units (one executor each),
/// and the sum of the tied embedding's gradient between the first and the last stage
/// (Megatron-LM's embedding group; TorchTitan refuses tied embeddings under pp).
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "model/transformer.hpp"
#include "parallel/grad_sync.hpp"
#include "parallel/pipeline/stage_split.hpp"

namespace meshtrain {

/// The union of `stages` (indices into `split`): their blocks, the embedding when stage 0 is
/// among them, the head when the last stage is. @throws std::invalid_argument for an index
/// outside the split.
ModelPart model_part_of(const std::vector<StageLayers>& split, const std::vector<int>& stages);

/// Units [first, last) of `model` (Transformer::units() order) that make up `stage`, which the
/// model's part must hold. @throws std::invalid_argument when it does not.
std::pair<size_t, size_t> stage_unit_range(const Transformer& model, const StageLayers& stage);

/// Sums the gradient of the tied tok_embeddings.weight between the rank holding stage 0 and
/// the rank holding the last stage of the same pipeline (`pp`: the device pp communicator;
/// ranks first_rank and last_rank of it), so both apply the same update. Each sends its local
/// shard's gradient (`shards`: the strategy's local shards; the two ranks share dp and tp
/// coordinates, so their shards cover the same rows) and adds what it receives: a + b on one
/// side, b + a on the other, equal bits. The receive and the send are posted as one batch
/// (Communicator::send_recv_batch), which a stream-ordered backend needs: the exchange passes
/// check_stream_programs (tested with StreamRecorder). No-op for an untied model, on other
/// ranks, or when both stages are on one rank (V placement). Collective over the two ranks.
/// @throws CommError.
void sum_tied_embedding_grads(Device& dev, const Transformer& model, const std::vector<LocalShard>& shards,
                              Communicator& pp, int first_rank, int last_rank);

}  // namespace meshtrain
