// Context parallelism's sequence cut (parallel/context/context_parallel.hpp): which chunks each
// cp rank holds, that the cut and its inverse are exact, and that head-tail balancing gives every
// rank the same causal attention work.
#define BOOST_TEST_MODULE context_parallel
#include <boost/test/unit_test.hpp>
#include <numeric>
#include <vector>

#include "parallel/context/context_parallel.hpp"

using namespace meshtrain;

BOOST_AUTO_TEST_CASE(headtail_and_none_chunks) {
  // cp 4, T 16: 8 chunks of 2 tokens.
  BOOST_TEST(sequence_shard(16, 4, 0, CpBalancer::kHeadTail).chunks == (std::vector<int64_t>{0, 7}));
  BOOST_TEST(sequence_shard(16, 4, 3, CpBalancer::kHeadTail).chunks == (std::vector<int64_t>{3, 4}));
  BOOST_TEST(sequence_shard(16, 4, 1, CpBalancer::kNone).chunks == (std::vector<int64_t>{2, 3}));
  const SequenceShard s = sequence_shard(16, 4, 2, CpBalancer::kHeadTail);
  BOOST_TEST(s.chunk_len == 2);
  BOOST_TEST(s.local_len() == 4);
  BOOST_TEST(s.position(1, 1) == 5 * 2 + 1);
  // cp 1: the whole sequence as one chunk.
  const SequenceShard one = sequence_shard(10, 1, 0, CpBalancer::kHeadTail);
  BOOST_TEST(one.chunks == (std::vector<int64_t>{0}));
  BOOST_TEST(one.chunk_len == 10);
  BOOST_CHECK_THROW(sequence_shard(18, 4, 0, CpBalancer::kHeadTail), std::invalid_argument);  // 18 % 8
  BOOST_CHECK_THROW(sequence_shard(16, 4, 4, CpBalancer::kHeadTail), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(shard_then_unshard_is_the_identity) {
  for (CpBalancer bal : {CpBalancer::kHeadTail, CpBalancer::kNone})
    for (int64_t cp : {1, 2, 3, 4})
      for (int64_t t : {2 * cp, 6 * cp}) {
        const int64_t n = 3;
        std::vector<int32_t> samples(size_t(n * (t + 1)));
        std::iota(samples.begin(), samples.end(), 100);
        std::vector<int32_t> inputs, targets;  // every rank's cut, in rank order
        for (int64_t r = 0; r < cp; ++r) {
          const SequenceShard s = sequence_shard(t, cp, r, bal);
          std::vector<int32_t> in(size_t(n * s.local_len())), tg(in.size());
          shard_samples(s, samples.data(), n, in.data(), tg.data());
          inputs.insert(inputs.end(), in.begin(), in.end());
          targets.insert(targets.end(), tg.begin(), tg.end());
        }
        const std::vector<int32_t> in = unshard_tokens(inputs, n, t, cp, bal), tg = unshard_tokens(targets, n, t, cp, bal);
        for (int64_t b = 0; b < n; ++b)
          for (int64_t i = 0; i < t; ++i) {
            // Inputs are [:, :T], targets the next token: shifted before the cut.
            BOOST_TEST(in[size_t(b * t + i)] == samples[size_t(b * (t + 1) + i)]);
            BOOST_TEST(tg[size_t(b * t + i)] == samples[size_t(b * (t + 1) + i + 1)]);
          }
      }
  BOOST_CHECK_THROW(unshard_tokens(std::vector<int32_t>(5), 1, 4, 2, CpBalancer::kHeadTail), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(headtail_gives_every_rank_the_same_causal_work) {
  // Work of a rank = key tokens its queries attend under the causal mask.
  for (int64_t cp : {2, 4, 8}) {
    const int64_t t = 16 * cp;
    auto work = [&](int64_t r, CpBalancer bal) {
      const SequenceShard s = sequence_shard(t, cp, r, bal);
      int64_t w = 0;
      for (size_t c = 0; c < s.chunks.size(); ++c)
        for (int64_t i = 0; i < s.chunk_len; ++i) w += s.position(c, i) + 1;
      return w;
    };
    for (int64_t r = 1; r < cp; ++r) {
      BOOST_TEST(work(r, CpBalancer::kHeadTail) == work(0, CpBalancer::kHeadTail));
      BOOST_TEST(work(r, CpBalancer::kNone) > work(r - 1, CpBalancer::kNone));
    }
  }
  BOOST_TEST(cp_rotate_name(cp_rotate_from_name("ulysses")) == std::string("ulysses"));
  BOOST_CHECK_THROW(cp_balancer_from_name("ptrr"), std::invalid_argument);
}
