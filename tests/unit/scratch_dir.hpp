#pragma once
/// @file A per-process scratch folder under the system's temporary directory for unit tests that
/// write files, removed with everything in it when the test program exits, so repeated test runs
/// leave nothing behind in /tmp.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

namespace meshtrain::testing {

/// The folder `<tmp>/<prefix>_<pid>`, created on the first call with `prefix` and removed
/// (recursively) at exit; one folder per prefix.
/// Throws std::filesystem::filesystem_error when it cannot be created.
inline const std::filesystem::path& scratch_dir(const std::string& prefix) {
  struct Owned {
    std::filesystem::path path;
    explicit Owned(std::filesystem::path p) : path(std::move(p)) { std::filesystem::create_directories(path); }
    ~Owned() {
      std::error_code ec;  // nothing to report at exit: a folder left behind is harmless
      std::filesystem::remove_all(path, ec);
    }
  };
  static std::map<std::string, Owned> dirs;
  auto it = dirs.find(prefix);
  if (it == dirs.end())
    it = dirs.try_emplace(prefix, std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid())))
             .first;
  return it->second.path;
}

}  // namespace meshtrain::testing
