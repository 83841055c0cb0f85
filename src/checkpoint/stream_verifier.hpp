#pragma once
/// @file Checksums verified from the bytes a node's reader streams past (node_read.hpp), so an
/// elastic restart — whose ranks read other hyperslabs than the writer's, so no rank holds a
/// written shard whole — still reads the checkpoint once. A /checksums record is the XXH3-64 of
/// a hyperslab's values in row-major order; in a contiguous dataset those values lie in the file
/// in that same order, as a few byte runs (box_extents), so feeding the runs to a streaming XXH3
/// state as the reader passes them gives the record's hash.
#include <hdf5.h>
#include <xxhash.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/node_read.hpp"
#include "checkpoint/sharded_checkpoint.hpp"

namespace meshtrain {

/// The byte runs, in file order, of hyperslab {start, count} of a row-major float32 dataset of
/// `shape` stored contiguously at file offset `base`; `dst` (may be null) is where the
/// hyperslab's values go, row-major, and each run's dst points into it. Whole trailing dimensions
/// merge into one run. @throws std::invalid_argument when the box leaves the shape.
std::vector<FileExtent> box_extents(uint64_t base, const std::vector<hsize_t>& shape, const std::vector<hsize_t>& start,
                                    const std::vector<hsize_t>& count, char* dst);

/// Hashes records from a stream of file bytes seen in increasing offset order.
class StreamVerifier {
 public:
  /// `records` with the byte runs of each (box_extents of its hyperslab; same index).
  StreamVerifier(std::vector<ChecksumRecord> records, std::vector<std::vector<FileExtent>> runs);
  ~StreamVerifier();
  StreamVerifier(const StreamVerifier&) = delete;
  StreamVerifier& operator=(const StreamVerifier&) = delete;

  /// Feeds `n` file bytes starting at file offset `offset` (a ChunkObserver).
  void observe(uint64_t offset, const char* data, uint64_t n);

  /// After the stream: for each record, 1 when every byte of it was seen in order and its hash
  /// matches. @throws CheckpointError naming `path` and the dataset when a wholly seen record's
  /// hash differs (a corrupt checkpoint).
  std::vector<int> finish(const std::string& path);

 private:
  struct Piece {
    uint64_t offset, bytes;
    size_t record, index;  // which record, and which of its runs
  };
  struct State {
    XXH3_state_t* xxh = nullptr;
    size_t next = 0;        // the run expected next
    uint64_t done = 0;      // bytes of that run already hashed
    size_t runs = 0;
    bool broken = false;    // a byte was skipped: cannot be verified from the stream
  };
  std::vector<ChecksumRecord> records_;
  std::vector<Piece> pieces_;  // every run, by offset
  std::vector<State> states_;
  size_t first_ = 0;           // pieces before this one are finished or skipped
};

}  // namespace meshtrain
