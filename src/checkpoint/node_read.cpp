#include "checkpoint/node_read.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

constexpr uint64_t kRequest = uint64_t(8) << 20;   // one pread at most
constexpr uint64_t kGap = uint64_t(1) << 20;       // read across a hole this small rather than seek
constexpr uint64_t kOwnMessage = uint64_t(64) << 10;  // a piece this large travels alone, into place
constexpr int kTag = 0x4d54;
constexpr size_t kReaders = 1;                     // preads in flight (see RingReader::run)
constexpr size_t kDepth = 8;                       // requests read ahead of the one being sent
constexpr size_t kSendLag = 4;                     // requests whose sends may still be in flight

struct Op {
  uint64_t begin, end;
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

// Maps the pages of [addr, addr + bytes) writable without writing them (MADV_POPULATE_WRITE), so
// that the read landing there later does not stop at each page's first-touch fault. A restart's
// tensors are fresh allocations (their random initialisation is skipped when a checkpoint is
// loaded), and a read into untouched memory ran at a quarter of the speed of one into touched
// memory here (page cache warm, 428 MB: 0.23 s against 0.06 s): the kernel zeroes and maps each
// page inside the copy. Done on another thread ahead of the read, that work leaves the disk's
// critical path. Only an optimization: a kernel without it (EINVAL) faults in the read as before.
// The range is widened to whole pages, which lie inside the allocation's own mapping.
void prefault(const char* addr, uint64_t bytes) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = uintptr_t(addr) & ~(page - 1), hi = (uintptr_t(addr) + bytes + page - 1) & ~(page - 1);
  if (bytes > 0) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
}

// Drops this process's page-table entries for the whole pages inside [begin, end) of the file's
// mapping once a request is used (the page cache keeps the pages): a mapping left populated would
// hold 2 MB of page tables per GB of checkpoint on every rank. Pages shared with a neighbouring
// request stay mapped; touching a dropped page again only maps it again.
void unmap_used(const char* map, uint64_t begin, uint64_t end) {
  static const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t lo = (begin + page - 1) & ~(page - 1), hi = end & ~(page - 1);
  if (hi > lo) ::madvise(const_cast<char*>(map) + lo, hi - lo, MADV_DONTNEED);
}

// One piece of a request, in file order: `bytes` bytes landing at `addr` — in the reading rank's
// own destination where it wants them, else in the request's ring slot.
struct Segment {
  uint64_t offset;  // in the file
  char* addr;
  uint64_t bytes;
};

