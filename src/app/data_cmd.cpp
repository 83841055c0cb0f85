// `meshtrain data prepare --input PATH... --output FILE.h5
//                         [--vocab-size N | --tokenizer FILE.model | --hf-assets-path DIR]
//                         [--validation-fraction F]`
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "data/corpus_reader.hpp"
#include "data/stats.hpp"
#include "data/token_store_writer.hpp"
#include "util/errors.hpp"

namespace po = boost::program_options;

namespace meshtrain::app {

namespace {

constexpr const char* kUsage =
    "usage: meshtrain data prepare --input PATH... --output FILE.h5 [--vocab-size N | --tokenizer FILE.model | "
    "--hf-assets-path DIR]";

// The SentencePiece model of a Hugging Face assets folder (TorchTitan's [model] hf_assets_path).
std::string assets_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError("command line: --hf-assets-path " + dir + ": not a folder");
  const fs::path model = fs::path(dir) / "tokenizer.model";
  if (fs::is_regular_file(model, ec)) return model.string();
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec))
    throw ConfigError("command line: --hf-assets-path " + dir +
                      ": the folder has tokenizer.json but no tokenizer.model; reading a Hugging Face tokenizer.json "
                      "is not implemented yet (data prepare reads SentencePiece models; --vocab-size N trains one)");
  throw ConfigError("command line: --hf-assets-path " + dir + ": no tokenizer.model (SentencePiece) in the folder");
}

}  // namespace

int cmd_data(int argc, char** argv) {
  if (argc < 1 || std::string(argv[0]) != "prepare") throw ConfigError(kUsage);
  po::options_description desc("meshtrain data prepare");
  desc.add_options()("input", po::value<std::vector<std::string>>()->multitoken()->required(),
                     "text files or directories (each file is one document)")(
      "output", po::value<std::string>()->required(), "token store to write (.h5)")(
      "vocab-size", po::value<int64_t>(), "train a SentencePiece BPE tokenizer of this many pieces")(
      "tokenizer", po::value<std::string>(), "use this SentencePiece .model instead of training one")(
      "hf-assets-path", po::value<std::string>(),
      "use the tokenizer.model (SentencePiece) of this Hugging Face assets folder (TorchTitan's [model] "
      "hf_assets_path)")(
      "validation-fraction", po::value<double>()->default_value(0.05), "fraction of documents held out for validation");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);  // argv[0] = "prepare" is skipped
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError("command line: meshtrain data prepare: " + std::string(e.what()));
  }
  if (vm.count("vocab-size") + vm.count("tokenizer") + vm.count("hf-assets-path") != 1)
    throw ConfigError("command line: meshtrain data prepare: give exactly one of --vocab-size N, --tokenizer FILE.model "
                      "or --hf-assets-path DIR");
  const std::string tokenizer_file = vm.count("hf-assets-path") ? assets_tokenizer(vm["hf-assets-path"].as<std::string>())
                                     : vm.count("tokenizer")     ? vm["tokenizer"].as<std::string>()
                                                                 : "";
  const double frac = vm["validation-fraction"].as<double>();
  if (!(frac > 0 && frac < 1)) throw ConfigError("command line: --validation-fraction must be in (0, 1)");
  const auto t0 = std::chrono::steady_clock::now();
  const auto inputs = vm["input"].as<std::vector<std::string>>();
  const auto docs = read_corpus(inputs);
  const Tokenizer tok = !tokenizer_file.empty() ? Tokenizer::from_file(tokenizer_file)
                                                : Tokenizer::train(docs, vm["vocab-size"].as<int64_t>());
  std::string source;
  for (const auto& i : inputs) source += (source.empty() ? "" : " ") + i;
  const std::string out = vm["output"].as<std::string>();
  const TokenStoreSummary s = write_token_store(out, docs, tok, frac, source);
  const TokenStore store(out);  // read back: the file is checked exactly as training will read it
  const double h = unigram_entropy(store.split("validation"), store.vocab_size());
  std::printf("%s: %zu documents (%lld train, %lld validation), %lld + %lld tokens, vocabulary %lld, "
              "validation unigram entropy %.4f nats, %.1f s\n",
              out.c_str(), docs.size(), (long long)s.train_docs, (long long)s.validation_docs, (long long)s.train_tokens,
              (long long)s.validation_tokens, (long long)s.vocab_size, h,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitOk;
}

}  // namespace meshtrain::app
