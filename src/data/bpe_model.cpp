#include "data/bpe_model.hpp"

#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <queue>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return size_t(XXH3_64bits(s.data(), s.size())); }
};
template <class V>
using BytesMap = std::unordered_map<std::string, V, BytesHash, std::equal_to<>>;

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Open-addressing table (linear probing) from a symbol pair to (rank, merged id): the inner loop
// of BPE is one lookup per adjacent pair, so it avoids std::unordered_map's node chasing.
class PairTable {
 public:
  struct Value {
    int32_t rank = kNoRank, merged = -1;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{});
    mask_ = cap - 1;
  }
  // Keeps the lowest rank when a pair is inserted twice (tiktoken: several splits of a token).
  void insert(int32_t a, int32_t b, Value v) {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty) {
        keys_[i] = k, values_[i] = v;
        return;
      }
      if (keys_[i] == k) {
        if (v.rank < values_[i].rank) values_[i] = v;
        return;
      }
    }
  }
  Value find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return values_[i];
      if (keys_[i] == kEmpty) return {};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  size_t slot(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
};

constexpr size_t kShortWord = 256;    // longer pre-tokens (whitespace runs, long numbers) use the heap
constexpr size_t kCacheEntries = 1 << 18;

}  // namespace

struct BytePairEncoder::Impl {
  BytesMap<int32_t> ids;                 // raw bytes -> id
  std::vector<std::string> bytes_of;     // id -> raw bytes ("" for ids the model lacks)
  std::vector<bool> has_id;
  int32_t byte_id[256];
  PairTable pairs;
  bool ignore_merges = false;
  mutable BytesMap<std::vector<int32_t>> cache;

  void add_vocab(const std::vector<Entry>& vocab, const std::string& source) {
    int32_t max_id = -1;
    for (const auto& [b, id] : vocab) {
      if (id < 0) throw DataError(source + ": negative token id " + std::to_string(id));
      max_id = std::max(max_id, id);
    }
    bytes_of.assign(size_t(max_id + 1), std::string());
    has_id.assign(size_t(max_id + 1), false);
    ids.reserve(vocab.size());
    for (const auto& [b, id] : vocab) {
      if (has_id[size_t(id)]) throw DataError(source + ": token id " + std::to_string(id) + " appears twice");
      if (!ids.emplace(b, id).second) continue;  // a spelling listed twice keeps its first id
      has_id[size_t(id)] = true;
      bytes_of[size_t(id)] = b;
    }
    for (int c = 0; c < 256; ++c) {
      const auto it = ids.find(std::string_view(reinterpret_cast<const char*>(&c), 1));
      if (it == ids.end())
        throw DataError(source + ": byte 0x" + "0123456789abcdef"[c >> 4] + "0123456789abcdef"[c & 15] +
                        " has no token (a byte-level vocabulary must hold all 256 bytes)");
      byte_id[c] = it->second;
    }
  }

  int32_t id_of(std::string_view b) const {
    const auto it = ids.find(b);
    return it == ids.end() ? -1 : it->second;
  }

  // Merges in place: ranks[i] is the rank of the pair (sym[i], sym[i+1]).
  void merge_short(std::vector<int32_t>& sym) const {
    const size_t n0 = sym.size();
    int32_t rank[kShortWord], merged[kShortWord];
    for (size_t i = 0; i + 1 < n0; ++i) {
      const auto v = pairs.find(sym[i], sym[i + 1]);
      rank[i] = v.rank, merged[i] = v.merged;
    }
    size_t n = n0;
    while (n > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < n; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == kNoRank) break;
      sym[best] = merged[best];
      for (size_t i = best + 1; i + 1 < n; ++i) sym[i] = sym[i + 1], rank[i] = rank[i + 1], merged[i] = merged[i + 1];
      --n;
      if (best + 1 < n) {
        const auto v = pairs.find(sym[best], sym[best + 1]);
        rank[best] = v.rank, merged[best] = v.merged;
      }
      if (best > 0) {
        const auto v = pairs.find(sym[best - 1], sym[best]);
        rank[best - 1] = v.rank, merged[best - 1] = v.merged;
      }
    }
    sym.resize(n);
  }

  // The same merge order through a min-heap of (rank, left position) over a linked list; a heap
  // entry is stale when either symbol changed since it was pushed.
  void merge_long(std::vector<int32_t>& sym) const {
    const int n = int(sym.size());
    std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) next[size_t(i)] = i + 1 < n ? i + 1 : -1, prev[size_t(i)] = i - 1;
    struct Cand {
      int32_t rank;
      int pos;
      int32_t left, right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
    auto push = [&](int i) {
      if (i < 0 || next[size_t(i)] < 0) return;
      const int j = next[size_t(i)];
      const auto v = pairs.find(sym[size_t(i)], sym[size_t(j)]);
      if (v.rank != kNoRank) heap.push({v.rank, i, sym[size_t(i)], sym[size_t(j)]});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<bool> dead(size_t(n), false);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const int j = next[size_t(c.pos)];
      if (dead[size_t(c.pos)] || j < 0 || sym[size_t(c.pos)] != c.left || sym[size_t(j)] != c.right) continue;
      sym[size_t(c.pos)] = pairs.find(c.left, c.right).merged;
      dead[size_t(j)] = true;
      next[size_t(c.pos)] = next[size_t(j)];
      if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = c.pos;
      push(prev[size_t(c.pos)]);
      push(c.pos);
    }
    size_t k = 0;
    for (int i = 0; i >= 0 && i < n; i = next[size_t(i)]) sym[k++] = sym[size_t(i)];
    sym.resize(k);
  }
};