// Reads requests on kReaders threads of its own into where their segments say (one preadv per
// request: the reading rank's bytes land in place, the rest in a ring of kDepth slots) or, in the
// mapped transfer, into the page cache through the file's mapping, so the disk works on the next
// requests while the caller hashes and sends (or copies) the current one; one more thread maps
// the requests' destination pages ahead of the copies (populate). Requests are added
// window by window (add), numbered on across windows, so the reading runs on from one window into
// the next while the caller finishes the first. A failed read zero-fills what it did not read and
// records the first error (the caller reports it after the collective protocol completes).
class RingReader {
 public:
  /// `map`, when set, is the whole file mapped (MAP_SHARED): requests are then brought into the
  /// page cache through it (MADV_POPULATE_READ) rather than read, and their segments are only the
  /// destinations to map ahead; the caller copies out of the mapping.
  RingReader(int fd, std::vector<std::unique_ptr<char[]>>& slots, const std::string& path, const char* map = nullptr)
      : fd_(fd), map_(map), slots_(slots), path_(path) {
    for (size_t t = 0; t < kReaders; ++t) threads_.emplace_back([this, t] { run(t); });
    threads_.emplace_back([this] { populate(); });
  }
  ~RingReader() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  /// Request k's ring slot (kRequest bytes; valid until release(k)).
  static char* slot(std::vector<std::unique_ptr<char[]>>& slots, size_t k) { return slots[k % slots.size()].get(); }
  /// The number of requests added so far: the next add's first request is numbered so.
  size_t added() const { return ops_.size(); }
  /// Appends requests `ops` (numbered from added() on) with their segments: `segments[j]` covers
  /// ops[j] in file order; a segment inside the slot of request k = added() + j must lie at its
  /// offset in the request (slot(k) + file offset − ops[j].begin). Only the caller's thread adds.
  void add(const std::vector<Op>& ops, std::vector<std::vector<Segment>>&& segments) {
    {
      std::lock_guard<std::mutex> g(m_);
      for (size_t j = 0; j < ops.size(); ++j) {
        ops_.push_back(ops[j]);
        segments_.push_back(std::move(segments[j]));
        done_.push_back(0);
      }
    }
    cv_.notify_all();
  }
  /// Request k's segments (stable until the reader is destroyed; read on the caller's thread).
  const std::vector<Segment>& segments(size_t k) const { return segments_[k]; }
  /// Waits until request k is in memory; its slot stays valid until release(k).
  void wait(size_t k) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return done_[k] != 0; });
  }
  void release(size_t k) {
    {
      std::lock_guard<std::mutex> g(m_);
      released_ = k + 1;
    }
    cv_.notify_all();
  }
  const std::string& error() const { return error_; }
  /// Whether request k failed (mapped mode: its pages must not be touched). After wait(k).
  bool failed(size_t k) {
    std::lock_guard<std::mutex> g(m_);
    return done_[k] == 2;
  }

 private:
  // Mapped mode: faults request k's file pages into the page cache (and this mapping) without
  // copying them; the kernel's readahead for the sequential mapping keeps the disk streaming.
  // Returns false (error recorded) when they cannot be read — then nobody may touch them (a page
  // past the end of a file that shrank would raise SIGBUS).
  bool populate_mapped(const Op& op) {
    static const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
    const uint64_t lo = op.begin & ~(page - 1);
    if (::madvise(const_cast<char*>(map_) + lo, op.end - lo, MADV_POPULATE_READ) == 0) return true;
    const std::string what = errno == EFAULT ? std::string("unexpected end of file (truncated?)") : std::strerror(errno);
    std::lock_guard<std::mutex> g(m_);
    if (error_.empty()) error_ = path_ + ": " + what;
    return false;
  }

  // Reader t takes requests t, t + kReaders, ... One reader issuing plain sequential preads is
  // what the kernel's readahead serves best: measured on this project's VM disk (cold cache, 428 MB,
  // six alternated rounds), two threads alternating 8 MiB requests read at 1.0-1.1 GB/s, one thread
  // announcing the next requests with POSIX_FADV_WILLNEED at 1.0-1.2 GB/s, and one thread without
  // hints at 1.2-1.7 GB/s, as dd does (both tried before; they broke the readahead's sequential
  // detection, or made the reader submit the readahead synchronously).
  void run(size_t t) {
    std::vector<iovec> iov;
    for (size_t k = t;; k += kReaders) {
      uint64_t off = 0;
      Op op{0, 0};
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || (k < ops_.size() && k < released_ + slots_.size()); });
        if (stop_) return;
        iov.clear();  // copied under the lock: add() may be growing the deques meanwhile
        for (const Segment& sg : segments_[k]) iov.push_back({sg.addr, size_t(sg.bytes)});
        off = ops_[k].begin;
        op = ops_[k];
      }
      if (map_) {
        const bool ok = populate_mapped(op);
        {
          std::lock_guard<std::mutex> g(m_);
          done_[k] = ok ? 1 : 2;
        }
        cv_.notify_all();
        continue;
      }
      size_t first = 0;  // the first iovec not wholly read
      while (first < iov.size() && fd_ >= 0) {
        const int n = int(std::min<size_t>(iov.size() - first, IOV_MAX));
        const ssize_t r = ::preadv(fd_, iov.data() + first, n, off_t(off));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          const std::string what = r == 0 ? std::string("unexpected end of file (truncated?)") : std::strerror(errno);
          std::lock_guard<std::mutex> g(m_);
          if (error_.empty()) error_ = path_ + ": " + what;
          break;
        }
        off += uint64_t(r);
        for (uint64_t left = uint64_t(r); left > 0 && first < iov.size();) {
          const uint64_t take = std::min<uint64_t>(left, iov[first].iov_len);
          iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
          iov[first].iov_len -= take;
          left -= take;
          if (iov[first].iov_len == 0) ++first;
        }
      }
      // What was not read (the open or a read failed, reported): zeros, to keep the protocol going.
      for (size_t i = first; i < iov.size(); ++i) std::memset(iov[i].iov_base, 0, iov[i].iov_len);
      {
        std::lock_guard<std::mutex> g(m_);
        done_[k] = 1;
      }
      cv_.notify_all();
    }
  }

  // Maps every request's destinations (the caller's tensors, the ring slots' first use) in request
  // order, ahead of the reading thread (see prefault).
  void populate() {
    std::vector<Segment> segs;
    for (size_t k = 0;; ++k) {
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || k < ops_.size(); });
        if (stop_) return;
        if (!map_ && done_[k]) continue;  // the read got there first (mapped: the copy comes later)
        segs = segments_[k];
      }
      for (const Segment& sg : segs) prefault(sg.addr, sg.bytes);
    }
  }

  int fd_;
  const char* map_;
  std::vector<std::unique_ptr<char[]>>& slots_;
  std::string path_, error_;
  std::mutex m_;
  std::condition_variable cv_;
  // Every request added so far (deques: add() appends without moving the elements the caller
  // reads through segments(k)).
  std::deque<Op> ops_;
  std::deque<std::vector<Segment>> segments_;
  std::deque<char> done_;  // per request: 1 in memory, 2 failed (mapped mode)
  size_t released_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// The requests covering the union of `wanted` [begin, end) ranges: merged across holes smaller
