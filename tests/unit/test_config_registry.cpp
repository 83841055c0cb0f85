// The option registry (every key bound to its own field, defaults, arrays), the TOML value
// rules, the generated deck reference and the published model flavors.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/deck_reference.hpp"
#include "config/option_registry.hpp"
#include "config/toml_value.hpp"
#include "config_test_util.hpp"

using namespace meshtrain;
using namespace config_test;

// ---- TOML values ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(toml_integers) {
  BOOST_TEST(*toml::parse_int("1_000") == 1000);
  BOOST_TEST(*toml::parse_int("+5") == 5);
  BOOST_TEST(*toml::parse_int("-1") == -1);
  BOOST_TEST(*toml::parse_int("0") == 0);
  BOOST_TEST(*toml::parse_int("9223372036854775807") == INT64_MAX);
  for (const char* bad : {"", "01", "1__0", "_1", "1_", "1.0", "1e3", "0x10", "9223372036854775808", "abc", " 1"})
    BOOST_TEST(!toml::parse_int(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(toml_floats) {
  BOOST_TEST(*toml::parse_float("3e-4") == 3e-4);
  BOOST_TEST(*toml::parse_float("1E+2") == 100.0);
  BOOST_TEST(*toml::parse_float("-0.5") == -0.5);
  BOOST_TEST(*toml::parse_float("1_000.5") == 1000.5);
  BOOST_TEST(*toml::parse_float("7") == 7.0);
  for (const char* bad : {"", ".5", "1.", "1e", "inf", "nan", "+inf", "1e400", "0x1p3", "1.0.0", "01.5", "abc"})
    BOOST_TEST(!toml::parse_float(bad).has_value(), bad);
  for (double v : {0.1, 8e-4, 1e-8, 1.0 / 3.0, 500000.0, 1e300, -2.5, 0.0}) {
    const std::string t = toml::format_float(v);
    BOOST_TEST(*toml::parse_float(t) == v, t);  // exact round trip, and always a TOML float
  }
  BOOST_TEST(toml::format_float(0.0008) == "0.0008");
  BOOST_TEST(toml::format_float(2.0) == "2.0");
}

BOOST_AUTO_TEST_CASE(toml_strings_and_comments) {
  BOOST_TEST(toml::parse_string("\"a\\tb\\\"c\\\\\"") == "a\tb\"c\\");
  BOOST_TEST(toml::parse_string("'C:\\x'") == "C:\\x");
  BOOST_TEST(toml::parse_string("\"\\U0001F600\"") == "\xF0\x9F\x98\x80");
  BOOST_CHECK_THROW(toml::parse_string("\"open"), std::invalid_argument);
  BOOST_CHECK_THROW(toml::parse_string("\"bad \\q\""), std::invalid_argument);
  BOOST_CHECK_THROW(toml::parse_string("\"\\uD800\""), std::invalid_argument);
  for (const std::string& s : std::vector<std::string>{"plain", "with \"quotes\" and \\ and #", "tab\tnewline\n", std::string("nul\x01", 4)}) {
    BOOST_TEST(toml::parse_string(toml::quote(s)) == s);
    BOOST_TEST(toml::quote(s, true).find('#') == std::string::npos);
    BOOST_TEST(toml::parse_string(toml::quote(s, true)) == s);
  }
  BOOST_TEST(toml::strip_comment("a = \"x # y\" # z") == "a = \"x # y\" ");
  BOOST_TEST(toml::strip_comment("a = 'x # y'") == "a = 'x # y'");
  BOOST_TEST(toml::strip_comment("a = \"q\\\"#\" # c") == "a = \"q\\\"#\" ");
}

BOOST_AUTO_TEST_CASE(toml_arrays) {
  BOOST_TEST((toml::split_array("[1, 2 ,3]") == std::vector<std::string>{"1", "2", "3"}));
  BOOST_TEST((toml::split_array("[\"a, b\", 'c]']") == std::vector<std::string>{"\"a, b\"", "'c]'"}));
  BOOST_TEST((toml::split_array("[1, 2,]") == std::vector<std::string>{"1", "2"}));
  BOOST_TEST(toml::split_array("[ ]").empty());
  for (const char* bad : {"[1, [2]]", "[1,,2]", "[1", "1]", "[\"open]", "[,]"})
    BOOST_CHECK_THROW(toml::split_array(bad), std::invalid_argument);
}

// ---- registry ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(registry_sections_and_defaults) {
  BOOST_TEST((option_sections() ==
              std::vector<std::string>{"job", "model", "optimizer", "lr_scheduler", "training", "training.dataloader",
                                       "parallelism", "activation_checkpoint", "compile", "quantize.linear.float8",
                                       "quantize.linear.mx", "quantize.grouped_mm.float8", "quantize.grouped_mm.mx",
                                       "metrics", "profiling", "validation", "validation.dataloader", "checkpoint",
                                       "topology", "comm", "memory_estimation", "fault_tolerance", "experimental",
                                       "debug"}));
  const JobConfig defaults;
  std::set<std::string> names;
  for (const Option& o : option_registry()) {
    BOOST_TEST_CONTEXT(o.dotted()) {
      BOOST_TEST(names.insert(o.dotted()).second);  // registered once
      BOOST_TEST(!o.doc.empty());
      BOOST_TEST(!o.allowed.empty());
      BOOST_TEST(find_option(o.dotted()) == &o);
      const std::string now = o.get(defaults);
      if (o.torchtitan_only) {  // no meshtrain field: unset until a deck sets it; shows TorchTitan's default
        BOOST_TEST(now.empty());
        BOOST_TEST((o.default_text == o.torchtitan_default ||
                    (o.default_text == "(unset)" && o.torchtitan_default == "None")));
        if (o.default_text != "(unset)" && o.torchtitan_default != "(not in v0.2.2)")
          BOOST_TEST(o.check(parse_option_value(o, o.default_text, ValueSyntax::kDeck)).empty());
      } else if (now.empty()) {  // an optional field, unset by default
        BOOST_TEST((o.default_text == (o.section == "model" ? "(flavor)" : "(unset)")));
      } else {
        BOOST_TEST(now == o.default_text);  // the reference shows the struct's real default
        BOOST_TEST(o.check(parse_option_value(o, now, ValueSyntax::kDeck)).empty());  // and it is in range
      }
    }
  }
  BOOST_TEST(names.count("model.rope_original_max_seq_len") == 1);
  BOOST_TEST(names.count("comm.train_timeout_seconds") == 1);
}

// Setting any one key changes exactly that key's line of the resolved deck: each setter writes
// the field its getter reads, and no two keys share a field.
BOOST_AUTO_TEST_CASE(every_key_is_bound_to_its_own_field) {
  const std::string base = resolved_deck_toml(JobConfig{});
  auto lines = [](const std::string& t) {
    std::vector<std::string> v;
    std::istringstream in(t);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  };
  const auto base_lines = lines(base);
  for (const Option& o : option_registry()) {
    if (o.choices.size() == 1 || o.torchtitan_only) continue;  // TorchTitan-only keys: torchtitan_keys_are_kept
    std::string value;
    if (o.type == OptionType::kBool) {
      value = o.get(JobConfig{}) == "true" ? "false" : "true";
    } else if (!o.choices.empty()) {
      value = o.choices.size() > 1 && toml::quote(o.choices[0]) == o.default_text ? o.choices[1] : o.choices[0];
    } else {
      for (const char* candidate : {"3", "7", "2", "0.5", "0", "x", "qwen3"}) {
        try {
          const std::string t = o.type == OptionType::kString ? toml::quote(candidate) : candidate;
          parse_option_value(o, t, ValueSyntax::kDeck);
          if (t != o.default_text) {
            value = candidate;
            break;
          }
        } catch (const OptionValueError&) {
        }
      }
    }
    BOOST_TEST_CONTEXT(o.dotted() << " = " << value) {
      JobConfig c;
      o.set(c, parse_option_value(o, value, ValueSyntax::kCommandLine));
      const auto changed = lines(resolved_deck_toml(c));
      BOOST_TEST_REQUIRE(changed.size() == base_lines.size());
      int diffs = 0;
      for (size_t i = 0; i < changed.size(); ++i)
        if (changed[i] != base_lines[i]) {
          ++diffs;
          BOOST_TEST(changed[i].rfind(o.key + " = ", 0) == 0, changed[i]);
        }
      BOOST_TEST(diffs == 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(array_options_parse_item_by_item) {
  Option o;  // no deck key is an array yet; the registry supports them for TorchTitan keys that are
  o.section = "test";
  o.key = "ints";
  o.type = OptionType::kInt;
  o.array = true;
  o.min = 1;
  o.allowed = ">= 1";
  BOOST_TEST(o.type_name() == "array of integer");
  const OptionValue v = parse_option_value(o, "[1, 2, 3]", ValueSyntax::kDeck);
  BOOST_TEST(v.items.size() == 3u);
  BOOST_TEST(v.items[2].i == 3);
  BOOST_TEST(parse_option_value(o, "4,5", ValueSyntax::kCommandLine).items[1].i == 5);
  BOOST_TEST(parse_option_value(o, "[]", ValueSyntax::kDeck).items.empty());
  auto message = [&](const std::string& raw) {
    try {
      parse_option_value(o, raw, ValueSyntax::kDeck);
    } catch (const OptionValueError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BOOST_TEST(message("[1, 0]") == "value [1, 0] is out of range (must be >= 1)");
  BOOST_TEST(message("[1, x]") == "expected integer, got x");
  BOOST_TEST(message("1") == "expected array of integer, got 1 (arrays are [a, b])");
  BOOST_TEST(has(message("[1, [2]]"), "nested array"));
  o.type = OptionType::kString;
  o.min.reset();
  BOOST_TEST(parse_option_value(o, "[\"a, b\", 'c']", ValueSyntax::kDeck).items[0].text == "a, b");
  BOOST_TEST(message("[a]") == "expected a quoted string, got a (TOML strings are \"...\")");
}

BOOST_AUTO_TEST_CASE(nearest_option_suggestions) {
  BOOST_TEST(nearest_option("optimizer.lrr") == "optimizer.lr");
  BOOST_TEST(nearest_option("training.lr") == "optimizer.lr");         // right key, wrong section
  BOOST_TEST(nearest_option("trainig.seq_len") == "training.seq_len");  // unknown section: nearest overall
  BOOST_TEST(nearest_option("parallelism.dp_shard") == "parallelism.data_parallel_shard_degree");  // abbreviation
  BOOST_TEST(nearest_option("parallelism.tp") == "parallelism.tensor_parallel_degree");
  BOOST_TEST(nearest_option("training.seqlen") == "training.seq_len");
  BOOST_TEST(nearest_section("optimiser") == "optimizer");
  BOOST_TEST(nearest_section("ckpt") == "checkpoint");
}

// ---- the generated reference ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(deck_reference_doc_is_current) {
  const std::filesystem::path doc = std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "doc" / "deck-reference.md";
  std::ifstream in(doc, std::ios::binary);
  std::ostringstream committed;
  committed << in.rdbuf();
  BOOST_TEST(committed.str() == deck_reference_markdown(),
             "doc/deck-reference.md is stale: regenerate it with `build/bin/meshtrain deck reference --markdown > "
             "doc/deck-reference.md`");
}

BOOST_AUTO_TEST_CASE(deck_reference_lists_every_key) {
  const std::string md = deck_reference_markdown(), text = deck_reference_text();
  BOOST_TEST(md.rfind("<!-- Generated by `meshtrain deck reference --markdown", 0) == 0);
  for (const Option& o : option_registry()) {
    BOOST_TEST(has(md, "| " + o.key + " | " + o.type_name() + " | "), o.dotted());
    BOOST_TEST(has(text, "  " + o.key + " "), o.dotted());
  }
  for (const std::string& s : option_sections()) {
    BOOST_TEST(has(md, "\n## [" + s + "]\n"));
    BOOST_TEST(has(text, "\n[" + s + "]\n"));
  }
  BOOST_TEST(has(md, "| beta1 | float | 0.9 | in [0, 1) |"));
  BOOST_TEST(has(md, "| decay_type | string | \"linear\" | linear \\| sqrt \\| cosine |"));
}

// ---- model flavors -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(published_flavor_shapes_and_parameter_counts) {
  auto params = [](const char* n, const char* f) { return double(model_flavor(n, f).num_params()); };
  auto near = [](double got, double want, double tol) { return std::fabs(got / want - 1) < tol; };
  BOOST_TEST(model_flavor("llama3", "8B").ffn_dim() == 14336);
  BOOST_TEST(model_flavor("llama3", "70B").ffn_dim() == 28672);
  BOOST_TEST(model_flavor("llama3", "405B").ffn_dim() == 53248);
  BOOST_TEST(model_flavor("llama3", "1B").ffn_dim() == 8192);
  BOOST_TEST(model_flavor("llama3", "3B").ffn_dim() == 8192);
  BOOST_TEST(model_flavor("llama3", "8B").head_dim == 128);
  // Published totals (Meta: 8.03 B, 70.6 B, 405.9 B; Qwen: 32.8 B, 0.6 B).
  BOOST_TEST(params("llama3", "8B") == 8030261248.0);
  BOOST_TEST(near(params("llama3", "70B"), 70.55e9, 1e-3));
  BOOST_TEST(near(params("llama3", "405B"), 405.85e9, 1e-3));
  BOOST_TEST(near(params("llama3", "1B"), 1.236e9, 1e-3));
  BOOST_TEST(near(params("llama3", "3B"), 3.213e9, 1e-3));
  BOOST_TEST(near(params("qwen3", "32B"), 32.76e9, 2e-3));
  BOOST_TEST(near(params("qwen3", "8B"), 8.19e9, 2e-3));
  BOOST_TEST(near(params("qwen3", "0.6B"), 0.596e9, 2e-3));
  BOOST_TEST(model_flavor("qwen3", "32B").head_dim == 128);  // explicit, not dim / n_heads = 80
  BOOST_TEST(model_flavor("qwen3", "32B").qk_norm);
  BOOST_CHECK_THROW(model_flavor("llama3", "7B"), std::out_of_range);
  BOOST_CHECK_THROW(model_flavor("gpt2", "8B"), std::out_of_range);
  BOOST_TEST((model_flavors("llama3") == std::vector<std::string>{"debugmodel", "1B", "3B", "8B", "70B", "405B"}));
  // FLOPs per token: 6·(N − N_emb) + 12·L·H·Dh·T.
  const ModelArgs m = model_flavor("llama3", "8B");
  BOOST_TEST(m.flops_per_token(8192) == 6.0 * (8030261248.0 - 525336576.0) + 12.0 * 32 * 32 * 128 * 8192);
}

BOOST_AUTO_TEST_CASE(model_overrides_apply_over_the_flavor) {
  const JobConfig c = load(kBase, {"--model.n_layers=2", "--model.n_heads=8", "--model.vocab_size=300"});
  const ModelArgs a = c.model_args();
  BOOST_TEST(a.n_layers == 2);
  BOOST_TEST(a.n_heads == 8);
  BOOST_TEST(a.n_kv_heads == 8);  // debugmodel has no GQA: kv follows n_heads
  BOOST_TEST(a.head_dim == 32);   // llama3: dim / n_heads
  BOOST_TEST(a.vocab_size == 300);
  const ModelArgs q = load(kBase, {"--model.name=qwen3", "--model.flavor=8B", "--model.dim=2048"}).model_args();
  BOOST_TEST(q.head_dim == 128);  // qwen3 keeps its explicit head_dim
  BOOST_TEST(q.dim == 2048);
  BOOST_TEST(q.n_kv_heads == 8);
}
