// `meshtrain data prepare --input PATH... --output FILE.h5
//                         [--vocab-size N | --tokenizer FILE | --hf-assets-path DIR]
//                         [--text-key K] [--skip-bad-lines] [--validation-fraction F]`
// Under mpirun / srun every rank tokenizes its share of the inputs' bytes and the store is
// written collectively (data/token_store_writer.hpp).
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "data/corpus_reader.hpp"
#include "data/sentencepiece_tokenizer.hpp"
#include "data/stats.hpp"
#include "data/token_store_writer.hpp"
#include "util/errors.hpp"

namespace po = boost::program_options;

namespace meshtrain::app {

namespace {

constexpr const char* kUsage =
    "usage: meshtrain data prepare --input PATH... --output FILE.h5 [--vocab-size N | --tokenizer FILE | "
    "--hf-assets-path DIR] [--text-key K] [--skip-bad-lines] [--validation-fraction F]";

// The tokenizer on every rank. Training a SentencePiece model needs the whole corpus: rank 0
// trains and broadcasts the model.
std::unique_ptr<Tokenizer> make_tokenizer(const po::variables_map& vm, const CorpusOptions& opt, MPI_Comm world) {
  std::unique_ptr<Tokenizer> tok;
  if (vm.count("hf-assets-path")) {
    run_on_every_rank(world, [&] { tok = load_hf_assets_tokenizer(vm["hf-assets-path"].as<std::string>()); });
    return tok;
  }
  if (vm.count("tokenizer")) {
    run_on_every_rank(world, [&] { tok = load_tokenizer(vm["tokenizer"].as<std::string>()); });
    return tok;
  }
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string model;
  run_on_every_rank(world, [&] {
    if (rank != 0) return;
    const auto docs = read_corpus(vm["input"].as<std::vector<std::string>>(), opt);
    model = SentencePieceTokenizer::train(docs, vm["vocab-size"].as<int64_t>())->model_bytes();
  });
  uint64_t n = model.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, world);
  model.resize(n);
  MPI_Bcast(model.data(), int(n), MPI_CHAR, 0, world);
  return SentencePieceTokenizer::from_model_bytes(model, "trained model");
}

int prepare(const po::variables_map& vm, int rank, MPI_Comm world) {
  const double frac = vm["validation-fraction"].as<double>();
  if (!(frac > 0 && frac < 1)) throw ConfigError("command line: --validation-fraction must be in (0, 1)");
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const auto inputs = vm["input"].as<std::vector<std::string>>();
  PrepareRequest req;
  req.options.text_key = vm["text-key"].as<std::string>();
  req.options.skip_bad_lines = vm.count("skip-bad-lines") > 0;
  run_on_every_rank(world, [&] { req.files = list_corpus(inputs); });
  const auto tok = make_tokenizer(vm, req.options, world);
  req.tokenizer = tok.get();
  req.validation_fraction = frac;
  for (const auto& i : inputs) req.source_description += (req.source_description.empty() ? "" : " ") + i;
  req.output = vm["output"].as<std::string>();
  const double t_tok = seconds();
  if (rank == 0)
    req.progress = [&](uint64_t done, uint64_t share) {
      std::printf("data prepare: rank 0 encoded %.1f MB (its share: %.1f MB on disk), %.2f MB/s per rank\n", done / 1e6,
                  share / 1e6, done / 1e6 / std::max(1e-9, seconds() - t_tok));
      std::fflush(stdout);
    };
  const TokenStoreSummary s = prepare_token_store(req, world);
  const double elapsed = seconds() - t_tok;
  int nranks = 1;
  MPI_Comm_size(world, &nranks);
  if (rank != 0) return kExitOk;
  const TokenStore store(req.output);  // read back: the file is checked exactly as training will read it
  const double h = unigram_entropy(store.split("validation"), store.vocab_size());
  std::printf("%s: %lld documents (%lld train, %lld validation), %lld + %lld tokens, vocabulary %lld (%s), "
              "validation unigram entropy %.4f nats",
              req.output.c_str(), (long long)(s.train_docs + s.validation_docs), (long long)s.train_docs,
              (long long)s.validation_docs, (long long)s.train_tokens, (long long)s.validation_tokens,
              (long long)s.vocab_size, tok->type().c_str(), h);
  if (s.skipped_lines) std::printf(", %lld bad lines skipped", (long long)s.skipped_lines);
  std::printf("\ndata prepare: %.1f MB in %.1f s on %d rank%s: %.2f MB/s (%.2f MB/s per rank), %.1f s in all\n",
              s.input_bytes / 1e6, elapsed, nranks, nranks == 1 ? "" : "s", s.input_bytes / 1e6 / elapsed,
              s.input_bytes / 1e6 / elapsed / nranks, seconds());
  return kExitOk;
}

}  // namespace

int cmd_data(int argc, char** argv) {
  if (argc < 1 || std::string(argv[0]) != "prepare") throw ConfigError(kUsage);
  po::options_description desc("meshtrain data prepare");
  desc.add_options()("input", po::value<std::vector<std::string>>()->multitoken()->required(),
                     "text files (each one document), JSON Lines files (.jsonl, .jsonl.gz, .json.gz: one document per "
                     "line) or directories of them")(
      "output", po::value<std::string>()->required(), "token store to write (.h5)")(
      "vocab-size", po::value<int64_t>(), "train a SentencePiece BPE tokenizer of this many pieces")(
      "tokenizer", po::value<std::string>(),
      "use this tokenizer: a Hugging Face tokenizer.json, a tiktoken rank file or a SentencePiece .model")(
      "hf-assets-path", po::value<std::string>(),
      "use the tokenizer of this Hugging Face model folder: tokenizer.json + tokenizer_config.json, else "
      "tokenizer.model (TorchTitan's [model] hf_assets_path)")(
      "text-key", po::value<std::string>()->default_value("text"), "the JSON Lines field that holds the text")(
      "skip-bad-lines", "skip and count bad JSON Lines instead of stopping at the first")(
      "validation-fraction", po::value<double>()->default_value(0.05), "fraction of documents held out for validation");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);  // argv[0] = "prepare" is skipped
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError("command line: meshtrain data prepare: " + std::string(e.what()));
  }
  if (vm.count("vocab-size") + vm.count("tokenizer") + vm.count("hf-assets-path") != 1)
    throw ConfigError("command line: meshtrain data prepare: give exactly one of --vocab-size N, --tokenizer FILE "
                      "or --hf-assets-path DIR");
  MpiRuntime mpi(nullptr, nullptr);
  try {
    return prepare(vm, mpi.world_rank(), MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    // Every rank holds the same message (run_on_every_rank): one rank says it.
    if (mpi.world_size() == 1) throw;
    if (mpi.world_rank() == 0) std::fprintf(stderr, "%s\n", e.what());
    return dynamic_cast<const DataError*>(&e) || dynamic_cast<const ConfigError*>(&e) ? kExitConfig : kExitRuntime;
  }
}

}  // namespace meshtrain::app
