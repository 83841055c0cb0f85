// Writes a model dump with gradients for validation/check_gradients.py: builds a small model of
// the requested shape, initializes it as training does, runs one forward + backward on random
// tokens, and writes /params, /grads, /batch/tokens and the loss (checkpoint/model_dump.hpp).
// With --checkpoint CKPT.h5 the model's shape comes from the checkpoint's /meta/model_args and its
// weights from /model: meshtrain's loss on a batch at a saved step, for validation/check_export.py.
// Mixture of Experts: --moe (softmax top-2 of 8, renormalized, a shared expert, a random
// selection bias), --moe-sigmoid (sigmoid top-3 of 6, route_scale 2.5, balance loss and z-loss,
// block 0 dense), --moe-balance (--moe routed round-robin, moe_force_load_balance).
// --block-causal: document masking (attn_mask_type = "block_causal") with EOS id 3 planted so
// that the samples hold documents of 1 to 13 tokens, one of them ending at the last input;
// the dump's attribute doc_mask_eos_id tells check_gradients.py to build the explicit mask.
// usage: dump_grads OUT.h5 [--gqa] [--tie] [--qk-norm] [--rope-scaling] [--ac full|selective]
//        [--moe | --moe-sigmoid | --moe-balance] [--block-causal]
//        dump_grads OUT.h5 --checkpoint CKPT.h5
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/h5_util.hpp"
#include "checkpoint/model_args_h5.hpp"
#include "checkpoint/model_dump.hpp"
#include "graph/executor.hpp"
#include "model/layers/moe.hpp"
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
  bool force_balance = false;
  int32_t doc_eos = -1;  // --block-causal: the EOS id
  const auto moe = [&](int64_t experts, int64_t top_k) {
    a.num_experts = experts;
    a.top_k = top_k;
    a.moe_inter_dim = 48;
  };
  for (int i = 2; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--gqa") a.n_kv_heads = 2;
    else if (f == "--tie") a.tie_word_embeddings = true;
    else if (f == "--qk-norm") a.qk_norm = true, a.norm_eps = 1e-6;
    else if (f == "--rope-scaling") a.use_rope_scaling = true, a.rope_original_max_seq_len = 16, a.rope_scaling_factor = 4;
    else if (f == "--ac" && i + 1 < argc) ac = argv[++i];
    else if (f == "--checkpoint" && i + 1 < argc) checkpoint = argv[++i];
    else if (f == "--block-causal") doc_eos = 3;
    else if (f == "--moe" || f == "--moe-balance") {
      moe(8, 2);
      a.route_norm = true;
      a.num_shared_experts = 1;
      force_balance = f == "--moe-balance";
    } else if (f == "--moe-sigmoid") {
      moe(6, 3);
      a.score_func = "sigmoid";
      a.route_scale = 2.5;
      a.aux_loss_coeff = 0.01;
      a.z_loss_coeff = 0.001;
      a.n_dense_layers = 1;
    }
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
  model.set_moe_force_load_balance(force_balance);
  for (MoE* m : model.moe_layers()) {
    std::vector<float> bias(size_t(m->num_experts()));
    if (!checkpoint.empty()) {  // the checkpoint's selection biases
      h5::Handle f{H5Fopen(checkpoint.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
      const std::string name = "/model/" + m->name() + ".expert_bias";
      h5::Handle ds{f.id < 0 ? -1 : H5Dopen2(f.id, name.c_str(), H5P_DEFAULT), H5Dclose};
      if (ds.id < 0 || H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, bias.data()) < 0) {
        std::fprintf(stderr, "dump_grads: %s has no %s\n", checkpoint.c_str(), name.c_str());
        return 2;
      }
    } else {  // a bias that changes the choice of some tokens
      for (size_t e = 0; e < bias.size(); ++e)
        bias[e] = 0.05f * float(counter_u64(11, uint64_t(m->layer_id()), e) % 7) - 0.15f;
    }
    m->set_expert_bias(bias);
  }
  const int64_t b = 3, t = 24;
  std::vector<int32_t> tokens(size_t(b * (t + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(counter_u64(7, 1, i) % uint64_t(a.vocab_size));
  if (doc_eos >= 0) {
    // The random tokens hold id 3 by chance too; these add ends at input positions 0 (a
    // one-token document), 5, 6, 19 and t − 1 (the last input), and in sample 2 none besides.
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == doc_eos) tokens[i] = doc_eos + 1;
    for (int64_t p : {0, 5, 6, 19, 23}) tokens[size_t(p)] = doc_eos;
    for (int64_t p : {10, 11}) tokens[size_t((t + 1) + p)] = doc_eos;
    model.set_document_mask_eos(doc_eos);
  }
  StepContext ctx = model.make_context(tokens.data(), b, t, 1.0f / float(b * t), true);
  Executor exec(model.units(), model.block_index(), CheckpointPolicy::from_deck(ac, "2"));
  exec.forward_backward(ctx);
  DumpOptions opt;
  opt.grads = true;
  opt.tokens = &tokens;
  opt.batch = b;
  opt.seq_len = t;
  opt.loss = ctx.loss_sum / double(b * t);
  for (MoE* m : model.moe_layers()) opt.loss += m->step_stats().aux_loss + m->step_stats().z_loss;
  opt.moe_force_load_balance = force_balance;
  write_model_dump(argv[1], model, *dev, opt);
  if (doc_eos >= 0) {
    h5::Handle f{H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
    h5::write_attr(f.id, "doc_mask_eos_id", int64_t(doc_eos), argv[1]);
  }
  std::printf("loss %.8f written to %s\n", opt.loss, argv[1]);
  return 0;
}
