#pragma once
/// @file BytePairEncoder: the BPE model of byte-level tokenizers (Sennrich et al. 2016, "Neural
/// Machine Translation of Rare Words with Subword Units"; GPT-2's byte-level variant), on raw bytes.
///
/// A pre-token (one regex match, at most a few dozen bytes in practice) becomes token ids so:
///  1. with `ignore_merges` (Llama 3, tiktoken files), a pre-token that is itself in the
///     vocabulary is that one token;
///  2. otherwise it starts as one symbol per byte, and the adjacent pair of lowest merge rank is
///     merged, the leftmost of equal ranks first, until no adjacent pair has a merge.
/// Hugging Face tokenizers' BPE (merges listed by rank) and tiktoken (a pair's rank is the rank
/// of its concatenation) both reduce to this rule; the constructors take either form.
///
/// Merge lookups use an open-addressing table keyed by the two symbols' ids; words of up to
/// kShortWord bytes merge in place (a rank per adjacent pair, O(n) per merge), longer ones through
/// a heap over a linked list (O(n log n)). Encoded pre-tokens are cached (most words of a corpus
/// repeat), so an encoder is not safe to use from two threads at once.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshtrain {

class BytePairEncoder {
 public:
  /// A vocabulary entry: raw bytes and id.
  using Entry = std::pair<std::string, int32_t>;
  /// A merge: the raw bytes of the left and right symbols, in rank order (rank = index).
  using Merge = std::pair<std::string, std::string>;

  /// Hugging Face form: `vocab` (every single byte must be an entry) and `merges` by rank.
  /// @throws DataError (prefixed by `source`) when a byte is missing from the vocabulary, an id
  ///         repeats, or a merge names a symbol or a result that is not in the vocabulary.
  static BytePairEncoder from_merges(const std::vector<Entry>& vocab, const std::vector<Merge>& merges,
                                     bool ignore_merges, const std::string& source);
  /// tiktoken form: `ranks` (bytes, rank); the rank of a pair is the rank of its concatenation,
  /// and a pre-token that is in `ranks` is one token (tiktoken's rule). @throws DataError.
  static BytePairEncoder from_ranks(const std::vector<Entry>& ranks, const std::string& source);

  BytePairEncoder(BytePairEncoder&&) noexcept;
  BytePairEncoder& operator=(BytePairEncoder&&) noexcept;
  ~BytePairEncoder();

  /// Appends the ids of one pre-token (raw bytes, non-empty) to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  /// Raw bytes of token `id`, or nullptr when the model has no such id (an added token's id).
  const std::string* token_bytes(int32_t id) const;
  /// Id of the vocabulary entry spelled `bytes`, or -1.
  int32_t find(std::string_view bytes) const;
  /// One more than the largest id in the vocabulary.
  int64_t id_limit() const;

 private:
  struct Impl;
  explicit BytePairEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain
