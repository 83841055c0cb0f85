// `meshtrain ckpt inspect FILE`: the tree, shapes, dtypes, train state, writer layout and checksum
// verdict of a sharded checkpoint. `meshtrain ckpt export --format safetensors --output DIR
// [--hf-assets-path DIR] [--dtype float32|bfloat16|float16] FILE`: a Hugging Face model folder (doc/checkpoint-format.md), with the
// tokenizer files of the run's [model] hf_assets_path. Serial; no MPI launch needed.
#include <cstdio>
#include <filesystem>
#include <string>

#include "app/commands.hpp"
#include "checkpoint/inspect.hpp"
#include "checkpoint/safetensors_export.hpp"
#include "config/deck_parser.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

namespace {

constexpr const char* kUsage =
    "usage: meshtrain ckpt inspect FILE\n"
    "       meshtrain ckpt export --format safetensors --output DIR [--hf-assets-path DIR] [--dtype float32|bfloat16|float16] FILE";

// The folder whose tokenizer files the export copies: --hf-assets-path, else the [model]
// hf_assets_path of the deck the checkpoint was written with. A folder named by the deck that is
// not here (a run on another machine) only costs the copy, and the user is told so; "" = none.
std::string assets_folder(const std::string& given, const std::string& checkpoint) {
  std::error_code ec;
  if (!given.empty()) {
    if (!std::filesystem::is_directory(given, ec))
      throw ConfigError("command line: --hf-assets-path " + given + ": not a folder");
    return given;
  }
  std::string dir;
  try {
    dir = load_job_config_text(checkpoint_deck(checkpoint), checkpoint + " (/meta deck)").model.hf_assets_path;
  } catch (const ConfigError& e) {
    std::printf("tokenizer files not copied: the checkpoint's deck does not load here (%s); pass --hf-assets-path DIR\n",
                e.what());
    return "";
  }
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) {
    std::printf("tokenizer files not copied: [model] hf_assets_path \"%s\" of the checkpoint's deck is not a folder "
                "here; pass --hf-assets-path DIR\n",
                dir.c_str());
    return "";
  }
  return dir;
}

int export_cmd(int argc, char** argv) {
  std::string format, output, file, assets, dtype = "float32";
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--format" || a == "--output" || a == "--hf-assets-path" || a == "--dtype") && i + 1 < argc) {
      (a == "--format" ? format : a == "--output" ? output : a == "--dtype" ? dtype : assets) = argv[++i];
    } else if (a.rfind("--", 0) != 0 && file.empty()) {
      file = a;
    } else {
      std::fprintf(stderr, "error: ckpt export: unexpected argument '%s'\n%s\n", a.c_str(), kUsage);
      return kExitConfig;
    }
  }
  if (format.empty() || output.empty() || file.empty()) {
    std::fprintf(stderr, "error: ckpt export needs --format, --output and a checkpoint file\n%s\n", kUsage);
    return kExitConfig;
  }
  if (format != "safetensors") {
    std::fprintf(stderr, "error: ckpt export --format %s: not implemented yet (formats: safetensors)\n", format.c_str());
    return kExitConfig;
  }
  if (dtype != "float32" && dtype != "bfloat16" && dtype != "float16") {
    std::fprintf(stderr, "error: ckpt export --dtype %s: not one of float32, bfloat16, float16\n", dtype.c_str());
    return kExitConfig;
  }
  const std::string dir = assets_folder(assets, file);
  const ExportSummary s = export_safetensors(file, output, dir, dtype);
  std::string copied;
  for (const std::string& name : s.tokenizer_files) copied += ", " + name;
  if (!dir.empty() && copied.empty()) copied = "; no tokenizer files in " + dir;
  else if (!dir.empty()) copied += " (from " + dir + ")";
  std::printf("exported %s (step %lld) to %s: %lld %s tensors, %lld bytes in model.safetensors, config.json (%s)%s\n",
              file.c_str(), static_cast<long long>(s.step), output.c_str(), static_cast<long long>(s.tensors),
              dtype.c_str(), static_cast<long long>(s.bytes), s.architecture.c_str(), copied.c_str());
  return kExitOk;
}

}  // namespace

int cmd_ckpt(int argc, char** argv) {
  const std::string sub = argc > 0 ? argv[0] : "";
  try {
    if (sub == "inspect" && argc == 2) {
      bool ok = false;
      std::fputs(inspect_checkpoint(argv[1], ok).c_str(), stdout);
      return ok ? kExitOk : kExitConfig;
    }
    if (sub == "export") return export_cmd(argc - 1, argv + 1);
  } catch (const CheckpointError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitConfig;
  }
  std::fprintf(stderr, "%s\n", kUsage);
  return kExitConfig;
}

}  // namespace meshtrain::app
