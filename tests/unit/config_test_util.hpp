#pragma once
// Helpers of the config tests: decks in temporary files, and the one-line error a deck produces.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/deck_parser.hpp"
#include "util/errors.hpp"

namespace config_test {

// Lines 1-12; tests append sections from line 13 on.
inline const char* kBase = R"([job]
description = "test"   # trailing comment
[model]
name = "llama3"
flavor = "debugmodel"
[training]
local_batch_size = 2
seq_len = 64
steps = 10
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
)";

// Writes `text` to a fresh file named deck<N><ext> under the temp folder (removed when the test
// process ends); other extensions hold the files a deck names (a schedule CSV).
inline std::string write_deck(const std::string& text, const std::string& ext = ".toml") {
  static int n = 0;
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("meshtrain_config_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(
          std::filesystem::temp_directory_path() / ("meshtrain_config_test_" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  const auto p = dir / ("deck" + std::to_string(n++) + ext);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

inline meshtrain::JobConfig load(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return meshtrain::load_job_config(write_deck(text), overrides);
}

// The ConfigError message of loading `text` with `overrides` and validating for `world` ranks
// ("" when it passes). Every message must be a single line.
inline std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}, int64_t world = 1) {
  try {
    load(text, overrides).validate(world);
  } catch (const meshtrain::ConfigError& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find('\n') == std::string::npos, "multi-line message: " << msg);
    return msg;
  }
  return "";
}

inline bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace config_test
