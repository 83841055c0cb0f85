#pragma once
/// @file Memory categories, the Allocator interface and the caching allocator with per-category
/// byte accounting (DESIGN.md, Device). The CPU and CUDA backends differ only in the raw
/// allocate/free functions they hand to CachingAllocator.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace meshtrain {

/// What a block of memory holds; peaks are tracked per category and in total.
enum class MemCategory : int {
  kParameters = 0,
  kGradients,
  kOptimizer,
  kActivations,
  kCommunication,
  kTemporaries,
  kCount
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
/// "parameters", "gradients", ... (used in metrics and reports).
const char* mem_category_name(MemCategory c);

/// Bytes in use and peak bytes, per category and total (bytes requested by callers, not
/// counting the cache's rounding).
struct MemoryStats {
  std::array<int64_t, kNumMemCategories> in_use{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_in_use = 0;
  int64_t total_peak = 0;
  int64_t cached_bytes = 0;     ///< bytes held by the cache, free for reuse
  int64_t reserved_bytes = 0;   ///< bytes obtained from the backend (in use + cached)
};

/// An allocation refused because it would take an allocator past its limit (set_limit): what()
/// names the request, the limit and its source, and the bytes in use per category.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// Abstract allocator a Storage returns its memory to.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// @returns a block of at least `bytes` bytes (64-byte aligned). @throws std::bad_alloc.
  virtual void* allocate(size_t bytes, MemCategory cat) = 0;
  /// Returns a block obtained from allocate() with the same bytes and category.
  virtual void deallocate(void* p, size_t bytes, MemCategory cat) = 0;
  virtual MemoryStats stats() const = 0;
  /// Starts a new peak-measurement window (peaks := current use).
  virtual void reset_peaks() = 0;
  /// Caps the bytes obtained from the backend (MemoryStats::reserved_bytes) at `bytes`; 0 lifts
  /// the cap. `source` says where the cap comes from (a deck key), for the error. An allocation
  /// that would pass it, even after the cache is released, throws OutOfMemory. Throws nothing.
  virtual void set_limit(int64_t bytes, const std::string& source) = 0;
};

/// Caches freed blocks by rounded size so training steps reuse the same buffers instead of
/// returning them to the OS (on CPU, avoids page-fault storms on large activations; on CUDA,
/// avoids synchronizing cudaFree). Thread-safe.
class CachingAllocator final : public Allocator {
 public:
  using RawAlloc = std::function<void*(size_t)>;
  using RawFree = std::function<void(void*, size_t)>;
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free);
  ~CachingAllocator() override;
  void* allocate(size_t bytes, MemCategory cat) override;
  void deallocate(void* p, size_t bytes, MemCategory cat) override;
  MemoryStats stats() const override;
  void reset_peaks() override;
  void set_limit(int64_t bytes, const std::string& source) override;
  /// Returns every cached block to the backend.
  void release_cache();

 private:
  static size_t round_size(size_t bytes);
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
  MemoryStats stats_;
  int64_t limit_ = 0;  // bytes; 0 = none
  std::string limit_source_;
  /// Whether `rounded` more bytes from the backend would pass the limit. Caller holds mu_.
  bool over_limit(size_t rounded) const { return limit_ > 0 && stats_.reserved_bytes + int64_t(rounded) > limit_; }
  [[noreturn]] void throw_out_of_memory(size_t bytes, MemCategory cat);
};

}  // namespace meshtrain
