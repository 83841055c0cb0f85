#include "train/initial_load.hpp"

#include <filesystem>

#include "checkpoint/checkpoint_folder.hpp"
#include "checkpoint/hf_import.hpp"
#include "checkpoint/safetensors_reader.hpp"
#include "train/moe_balance.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

// The meshtrain checkpoint file `path` names: the file itself, or a checkpoint folder's latest.
std::string checkpoint_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  if (!fs::is_directory(path, ec))
    throw CheckpointError(path + ": [checkpoint] initial_load_path names no file or folder");
  if (fs::exists(fs::path(path) / "config.json", ec))
    throw CheckpointError(path + ": a Hugging Face model folder (config.json); set [checkpoint] initial_load_in_hf = true "
                                 "to load it");
  const std::optional<std::string> f = checkpoint_to_load(path, -1);
  if (!f) throw CheckpointError(path + ": [checkpoint] initial_load_path is a folder with no checkpoint (no `latest`)");
  return *f;
}

}  // namespace

std::optional<InitialLoad> load_initial_checkpoint(const JobConfig& cfg, MPI_Comm world, Device& dev, Transformer& model,
                                                   const std::vector<LocalShard>& shards, Optimizer& opt) {
  const CheckpointSection& c = cfg.checkpoint;
  InitialLoad out;
  out.path = c.initial_load_path.empty() && c.initial_load_in_hf ? cfg.model.hf_assets_path : c.initial_load_path;
  if (out.path.empty()) return std::nullopt;
  const ModelArgs& args = model.args();
  if (c.initial_load_in_hf) {
    out.format = "huggingface";
    std::string error;
    HfLoadSummary s;
    try {
      if (!std::filesystem::is_directory(out.path))
        throw CheckpointError(out.path + ": initial_load_in_hf needs a Hugging Face model folder (config.json and "
                                         "model.safetensors or its index)");
      check_hf_config(out.path, args);
      const SafetensorsFolder st(out.path);
      s = load_hf_weights(st, args, dev, model, shards);
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree_on_outcome(world, out.path, error);
    int64_t bytes = int64_t(s.bytes);
    MPI_Allreduce(&bytes, &out.bytes, 1, MPI_INT64_T, MPI_SUM, world);
    out.tensors = s.tensors;
    return out;
  }
  out.format = "meshtrain";
  std::string file, error;
  try {
    file = checkpoint_file(out.path);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_outcome(world, out.path, error);
  out.path = file;
  out.full_state = !c.initial_load_model_only;
  out.state = load_checkpoint(file, world, dev, model, shards, opt, /*model_only=*/!out.full_state);
  restore_expert_biases(args, model.moe_layers(), out.state.expert_bias);
  model.params_changed();
  out.bytes = int64_t(std::filesystem::file_size(file));
  return out;
}

}  // namespace meshtrain
