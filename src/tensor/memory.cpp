#include "tensor/memory.hpp"

#include <cstdio>
#include <new>

namespace meshtrain {

const char* mem_category_name(MemCategory c) {
  static const char* names[] = {"parameters", "gradients", "optimizer", "activations", "communication",
                                "temporaries"};
  return names[static_cast<int>(c)];
}

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() { release_cache(); }

size_t CachingAllocator::round_size(size_t bytes) {
  // Small blocks round to 512 B; large ones to 1/8 of their power of two, bounding waste to 12.5%.
  if (bytes <= 512) return 512;
  size_t p = 1;
  while (p < bytes) p <<= 1;
  const size_t step = p >= 8192 ? p / 8 : 512;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes, MemCategory cat) {
  const size_t rounded = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_blocks_.find(rounded);
    if (it != free_blocks_.end()) {
      p = it->second;
      free_blocks_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(rounded);
    }
  }
  if (!p) {
    bool over;
    {
      std::lock_guard<std::mutex> lock(mu_);
      over = over_limit(rounded);
    }
    if (over) {  // cached blocks of other sizes count against the limit: return them first
      release_cache();
      std::lock_guard<std::mutex> lock(mu_);
      if (over_limit(rounded)) throw_out_of_memory(bytes, cat);
    }
    p = raw_alloc_(rounded);
    if (!p) {
      release_cache();  // memory held by the cache may satisfy the request after all
      p = raw_alloc_(rounded);
      if (!p) throw std::bad_alloc();
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.reserved_bytes += static_cast<int64_t>(rounded);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int c = static_cast<int>(cat);
  stats_.in_use[c] += static_cast<int64_t>(bytes);
  stats_.total_in_use += static_cast<int64_t>(bytes);
  if (stats_.in_use[c] > stats_.peak[c]) stats_.peak[c] = stats_.in_use[c];
  if (stats_.total_in_use > stats_.total_peak) stats_.total_peak = stats_.total_in_use;
  return p;
}

void CachingAllocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t rounded = round_size(bytes);
  free_blocks_.emplace(rounded, p);
  stats_.cached_bytes += static_cast<int64_t>(rounded);
  stats_.in_use[static_cast<int>(cat)] -= static_cast<int64_t>(bytes);
  stats_.total_in_use -= static_cast<int64_t>(bytes);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.in_use;
  stats_.total_peak = stats_.total_in_use;
}

void CachingAllocator::set_limit(int64_t bytes, const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes > 0 ? bytes : 0;
  limit_source_ = source;
}

void CachingAllocator::throw_out_of_memory(size_t bytes, MemCategory cat) {
  auto mib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
    return std::string(buf);
  };
  std::string use;
  for (int c = 0; c < kNumMemCategories; ++c)
    if (stats_.in_use[size_t(c)] > 0)
      use += std::string(use.empty() ? "" : ", ") + mem_category_name(MemCategory(c)) + " " +
             mib(double(stats_.in_use[size_t(c)]));
  throw OutOfMemory("out of memory: " + mib(double(bytes)) + " of " + mem_category_name(cat) +
                    " would take this rank's memory to " + mib(double(stats_.reserved_bytes) + double(round_size(bytes))) +
                    ", over the limit of " + mib(double(limit_)) + " (" + limit_source_ + "); in use: " +
                    (use.empty() ? "nothing" : use));
}

void CachingAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_blocks_) {
    raw_free_(p, size);
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }
  free_blocks_.clear();
  stats_.cached_bytes = 0;
}

}  // namespace meshtrain