// than kGap, cut into pieces of at most kRequest bytes.
std::vector<Op> plan_requests(std::vector<Op> wanted) {
  std::sort(wanted.begin(), wanted.end(), [](const Op& a, const Op& b) { return a.begin < b.begin; });
  std::vector<Op> merged;
  for (const Op& w : wanted) {
    if (!merged.empty() && w.begin <= merged.back().end + kGap) merged.back().end = std::max(merged.back().end, w.end);
    else merged.push_back(w);
  }
  std::vector<Op> ops;
  for (const Op& m : merged)
    for (uint64_t b = m.begin; b < m.end; b += kRequest) ops.push_back({b, std::min(m.end, b + kRequest)});
  return ops;
}

// Walks one rank's sorted extents alongside the requests: `emit(extent, file_from, n)` for each
// overlap of the extents with [begin, end), in order.
struct ExtentCursor {
  const std::vector<FileExtent>* list = nullptr;
  size_t i = 0;
  template <class Emit>
  void take(uint64_t begin, uint64_t end, Emit emit) {
    while (i < list->size()) {
      const FileExtent& e = (*list)[i];
      if (e.offset >= end) return;
      const uint64_t s = std::max(e.offset, begin), t = std::min(e.offset + e.bytes, end);
      if (t > s) emit(e, s, t - s);
      if (e.offset + e.bytes > end) return;
      ++i;
    }
  }
};

// A run of bytes in memory.
struct Block {
  char* addr;
  uint64_t bytes;
};

// The bytes of `blocks`, back to back.
uint64_t total_bytes(const std::vector<Block>& blocks) {
  uint64_t n = 0;
  for (const Block& b : blocks) n += b.bytes;
  return n;
}

