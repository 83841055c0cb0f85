// Writes a model dump with gradients for validation/check_gradients.py: builds a small model of
// the requested shape, initializes it as training does, runs one forward + backward on random
// tokens, and writes /params, /grads, /batch/tokens and the loss (checkpoint/model_dump.hpp).
// With --checkpoint CKPT.h5 the model's shape comes from the checkpoint's /meta/model_args and its
// weights from /model: meshtrain's loss on a batch at a saved step, for validation/check_export.py.
// usage: dump_grads OUT.h5 [--gqa] [--tie] [--qk-norm] [--rope-scaling] [--ac full|selective]
//        dump_grads OUT.h5 --checkpoint CKPT.h5
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/h5_util.hpp"
#include "checkpoint/model_args_h5.hpp"
#include "checkpoint/model_dump.hpp"
#include "graph/executor.hpp"
#include "model/transformer.hpp"
#include "tiny_model.hpp"
#include "util/rng.hpp"

using namespace meshtrain;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dump_grads OUT.h5 [--gqa] [--tie] [--qk-norm] [--rope-scaling] [--ac MODE]\n");
    return 2;
  }
  ModelArgs a = testing::tiny_model_args(64, 2, 4, 4, 97);
  a.multiple_of = 32;
  a.rope_theta = 10000.0;
  std::string ac = "none", checkpoint;
  for (int i = 2; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--gqa") a.n_kv_heads = 2;
    else if (f == "--tie") a.tie_word_embeddings = true;
    else if (f == "--qk-norm") a.qk_norm = true, a.norm_eps = 1e-6;
    else if (f == "--rope-scaling") a.use_rope_scaling = true, a.rope_original_max_seq_len = 16, a.rope_scaling_factor = 4;
    else if (f == "--ac" && i + 1 < argc) ac = argv[++i];
    else if (f == "--checkpoint" && i + 1 < argc) checkpoint = argv[++i];
    else {
      std::fprintf(stderr, "dump_grads: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  auto dev = make_device("cpu", 1);
  if (!checkpoint.empty()) {
    h5::Handle f{H5Fopen(checkpoint.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
    h5::Handle g{f.id < 0 ? -1 : H5Gopen2(f.id, "/meta/model_args", H5P_DEFAULT), H5Gclose};
    if (g.id < 0) {
      std::fprintf(stderr, "dump_grads: %s has no /meta/model_args\n", checkpoint.c_str());
      return 2;
    }
    a = read_model_args(g.id, checkpoint);
  }
  Transformer model(a, *dev);
  model.init_weights(1234);
  if (!checkpoint.empty()) read_model_dump(checkpoint, model, *dev, "/model");
  const int64_t b = 3, t = 24;
  std::vector<int32_t> tokens(size_t(b * (t + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(counter_u64(7, 1, i) % uint64_t(a.vocab_size));
  StepContext ctx = model.make_context(tokens.data(), b, t, 1.0f / float(b * t), true);
  Executor exec(model.units(), model.block_index(), CheckpointPolicy::from_deck(ac, "2"));
  exec.forward_backward(ctx);
  DumpOptions opt;
  opt.grads = true;
  opt.tokens = &tokens;
  opt.batch = b;
  opt.seq_len = t;
  opt.loss = ctx.loss_sum / double(b * t);
  write_model_dump(argv[1], model, *dev, opt);
  std::printf("loss %.8f written to %s\n", opt.loss, argv[1]);
  return 0;
}
