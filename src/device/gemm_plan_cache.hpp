#pragma once
/// @file The two pieces that keep a GEMM backend's plan cache bounded when problem sizes vary
/// from call to call — under Mixture-of-Experts a grouped GEMM's row count is the tokens routed
/// to one expert, new at every step, so a cache keyed on exact sizes asks the algorithm
/// heuristic on almost every call and grows without bound:
///  - gemm_size_bucket(): the size the algorithm is chosen for (at most 8 buckets per octave),
///    so one heuristic answer serves every size of a bucket;
///  - LruCache: the per-exact-size descriptors, evicted least recently used past a capacity.
/// CudaDevice::matmul uses both (device/cuda/cuda_device.cpp); they are pure C++ so that the
/// CPU tests check them.
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshtrain {

/// The bucket of a GEMM extent x ≥ 0: x itself up to 16, above that x rounded up to a multiple
/// of 2^(⌊log2 x⌋ − 3) — 8 buckets per power of two, each at most 12.5% above the sizes it
/// holds. Monotone non-decreasing, bucket(x) ≥ x, bucket(bucket(x)) = bucket(x).
/// @throws std::invalid_argument for x < 0.
inline int64_t gemm_size_bucket(int64_t x) {
  if (x < 0) throw std::invalid_argument("gemm_size_bucket: negative extent " + std::to_string(x));
  if (x <= 16) return x;
  int p = 0;
  while ((int64_t(1) << (p + 1)) <= x) ++p;
  const int64_t step = int64_t(1) << (p - 3);
  return (x + step - 1) / step * step;
}

/// A map of at most `capacity` entries that evicts the least recently used (found or inserted)
/// entry when a new one would exceed it. Not thread-safe: the owner locks.
template <class Key, class Value>
class LruCache {
 public:
  /// @throws std::invalid_argument for capacity 0.
  explicit LruCache(size_t capacity) : capacity_(capacity) {
    if (capacity == 0) throw std::invalid_argument("LruCache: capacity 0");
  }
  /// The value of `key`, now the most recently used, or nullptr. The pointer is valid until the
  /// next insert() or clear().
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    items_.splice(items_.begin(), items_, it->second);
    return &it->second->second;
  }
  /// Inserts (or replaces) `key`'s value as the most recently used, evicting the least recently
  /// used entry when full; returns the stored value (valid as find()'s).
  Value& insert(const Key& key, Value value) {
    if (Value* v = find(key)) return *v = std::move(value);
    if (items_.size() == capacity_) {
      index_.erase(items_.back().first);
      items_.pop_back();
      ++evictions_;
    }
    items_.emplace_front(key, std::move(value));
    index_[key] = items_.begin();
    return items_.front().second;
  }
  size_t size() const { return items_.size(); }
  size_t capacity() const { return capacity_; }
  /// Entries evicted since construction.
  int64_t evictions() const { return evictions_; }
  void clear() {
    index_.clear();
    items_.clear();
  }

 private:
  size_t capacity_;
  int64_t evictions_ = 0;
  std::list<std::pair<Key, Value>> items_;  // most recently used first
  std::map<Key, typename std::list<std::pair<Key, Value>>::iterator> index_;
};

}  // namespace meshtrain
