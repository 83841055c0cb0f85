// meshtrain: entry point; dispatches to one subcommand (commands.hpp).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "app/commands.hpp"
#include "util/errors.hpp"

namespace {

void usage(FILE* out) {
  std::fputs(
      "usage: meshtrain <command> [options]\n"
      "  train --deck FILE [--section.key=value ...]   train a model (launch with mpirun / srun)\n"
      "  data prepare --input PATH... --output FILE.h5 [--vocab-size N | --tokenizer FILE | --hf-assets-path DIR]\n"
      "       [--text-key K] [--skip-bad-lines]       tokenize text / JSON Lines into a token store (mpirun: parallel)\n"
      "  deck reference [--markdown]                   every deck key, type, default and meaning\n"
      "  deck check --deck FILE --world-size N         validate a deck for N ranks without running\n"
      "  model info --name NAME --flavor FLAVOR        parameter count and FLOPs per token\n"
      "  layout --deck FILE --world-size N [--topology FILE] [--csv FILE]   rank layout report\n"
      "  pp schedule --schedule NAME --pp N --microbatches M [--stages-per-rank V]\n"
      "                                                pipeline schedule timeline, bubble and in-flight peak\n"
      "  plan --deck FILE --gpus N [--hardware NAME|FILE] [--top K] [--fixed KEYS] [--write-deck OUT]\n"
      "       [--json OUT] [--plot OUT.png]             every valid layout's predicted memory and speed\n"
      "  ckpt inspect FILE                             a checkpoint's datasets, train state and checksums\n"
      "  ckpt export --format safetensors --output DIR [--hf-assets-path DIR] [--dtype D] FILE\n"
      "                                                Hugging Face model folder (model.safetensors, config.json)\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace meshtrain;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitConfig : kExitOk;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "train") return app::cmd_train(argc - 2, argv + 2);
    if (cmd == "data") return app::cmd_data(argc - 2, argv + 2);
    if (cmd == "deck") return app::cmd_deck(argc - 2, argv + 2);
    if (cmd == "model") return app::cmd_model(argc - 2, argv + 2);
    if (cmd == "layout") return app::cmd_layout(argc - 2, argv + 2);
    if (cmd == "ckpt") return app::cmd_ckpt(argc - 2, argv + 2);
    if (cmd == "pp") return app::cmd_pp(argc - 2, argv + 2);
    if (cmd == "plan") return app::cmd_plan(argc - 2, argv + 2);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitConfig;
  } catch (const DataError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitConfig;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain %s: error: %s\n", cmd.c_str(), e.what());
    return kExitRuntime;
  }
  std::fprintf(stderr, "meshtrain: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return kExitConfig;
}
