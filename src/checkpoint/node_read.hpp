#pragma once
/// @file Reading scattered byte ranges of one file on many ranks with one sequential stream per
/// node — the two-phase idea of collective MPI-IO (ROMIO's aggregators), with the node's first
/// rank as the aggregator. Every rank lists the byte ranges it wants; the node's first rank
/// gathers the node's lists and plans requests of up to 8 MiB over their union, front to back
/// (ranges less than 1 MiB apart are one request). The disk then sees one large sequential read
/// per node whatever the layout, as `dd` does, instead of one interleaved stream of row-sized
/// requests per rank; ranks that want the same bytes (DDP, ZeRO-1/2) share one read.
///
/// Two transfers from the disk to the ranks:
///  - mapped (the default): every rank of the node maps the file (MAP_SHARED, read-only). A
///    thread of the reading rank brings each request into the page cache through its mapping
///    (MADV_POPULATE_READ: the kernel's readahead streams the file, and nothing is copied), up to
///    8 requests ahead; the reading rank sends each rank that wants bytes of it one byte saying the
///    request is in, then hashes the request where it lies (the observer) and copies its own bytes
///    into place, while each other rank copies its bytes out of its own mapping. Each byte is copied once,
///    by the rank that wants it, in parallel. Chosen only when every rank of the node could map
///    the file and the kernel has MADV_POPULATE_READ (Linux 5.14).
///  - sent (the fallback): one reader thread issues plain sequential preads, as dd does, up to 8
///    requests ahead, each request one preadv that lands the reader's own bytes in place and the
///    rest in a ring slot; the reader sends each other rank its bytes from where they landed, in
///    offset order (a piece of 64 KiB or more in a message of its own, received straight into
///    its destination; the smaller ones of a request packed into one message).
/// Measured on a 2-core VM with a 428 MB checkpoint at 1-4 ranks (doc/performance.md, perf/
/// ckpt_bench, paired medians): the mapped transfer loads at 0.95-1.09x dd, the sent one at
/// 0.87-0.96x, since the sent one copies the other ranks' bytes twice (page cache to ring, ring to
/// destination).
///
/// In both, another thread of the reading rank maps the destination pages ahead of the copies,
/// and each receiving rank maps its own, so no copy stops at first-touch page faults. The work
/// goes in windows of the file (256 MiB), so the reader's bookkeeping is bounded by the window;
/// each window is planned while the one before it is read, and the reading runs on from one
/// window into the next. The destinations themselves are the caller's (load_checkpoint reads into
/// the tensors on host-memory devices, and stages a GPU rank's whole share in host memory before
/// uploading it).
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshtrain {

/// `bytes` bytes of the file at `offset`, to be copied to `dst`.
struct FileExtent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  char* dst = nullptr;
};

/// Called on a node's reading rank with each request's bytes, in increasing file order, every
/// file byte at most once (`offset` is where `data` starts in the file; `n` bytes).
using ChunkObserver = std::function<void(uint64_t offset, const char* data, uint64_t n)>;

/// The node-aggregated reader over `world`.
class NodeReader {
 public:
  /// File bytes the reading rank plans at a time (256 MiB): bounds its bookkeeping (the node's
  /// extent lists of one window, two while the next window is read ahead).
  static constexpr uint64_t kDefaultWindow = uint64_t(256) << 20;

  /// Splits `world` by shared-memory node (MPI_COMM_TYPE_SHARED); `window_bytes` (> 0, the same
  /// on every rank) is the planning window (tests make it small to cross many windows).
  /// Collective over `world`. @throws std::invalid_argument when `window_bytes` is 0.
  /// How the bytes reach the node's other ranks. kMapped: the reader brings each request into the
  /// page cache through a mapping of the file and hashes it there; every rank copies its own bytes
  /// out of its own mapping once told the request is in (falls back to kSent where a rank cannot
  /// map the file or the kernel lacks MADV_POPULATE_READ). kSent: the reader reads them into a
  /// ring and sends them.
  enum class Transfer { kMapped, kSent };
  explicit NodeReader(MPI_Comm world, uint64_t window_bytes = kDefaultWindow, Transfer transfer = Transfer::kMapped);
  ~NodeReader();
  NodeReader(const NodeReader&) = delete;
  NodeReader& operator=(const NodeReader&) = delete;

  /// Whether this rank reads the file for its node (the node's first rank).
  bool reader() const { return node_rank_ == 0; }

  /// Copies every extent of `mine` (any order; extents of one rank must not overlap) from `path`
  /// (`file_size` bytes, the same on every rank). Collective over `world`: every rank calls it,
  /// with its own extents (possibly none). On the reading rank `observe`, when set, sees every
  /// byte read. Returns the bytes this rank read from disk (0 on the others).
  /// @throws CheckpointError naming `path` on the reading rank (cannot open, short read); the
  /// other ranks of its node then receive nothing and must learn of it by the caller's agreement —
  /// so a failure is turned into an error string here, and the read goes on collectively with
  /// zero-filled bytes until the end, when the first error is thrown on the reading rank.
  uint64_t read(const std::string& path, uint64_t file_size, std::vector<FileExtent> mine,
                const ChunkObserver& observe = nullptr);

 private:
  MPI_Comm node_ = MPI_COMM_NULL;
  int node_rank_ = 0, node_size_ = 1;
  uint64_t window_ = kDefaultWindow;
  Transfer transfer_ = Transfer::kMapped;
};

}  // namespace meshtrain