// Waits for `req` testing every 50 µs rather than spinning in MPI_Wait: a receiving rank has
// nothing else to do, and on a node with more ranks than cores (or a reader thread beside them)
// a spinning receiver takes the core the reader needs. Messages are megabytes, so the delay is
// negligible.
void wait_politely(std::vector<MPI_Request>& reqs) {
  for (int done = 0;;) {
    MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

NodeReader::NodeReader(MPI_Comm world, uint64_t window_bytes, Transfer transfer)
    : window_(window_bytes), transfer_(transfer) {
  if (window_bytes == 0) throw std::invalid_argument("NodeReader: a window of 0 bytes");
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_);
  MPI_Comm_rank(node_, &node_rank_);
  MPI_Comm_size(node_, &node_size_);
}

NodeReader::~NodeReader() {
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

uint64_t NodeReader::read(const std::string& path, uint64_t file_size, std::vector<FileExtent> mine,
                          const ChunkObserver& observe) {
  std::erase_if(mine, [](const FileExtent& e) { return e.bytes == 0; });
  std::sort(mine.begin(), mine.end(), [](const FileExtent& a, const FileExtent& b) { return a.offset < b.offset; });
  int fd = -1;
  std::string error;
  if (reader()) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) error = path + ": cannot open: " + std::strerror(errno);
    else ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  const size_t nodes = static_cast<size_t>(node_size_);
  // Mapped transfer when every rank of the node can map the file and populate the mapping (Linux
  // 5.14+); else the reader reads and sends the bytes.
  const char* map = nullptr;
  if (transfer_ == Transfer::kMapped && file_size > 0) {
    int ok = 0;
    const int mfd = reader() ? fd : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (mfd >= 0) {
      void* m = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, mfd, 0);
      if (m != MAP_FAILED) {
        // The first page proves MADV_POPULATE_READ works here (EINVAL on older kernels).
        if (::madvise(m, std::min<uint64_t>(file_size, 1), MADV_POPULATE_READ) == 0) {
          map = static_cast<const char*>(m);
          ::madvise(m, file_size, MADV_SEQUENTIAL);
          ok = 1;
        } else {
          ::munmap(m, file_size);
        }
      }
      if (!reader()) ::close(mfd);
    }
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, node_);
    if (!ok && map) ::munmap(const_cast<char*>(map), file_size), map = nullptr;
  }
  // One window of the file, planned: the requests over the node's extents in it, this rank's
  // extents clipped to it and, on the reading rank, every node rank's.
  struct Window {
    std::vector<Op> ops;
    std::vector<FileExtent> clip;
    std::vector<std::vector<FileExtent>> lists;
  };
  size_t next = 0;  // first extent of `mine` not wholly before the window being planned
  // Collective over the node: every rank plans the windows in the same order.
  auto plan_window = [&](uint64_t lo) {
    Window w;
    const uint64_t hi = std::min(file_size, lo + window_);
    while (next < mine.size() && mine[next].offset + mine[next].bytes <= lo) ++next;
    for (size_t i = next; i < mine.size() && mine[i].offset < hi; ++i) {
      const FileExtent& e = mine[i];
      const uint64_t s = std::max(e.offset, lo), t = std::min(e.offset + e.bytes, hi);
      w.clip.push_back({s, t - s, e.dst + (s - e.offset)});
    }
    std::vector<uint64_t> pairs;
    for (const FileExtent& e : w.clip) pairs.push_back(e.offset), pairs.push_back(e.bytes);
    int count = int(pairs.size());
    std::vector<int> counts(nodes), displs(nodes);
    MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, node_);
    std::vector<uint64_t> all;
    if (reader()) {
      for (int r = 0, d = 0; r < node_size_; ++r) displs[size_t(r)] = d, d += counts[size_t(r)];
      all.resize(size_t(displs.back() + counts.back()));
    }
    MPI_Gatherv(pairs.data(), count, MPI_UINT64_T, all.data(), counts.data(), displs.data(), MPI_UINT64_T, 0, node_);
    // The reading rank plans the requests over the union of the node's extents and tells the
    // node, so that every rank knows which of its bytes each request's message carries and can
    // receive them straight into place.
    if (reader()) {
      w.lists.resize(nodes);
      std::vector<Op> wanted;
      for (size_t r = 0; r < nodes; ++r)
        for (int j = displs[r]; j < displs[r] + counts[r]; j += 2) {
          const uint64_t off = all[size_t(j)], n = all[size_t(j) + 1];
          w.lists[r].push_back({off, n, r == 0 ? w.clip[w.lists[0].size()].dst : nullptr});
          wanted.push_back({off, off + n});
        }
      w.ops = plan_requests(std::move(wanted));
    }
    uint64_t n_ops = w.ops.size();
    MPI_Bcast(&n_ops, 1, MPI_UINT64_T, 0, node_);
    w.ops.resize(size_t(n_ops));
    static_assert(sizeof(Op) == 2 * sizeof(uint64_t));
    MPI_Bcast(w.ops.data(), int(2 * n_ops), MPI_UINT64_T, 0, node_);
    return w;
  };
  // Where each request's bytes land: this rank's own wanted bytes straight in its destinations
  // (one preadv per request: no copy afterwards, which had cost as much CPU as the hashing), the
  // rest in the request's ring slot. Other ranks' messages are sent from wherever their bytes
  // landed; a slot is released once its request's sends complete, so sending overlaps the next
  // requests' hashing and the disk's reads.
  std::vector<std::unique_ptr<char[]>> slots;  // the reading rank's ring (kDepth requests)
  std::unique_ptr<RingReader> ring;
  if (reader()) {
    for (size_t i = 0; i < kDepth; ++i) slots.emplace_back(new char[kRequest]);  // untouched until used
    ring = std::make_unique<RingReader>(fd, slots, path, map);
  }
  auto hand_to_ring = [&](const Window& w) {
    const size_t first = ring->added();
    std::vector<std::vector<Segment>> segments(w.ops.size());
    ExtentCursor own{&w.lists[0]};
    for (size_t j = 0; j < w.ops.size(); ++j) {
      const Op& op = w.ops[j];
      char* slot = RingReader::slot(slots, first + j);
      uint64_t at = op.begin;
      auto gap_to = [&](uint64_t to) {
        if (to > at) segments[j].push_back({at, slot + (at - op.begin), to - at});
        at = std::max(at, to);
      };
      own.take(op.begin, op.end, [&](const FileExtent& e, uint64_t from, uint64_t n) {
        if (!map) gap_to(from);
        segments[j].push_back({from, e.dst + (from - e.offset), n});
        at = from + n;
      });
      if (!map) gap_to(op.end);
    }
    ring->add(w.ops, std::move(segments));
    return first;
  };
  uint64_t disk_bytes = 0;
  // Each window is planned one ahead of the one being read, so the reading thread goes on into the
  // next window while this one's last requests are hashed and sent (the ring's order is the file's).
  Window cur = plan_window(0);
  size_t cur_first = reader() ? hand_to_ring(cur) : 0;
  for (uint64_t lo = 0; lo < file_size; lo += window_) {
    Window ahead;
    size_t ahead_first = 0;
    if (lo + window_ < file_size) {
      ahead = plan_window(lo + window_);
      if (reader()) ahead_first = hand_to_ring(ahead);
    }
    const std::vector<Op>& ops = cur.ops;
    if (!reader()) {
      ExtentCursor cur_ext{&cur.clip}, ahead_ext{&cur.clip};
      std::vector<char> staging;
      std::vector<Block> small;
      std::vector<MPI_Request> reqs;
      size_t populated = 0;  // requests whose destinations are mapped (prefault)
      for (size_t k = 0; k < ops.size(); ++k) {
        const Op& op = ops[k];
        if (map) {  // the reader says when the request is in the page cache; this rank copies its bytes
          struct Piece {
            char* dst;
            uint64_t from, n;
          };
          std::vector<Piece> pieces;
          cur_ext.take(op.begin, op.end, [&](const FileExtent& e, uint64_t from, uint64_t n) {
            pieces.push_back({e.dst + (from - e.offset), from, n});
          });
          if (pieces.empty()) continue;
          char in_cache = 0;
          reqs.assign(1, MPI_REQUEST_NULL);
          MPI_Irecv(&in_cache, 1, MPI_CHAR, 0, kTag, node_, &reqs[0]);
          for (; populated < std::min(ops.size(), k + 2); ++populated)
            ahead_ext.take(ops[populated].begin, ops[populated].end,
                           [](const FileExtent& e, uint64_t from, uint64_t n) { prefault(e.dst + (from - e.offset), n); });
          wait_politely(reqs);
          for (const Piece& pc : pieces)
            if (in_cache) std::memcpy(pc.dst, map + pc.from, pc.n);
            else std::memset(pc.dst, 0, pc.n);  // the read failed: the reader reports it
          if (in_cache) unmap_used(map, op.begin, op.end);
          continue;
        }
        // This rank's pieces of the request, as the reader sends them: a large piece arrives
        // alone straight into its tensor (one copy, CMA, where packing cost two more), the small
        // ones together in one message, unpacked here. A contiguous buffer per message lets the
        // transport copy once, where a derived datatype would go through its fragment pipeline.
        small.clear();
        reqs.clear();
        cur_ext.take(op.begin, op.end, [&](const FileExtent& e, uint64_t from, uint64_t n) {
          char* dst = e.dst + (from - e.offset);
          if (n >= kOwnMessage) {
            reqs.emplace_back();
            MPI_Irecv(dst, int(n), MPI_BYTE, 0, kTag, node_, &reqs.back());
          } else {
            small.push_back({dst, n});
          }
        });
        if (!small.empty()) {
          staging.resize(total_bytes(small));
          reqs.emplace_back();
          MPI_Irecv(staging.data(), int(staging.size()), MPI_BYTE, 0, kTag, node_, &reqs.back());
        }
        if (reqs.empty()) continue;
        // While this request's bytes travel, map the next requests' destinations (a fresh
        // tensor's first touch would otherwise happen inside the transport's copy).
        for (; populated < std::min(ops.size(), k + 2); ++populated)
          ahead_ext.take(ops[populated].begin, ops[populated].end,
                         [](const FileExtent& e, uint64_t from, uint64_t n) { prefault(e.dst + (from - e.offset), n); });
        wait_politely(reqs);
        for (size_t b = 0, at = 0; b < small.size(); at += small[b].bytes, ++b)
          std::memcpy(small[b].addr, staging.data() + at, small[b].bytes);
      }
    } else {
      std::vector<ExtentCursor> cursors(nodes);
      for (size_t r = 0; r < nodes; ++r) cursors[r].list = &cur.lists[r];
      // The pieces of [from, from + n) as they landed (`segs` covers a request in file order).
      auto landed = [](const std::vector<Segment>& segs, uint64_t from, uint64_t n, std::vector<Block>& out) {
        auto it = std::upper_bound(segs.begin(), segs.end(), from,
                                   [](uint64_t o, const Segment& sg) { return o < sg.offset; });
        for (--it; n > 0; ++it) {
          const uint64_t skip = from - it->offset, take = std::min(n, it->bytes - skip);
          if (!out.empty() && out.back().addr + out.back().bytes == it->addr + skip) out.back().bytes += take;
          else out.push_back({it->addr + skip, take});
          from += take, n -= take;
        }
      };
      // Request k's sends stay in flight while the next ones are read and sent, up to kSendLag
      // requests behind (a receiver sharing a core with the reader's threads copies late at
      // times; waiting for it at once would stall the reader). Its slot is released, and its
      // packed messages (packed[k % kDepth]) freed, once they complete.
      std::vector<std::vector<std::vector<std::vector<char>>>> packed(kDepth, std::vector<std::vector<std::vector<char>>>(nodes));
      std::deque<std::pair<size_t, std::vector<MPI_Request>>> in_flight;
      std::vector<MPI_Request> sending;
      auto retire = [&](bool all) {
        while (!in_flight.empty()) {
          std::vector<MPI_Request>& reqs = in_flight.front().second;
          if (all || in_flight.size() > kSendLag) {
            MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
          } else {
            int done = 0;
            MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
            if (!done) return;
          }
          ring->release(in_flight.front().first);
          in_flight.pop_front();
        }
      };
      for (size_t k = 0; k < ops.size(); ++k) {
        const size_t g = cur_first + k;  // the request's number in the ring
        ring->wait(g);
        const Op& op = ops[k];
        const std::vector<Segment>& segs = ring->segments(g);
        disk_bytes += op.end - op.begin;
        if (map) {  // tell the others the request is in, then hash it in place and copy this rank's bytes
          static const char kInCache[2] = {0, 1};
          const bool ok = !ring->failed(g);
          for (size_t r = 1; r < nodes; ++r) {
            bool wants = false;
            cursors[r].take(op.begin, op.end, [&](const FileExtent&, uint64_t, uint64_t) { wants = true; });
            if (!wants) continue;
            sending.emplace_back();
            MPI_Isend(&kInCache[ok ? 1 : 0], 1, MPI_CHAR, int(r), kTag, node_, &sending.back());
          }
          // This thread copies the reading rank's own bytes: on the reading thread, between its
          // populates, the copies held the disk back (cold 1-rank loads 1.03-1.08x dd -> 0.87-0.93x),
          // though with the page cache warm they are faster there (0.11 -> 0.09 s).
          if (ok && observe) observe(op.begin, map + op.begin, op.end - op.begin);
          for (const Segment& sg : segs)
            if (ok) std::memcpy(sg.addr, map + sg.offset, sg.bytes);
            else std::memset(sg.addr, 0, sg.bytes);  // the failed read is reported at the end
          if (ok) unmap_used(map, op.begin, op.end);
          in_flight.emplace_back(g, std::move(sending));
          sending.clear();
          retire(false);
          continue;
        }
        if (observe)
          for (const Segment& sg : segs) observe(sg.offset, sg.addr, sg.bytes);
        for (size_t r = 1; r < nodes; ++r) {
          // As the receiver expects them: each large piece in a message of its own, sent from
          // where it landed (packed only when it landed in several places), then the small ones
          // packed.
          std::vector<std::vector<char>>& bufs = packed[g % kDepth][r];
          bufs.clear();
          std::vector<Block> small;
          auto send = [&](const std::vector<Block>& blocks) {
            const char* from = blocks[0].addr;
            if (blocks.size() > 1) {
              std::vector<char>& out = bufs.emplace_back(total_bytes(blocks));
              for (size_t b = 0, at = 0; b < blocks.size(); at += blocks[b].bytes, ++b)
                std::memcpy(out.data() + at, blocks[b].addr, blocks[b].bytes);
              from = out.data();
            }
            sending.emplace_back();
            MPI_Isend(from, int(total_bytes(blocks)), MPI_BYTE, int(r), kTag, node_, &sending.back());
          };
          cursors[r].take(op.begin, op.end, [&](const FileExtent&, uint64_t from, uint64_t n) {
            if (n < kOwnMessage) return landed(segs, from, n, small);
            std::vector<Block> piece;
            landed(segs, from, n, piece);
            send(piece);
          });
          if (!small.empty()) send(small);
        }
        in_flight.emplace_back(g, std::move(sending));
        sending.clear();
        retire(false);
      }
      retire(true);
    }
    cur = std::move(ahead);
    cur_first = ahead_first;
  }
  if (ring) {
    if (error.empty()) error = ring->error();  // every request was waited for: final
    ring.reset();  // joins its threads
  }
  if (map) ::munmap(const_cast<char*>(map), file_size);
  if (fd >= 0) ::close(fd);
  if (!error.empty()) throw CheckpointError(error);
  return disk_bytes;
}

}  // namespace meshtrain
