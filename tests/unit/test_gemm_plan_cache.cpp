// The bounded GEMM plan cache's pieces (device/gemm_plan_cache.hpp): the size buckets one
// heuristic answer serves, and the LRU bound on exact problems. The GPU side (CudaDevice's
// cache under many MoE row counts) is tests/gpu/test_cuda_matmul.cpp.
#define BOOST_TEST_MODULE gemm_plan_cache
#include <boost/test/unit_test.hpp>

#include <set>
#include <string>

#include "device/gemm_plan_cache.hpp"

using namespace meshtrain;

BOOST_AUTO_TEST_CASE(buckets_cover_each_size_within_an_eighth) {
  int64_t prev = 0;
  for (int64_t x = 0; x <= 200000; ++x) {
    const int64_t b = gemm_size_bucket(x);
    BOOST_REQUIRE_GE(b, x);
    BOOST_REQUIRE(b >= prev);                      // monotone
    BOOST_REQUIRE(gemm_size_bucket(b) == b);       // a bucket is its own bucket
    if (x > 16) BOOST_REQUIRE_LE(8 * (b - x), x);  // at most 12.5% above
    if (x <= 16) BOOST_REQUIRE_EQUAL(b, x);
    prev = b;
  }
  BOOST_TEST(gemm_size_bucket(17) == 18);
  BOOST_TEST(gemm_size_bucket(1000) == 1024);
  BOOST_TEST(gemm_size_bucket(1025) == 1152);
  BOOST_CHECK_THROW(gemm_size_bucket(-1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(every_moe_row_count_up_to_a_million_falls_in_few_buckets) {
  // Tokens per expert take any value in [0, T]; the heuristic is asked once per bucket.
  std::set<int64_t> buckets;
  for (int64_t x = 0; x <= 1 << 20; ++x) buckets.insert(gemm_size_bucket(x));
  // 17 exact sizes up to 16, then 8 per octave from 2^4 to 2^20 (16 octaves), plus 2^20 itself.
  BOOST_TEST(buckets.size() <= 17u + 8u * 16u + 1u);
}

BOOST_AUTO_TEST_CASE(lru_cache_stays_within_its_capacity) {
  LruCache<int, std::string> c(3);
  c.insert(1, "a");
  c.insert(2, "b");
  c.insert(3, "c");
  BOOST_TEST(*c.find(1) == "a");  // 1 is now the most recent; 2 the least
  c.insert(4, "d");
  BOOST_TEST(c.size() == 3u);
  BOOST_TEST(c.find(2) == nullptr);
  BOOST_TEST(c.evictions() == 1);
  BOOST_TEST(*c.find(1) == "a");
  BOOST_TEST(*c.find(4) == "d");
  c.insert(4, "e");  // replace, no eviction
  BOOST_TEST(*c.find(4) == "e");
  BOOST_TEST(c.evictions() == 1);
  for (int k = 10; k < 1000; ++k) c.insert(k, "x");
  BOOST_TEST(c.size() == 3u);
  BOOST_TEST(c.find(999) != nullptr);
  c.clear();
  BOOST_TEST(c.size() == 0u);
  BOOST_CHECK_THROW((LruCache<int, int>(0)), std::invalid_argument);
}
