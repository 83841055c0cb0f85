#define BOOST_TEST_MODULE dim0_shard
#include <boost/test/unit_test.hpp>
#include <vector>

#include "parallel/fsdp/dim0_shard.hpp"

using namespace meshtrain;

BOOST_AUTO_TEST_CASE(blocks_cover_rows_once_even_when_uneven) {
  for (int64_t rows : {1, 2, 5, 7, 8, 13})
    for (int64_t n : {1, 2, 3, 4, 8}) {
      int64_t covered = 0, next = 0;
      for (int64_t k = 0; k < n; ++k) {
        const Dim0Shard s = dim0_shard({rows, 3}, n, k);
        BOOST_TEST(s.first_row == std::min(rows, next));  // contiguous, in rank order
        BOOST_TEST(s.local_rows <= s.rows_per_rank);
        BOOST_TEST(s.padded_elems() == s.rows_per_rank * 3);
        covered += s.local_rows;
        next = s.first_row + s.local_rows;
      }
      BOOST_TEST(covered == rows);
    }
  const Dim0Shard tiny = dim0_shard({2}, 4, 3);  // smaller than the group: the last ranks hold nothing
  BOOST_TEST(tiny.local_rows == 0);
  BOOST_TEST(tiny.padded_elems() == 1);
  BOOST_CHECK_THROW(dim0_shard({4}, 2, 2), std::invalid_argument);
  BOOST_CHECK_THROW(dim0_shard({}, 2, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(gather_of_padded_shards_reconstructs_the_tensor) {
  const Shape shape{7, 3};
  const int64_t n = 3;
  std::vector<float> full(21), rebuilt(21, -1.0f);
  for (int i = 0; i < 21; ++i) full[size_t(i)] = float(i);
  const Dim0Shard s0 = dim0_shard(shape, n, 0);
  std::vector<float> gathered(size_t(n * s0.padded_elems()));
  for (int64_t k = 0; k < n; ++k) {  // what an all-gather of the padded blocks produces
    const Dim0Shard s = dim0_shard(shape, n, k);
    copy_shard_from_full(s, full.data(), gathered.data() + k * s.padded_elems());
  }
  BOOST_TEST(gathered[size_t(2 * s0.padded_elems() + 3)] == 0.0f);  // rank 2 holds 1 row; its padding is zero
  copy_full_from_gathered(s0, gathered.data(), rebuilt.data());
  BOOST_TEST(rebuilt == full);
}