BytePairEncoder::BytePairEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BytePairEncoder::BytePairEncoder(BytePairEncoder&&) noexcept = default;
BytePairEncoder& BytePairEncoder::operator=(BytePairEncoder&&) noexcept = default;
BytePairEncoder::~BytePairEncoder() = default;

BytePairEncoder BytePairEncoder::from_merges(const std::vector<Entry>& vocab, const std::vector<Merge>& merges,
                                             bool ignore_merges, const std::string& source) {
  auto m = std::make_unique<Impl>();
  m->add_vocab(vocab, source);
  m->ignore_merges = ignore_merges;
  m->pairs.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [l, rt] = merges[r];
    const int32_t a = m->id_of(l), b = m->id_of(rt), c = m->id_of(l + rt);
    if (a < 0 || b < 0 || c < 0)
      throw DataError(source + ": merge " + std::to_string(r) + " uses or makes a symbol that is not in the vocabulary");
    m->pairs.insert(a, b, {int32_t(r), c});
  }
  return BytePairEncoder(std::move(m));
}

BytePairEncoder BytePairEncoder::from_ranks(const std::vector<Entry>& ranks, const std::string& source) {
  auto m = std::make_unique<Impl>();
  m->add_vocab(ranks, source);
  m->ignore_merges = true;
  // Every split of a token into two tokens is a merge of the token's rank: exactly the pairs
  // whose concatenation tiktoken would find in its rank table.
  size_t n = 0;
  for (const auto& [b, id] : ranks) n += b.size() > 1 ? b.size() - 1 : 0;
  m->pairs.reserve(n);
  for (const auto& [b, id] : ranks)
    for (size_t s = 1; s < b.size(); ++s) {
      const int32_t l = m->id_of(std::string_view(b).substr(0, s)), r = m->id_of(std::string_view(b).substr(s));
      if (l >= 0 && r >= 0) m->pairs.insert(l, r, {id, id});
    }
  return BytePairEncoder(std::move(m));
}

void BytePairEncoder::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const Impl& m = *impl_;
  if (m.ignore_merges) {
    const int32_t id = m.id_of(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() == 1) {
    out.push_back(m.byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (const auto it = m.cache.find(word); it != m.cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> sym(word.size());
  for (size_t i = 0; i < word.size(); ++i) sym[i] = m.byte_id[static_cast<unsigned char>(word[i])];
  if (sym.size() <= kShortWord)
    m.merge_short(sym);
  else
    m.merge_long(sym);
  out.insert(out.end(), sym.begin(), sym.end());
  if (m.cache.size() >= kCacheEntries) m.cache.clear();  // bounded memory; refills with the current text's words
  m.cache.emplace(std::string(word), std::move(sym));
}

const std::string* BytePairEncoder::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->has_id.size() || !impl_->has_id[size_t(id)]) return nullptr;
  return &impl_->bytes_of[size_t(id)];
}

int32_t BytePairEncoder::find(std::string_view bytes) const { return impl_->id_of(bytes); }

int64_t BytePairEncoder::id_limit() const { return int64_t(impl_->bytes_of.size()); }

}  // namespace meshtrain
