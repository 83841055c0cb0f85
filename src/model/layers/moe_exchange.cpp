#include "model/layers/moe_exchange.hpp"

#include <stdexcept>
#include <string>

namespace meshtrain {

EpExchange make_ep_exchange(const std::vector<int64_t>& counts, const std::vector<int32_t>& recv_counts, int64_t p) {
  const int64_t e = int64_t(counts.size());
  if (p < 1 || e % p || int64_t(recv_counts.size()) != e)
    throw std::invalid_argument("ep exchange: " + std::to_string(counts.size()) + " expert counts and " +
                                std::to_string(recv_counts.size()) + " received counts for ep " + std::to_string(p));
  const int64_t l = e / p;
  EpExchange x;
  x.send_rows.assign(size_t(p), 0);
  x.recv_rows.assign(size_t(p), 0);
  x.local_counts.assign(size_t(l), 0);
  for (int64_t q = 0; q < p; ++q)
    for (int64_t j = 0; j < l; ++j) {
      const int64_t sent = counts[size_t(q * l + j)], got = recv_counts[size_t(q * l + j)];
      if (sent < 0 || got < 0) throw std::invalid_argument("ep exchange: a negative count");
      x.send_rows[size_t(q)] += sent;
      x.recv_rows[size_t(q)] += got;
      x.local_counts[size_t(j)] += got;
    }
  for (int64_t n : x.recv_rows) x.rows_in += n;
  // Arrival offset of block (source s, expert j), then the rows in (expert, source) order.
  std::vector<int64_t> arrival(static_cast<size_t>(e));
  int64_t at = 0;
  for (int64_t s = 0; s < p; ++s)
    for (int64_t j = 0; j < l; ++j) arrival[size_t(s * l + j)] = at, at += recv_counts[size_t(s * l + j)];
  x.perm.resize(size_t(x.rows_in));
  x.inv_perm.resize(size_t(x.rows_in));
  int64_t out = 0;
  for (int64_t j = 0; j < l; ++j)
    for (int64_t s = 0; s < p; ++s)
      for (int64_t r = 0; r < recv_counts[size_t(s * l + j)]; ++r, ++out) {
        const int64_t from = arrival[size_t(s * l + j)] + r;
        x.perm[size_t(out)] = int32_t(from);
        x.inv_perm[size_t(from)] = int32_t(out);
      }
  return x;
}

}  // namespace meshtrain
