#include "comm/mpi/mpi_chunking.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

// Atomic so that a test lowering the limit cannot tear a read made by another thread; MPI itself
// is only called from one thread (MPI_THREAD_FUNNELED).
std::atomic<int64_t> g_max_count{kMpiDefaultMaxCount};

void check_max_count(int64_t max_count, const char* what) {
  if (max_count < 1 || max_count > INT_MAX)
    throw std::invalid_argument(std::string(what) + ": chunk limit " + std::to_string(max_count) +
                                " is outside [1, " + std::to_string(INT_MAX) + "] (an MPI int count)");
}

}  // namespace

std::vector<MpiChunk> plan_mpi_chunks(int64_t n, int64_t max_count) {
  check_max_count(max_count, "plan_mpi_chunks");
  if (n < 0) throw std::invalid_argument("plan_mpi_chunks: negative element count " + std::to_string(n));
  if (n == 0) return {MpiChunk{0, 0}};
  std::vector<MpiChunk> chunks;
  chunks.reserve(size_t((n + max_count - 1) / max_count));
  for (int64_t off = 0; off < n; off += max_count) chunks.push_back({off, int(std::min(max_count, n - off))});
  return chunks;
}

int64_t per_rank_max_count(int64_t max_count, int ranks) {
  check_max_count(max_count, "per_rank_max_count");
  if (ranks < 1) throw std::invalid_argument("per_rank_max_count: " + std::to_string(ranks) + " ranks (need >= 1)");
  const int64_t per_rank = max_count / ranks;
  if (per_rank >= kMpiChunkAlign) return per_rank / kMpiChunkAlign * kMpiChunkAlign;
  return std::max<int64_t>(per_rank, 1);
}

int64_t mpi_max_count() { return g_max_count.load(std::memory_order_relaxed); }

void set_mpi_max_count_for_testing(int64_t max_count) {
  check_max_count(max_count, "set_mpi_max_count_for_testing");
  g_max_count.store(max_count, std::memory_order_relaxed);
}

int checked_int_count(int64_t n, const std::string& what) {
  if (n < 0) throw std::invalid_argument(what + ": negative MPI count " + std::to_string(n));
  if (n > INT_MAX)
    throw CommError(what + ": " + std::to_string(n) + " elements exceed the MPI int count limit (" +
                    std::to_string(INT_MAX) + ")");
  return int(n);
}

}  // namespace meshtrain
