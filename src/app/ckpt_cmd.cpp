// `meshtrain ckpt inspect FILE`: the tree, shapes, dtypes, train state, writer layout and checksum
// verdict of a sharded checkpoint (doc/checkpoint-format.md). Serial; no MPI launch needed.
#include <cstdio>
#include <string>

#include "app/commands.hpp"
#include "checkpoint/inspect.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

int cmd_ckpt(int argc, char** argv) {
  const char* usage = "usage: meshtrain ckpt inspect FILE";
  if (argc != 2 || std::string(argv[0]) != "inspect") {
    std::fprintf(stderr, "%s\n", usage);
    return kExitConfig;
  }
  try {
    bool ok = false;
    std::fputs(inspect_checkpoint(argv[1], ok).c_str(), stdout);
    return ok ? kExitOk : kExitConfig;
  } catch (const CheckpointError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitConfig;
  }
}

}  // namespace meshtrain::app
