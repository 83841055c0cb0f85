#include "checkpoint/stream_verifier.hpp"
#include "checkpoint/xxh3_dispatch.hpp"

#include <algorithm>
#include <cstdio>
#include <new>
#include <stdexcept>

#include "util/errors.hpp"

namespace meshtrain {

std::vector<FileExtent> box_extents(uint64_t base, const std::vector<hsize_t>& shape, const std::vector<hsize_t>& start,
                                    const std::vector<hsize_t>& count, char* dst) {
  const size_t nd = shape.size();
  if (start.size() != nd || count.size() != nd) throw std::invalid_argument("box_extents: rank mismatch");
  for (size_t d = 0; d < nd; ++d)
    if (start[d] + count[d] > shape[d]) throw std::invalid_argument("box_extents: the box leaves the shape");
  std::vector<FileExtent> out;
  uint64_t total = 1;
  for (uint64_t c : count) total *= c;
  if (total == 0) return out;
  // Dimensions from `j` on form one run: every dimension after j is whole.
  size_t j = nd == 0 ? 0 : nd - 1;
  while (j > 0 && start[j] == 0 && count[j] == shape[j]) --j;
  std::vector<uint64_t> stride(nd, 1);
  for (size_t d = nd; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  const uint64_t run = nd == 0 ? 4 : count[j] * stride[j] * 4;
  std::vector<hsize_t> idx(j, 0);  // position in dims [0, j) of the box
  for (uint64_t at = 0;; at += run) {
    uint64_t elem = nd == 0 ? 0 : start[j] * stride[j];
    for (size_t d = 0; d < j; ++d) elem += (start[d] + idx[d]) * stride[d];
    out.push_back({base + elem * 4, run, dst ? dst + at : nullptr});
    size_t d = j;
    while (d > 0 && ++idx[d - 1] == count[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

StreamVerifier::StreamVerifier(std::vector<ChecksumRecord> records, std::vector<std::vector<FileExtent>> runs)
    : records_(std::move(records)), states_(records_.size()) {
  for (size_t r = 0; r < runs.size(); ++r) {
    states_[r].runs = runs[r].size();
    states_[r].xxh = XXH3_createState();
    if (!states_[r].xxh) throw std::bad_alloc();
    XXH3_64bits_reset(states_[r].xxh);
    for (size_t i = 0; i < runs[r].size(); ++i) pieces_.push_back({runs[r][i].offset, runs[r][i].bytes, r, i});
  }
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
}

StreamVerifier::~StreamVerifier() {
  for (State& s : states_)
    if (s.xxh) XXH3_freeState(s.xxh);
}

void StreamVerifier::observe(uint64_t offset, const char* data, uint64_t n) {
  const uint64_t end = offset + n;
  while (first_ < pieces_.size() && pieces_[first_].offset + pieces_[first_].bytes <= offset) ++first_;
  for (size_t i = first_; i < pieces_.size() && pieces_[i].offset < end; ++i) {
    const Piece& p = pieces_[i];
    State& s = states_[p.record];
    if (s.broken || s.next > p.index) continue;  // unverifiable, or this run is already hashed
    const uint64_t from = std::max(p.offset, offset), to = std::min(p.offset + p.bytes, end);
    if (s.next < p.index || from != p.offset + s.done) {  // an earlier run or byte went unseen
      s.broken = true;
      continue;
    }
    XXH3_64bits_update(s.xxh, data + (from - offset), to - from);
    s.done += to - from;
    if (s.done == p.bytes) ++s.next, s.done = 0;
  }
}

std::vector<int> StreamVerifier::finish(const std::string& path) {
  std::vector<int> ok(records_.size(), 0);
  for (size_t r = 0; r < records_.size(); ++r) {
    const State& s = states_[r];
    if (s.broken || s.next != s.runs) continue;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(s.xxh)));
    if (records_[r].xxh3_hex != hex)
      throw CheckpointError(path + ": dataset " + records_[r].dataset + ": a shard fails its checksum (xxh3 " + hex +
                            ", written " + records_[r].xxh3_hex + "): corrupt checkpoint");
    ok[r] = 1;
  }
  return ok;
}

}  // namespace meshtrain
