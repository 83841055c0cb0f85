// `meshtrain ckpt inspect FILE`: the tree, shapes, dtypes, train state, writer layout and checksum
// verdict of a sharded checkpoint. `meshtrain ckpt export --format safetensors --output DIR FILE`:
// a Hugging Face model folder (doc/checkpoint-format.md). Serial; no MPI launch needed.
#include <cstdio>
#include <string>

#include "app/commands.hpp"
#include "checkpoint/inspect.hpp"
#include "checkpoint/safetensors_export.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

namespace {

constexpr const char* kUsage =
    "usage: meshtrain ckpt inspect FILE\n"
    "       meshtrain ckpt export --format safetensors --output DIR FILE";

int export_cmd(int argc, char** argv) {
  std::string format, output, file;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--format" || a == "--output") && i + 1 < argc) {
      (a == "--format" ? format : output) = argv[++i];
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
  const ExportSummary s = export_safetensors(file, output);
  std::printf("exported %s (step %lld) to %s: %lld tensors, %lld bytes in model.safetensors, config.json (%s)\n",
              file.c_str(), static_cast<long long>(s.step), output.c_str(), static_cast<long long>(s.tensors),
              static_cast<long long>(s.bytes), s.architecture.c_str());
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
