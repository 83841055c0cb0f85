// Unit tests of the Hugging Face export helpers: parameter names and the RoPE row permutation.
#define BOOST_TEST_MODULE safetensors_export
#include <boost/test/unit_test.hpp>

#include <stdexcept>
#include <vector>

#include "checkpoint/safetensors_export.hpp"
#include "util/errors.hpp"

using namespace meshtrain;

BOOST_AUTO_TEST_CASE(names_follow_transformers_llama_and_qwen3) {
  BOOST_TEST(hf_parameter_name("tok_embeddings.weight") == "model.embed_tokens.weight");
  BOOST_TEST(hf_parameter_name("output.weight") == "lm_head.weight");
  BOOST_TEST(hf_parameter_name("norm.weight") == "model.norm.weight");
  BOOST_TEST(hf_parameter_name("layers.12.attention.wq.weight") == "model.layers.12.self_attn.q_proj.weight");
  BOOST_TEST(hf_parameter_name("layers.0.attention.k_norm.weight") == "model.layers.0.self_attn.k_norm.weight");
  BOOST_TEST(hf_parameter_name("layers.3.feed_forward.w1.weight") == "model.layers.3.mlp.gate_proj.weight");
  BOOST_TEST(hf_parameter_name("layers.3.feed_forward.w2.weight") == "model.layers.3.mlp.down_proj.weight");
  BOOST_TEST(hf_parameter_name("layers.3.feed_forward.w3.weight") == "model.layers.3.mlp.up_proj.weight");
  BOOST_TEST(hf_parameter_name("layers.1.ffn_norm.weight") == "model.layers.1.post_attention_layernorm.weight");
  BOOST_CHECK_THROW(hf_parameter_name("layers.x.attention.wq.weight"), CheckpointError);
  BOOST_CHECK_THROW(hf_parameter_name("layers.1.attention.wz.weight"), CheckpointError);
  BOOST_CHECK_THROW(hf_parameter_name("experts.0.w1.weight"), CheckpointError);
}

// Two heads of head_dim 4, one column: rows hold their own index. Within a head, Meta's pairs
// (0,1), (2,3) become HF's (0,2), (1,3): new order 0 2 1 3.
BOOST_AUTO_TEST_CASE(rope_rows_go_from_interleaved_to_rotate_half) {
  const std::vector<float> src = {0, 1, 2, 3, 4, 5, 6, 7};
  BOOST_TEST(permute_rope_rows(src, 8, 1, 4) == (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}), boost::test_tools::per_element());
  // Whole rows move: two columns.
  const std::vector<float> wide = {0, 0, 1, 1, 2, 2, 3, 3};
  BOOST_TEST(permute_rope_rows(wide, 4, 2, 4) == (std::vector<float>{0, 0, 2, 2, 1, 1, 3, 3}), boost::test_tools::per_element());
  BOOST_CHECK_THROW(permute_rope_rows(src, 8, 1, 3), std::invalid_argument);
  BOOST_CHECK_THROW(permute_rope_rows(src, 6, 1, 4), std::invalid_argument);
}
