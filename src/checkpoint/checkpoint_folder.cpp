#include "checkpoint/checkpoint_folder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "util/errors.hpp"

namespace fs = std::filesystem;

namespace meshtrain {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw CheckpointError(path + ": " + what); }

// Flushes a file (or a directory entry table) to stable storage.
void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail(path, std::string("cannot open to sync: ") + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(path, std::string("fsync failed: ") + std::strerror(errno));
}

void rename_or_fail(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) fail(to.string(), std::string("cannot rename into place: ") + std::strerror(errno));
}

}  // namespace

std::vector<int64_t> checkpoint_steps(const std::string& folder) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(folder), ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() == 16 && n.rfind("step-", 0) == 0 && n.substr(13) == ".h5")
      steps.push_back(std::stoll(n.substr(5, 8)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string checkpoint_file_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::optional<std::string> checkpoint_to_load(const std::string& folder, int64_t load_step) {
  const fs::path dir(folder);
  if (load_step >= 0) {
    const fs::path f = dir / checkpoint_file_name(load_step);
    if (!fs::exists(f)) fail(f.string(), "no such checkpoint ([checkpoint] load_step = " + std::to_string(load_step) + ")");
    return f.string();
  }
  const fs::path latest = dir / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  if (name.empty()) fail(latest.string(), "empty pointer");
  const fs::path f = dir / name;
  if (!fs::exists(f)) fail(latest.string(), "names " + name + ", which does not exist");
  return f.string();
}

void publish_file(const std::string& tmp, const std::string& final_path) {
  fsync_path(tmp, false);
  rename_or_fail(tmp, final_path);
  const fs::path dir = fs::path(final_path).parent_path();
  fsync_path(dir.empty() ? std::string(".") : dir.string(), true);
}

void publish_checkpoint(const std::string& folder, int64_t step, int64_t keep_latest_k) {
  const fs::path dir(folder);
  const fs::path final_path = dir / checkpoint_file_name(step);
  const fs::path tmp = fs::path(final_path.string() + ".tmp");
  fsync_path(tmp.string(), false);
  rename_or_fail(tmp, final_path);
  const fs::path latest_tmp = dir / "latest.tmp";
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    out << final_path.filename().string() << "\n";
    out.flush();
    if (!out) fail(latest_tmp.string(), "cannot write the latest pointer");
  }
  fsync_path(latest_tmp.string(), false);
  rename_or_fail(latest_tmp, dir / "latest");
  fsync_path(dir.string(), true);
  if (keep_latest_k > 0) {
    const std::vector<int64_t> steps = checkpoint_steps(folder);
    for (size_t i = 0; i + size_t(keep_latest_k) < steps.size(); ++i) {
      std::error_code ec;
      fs::remove(dir / checkpoint_file_name(steps[i]), ec);
    }
  }
}

}  // namespace meshtrain
