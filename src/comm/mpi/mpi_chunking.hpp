#pragma once
/// @file Chunking of MPI transfers whose element count does not fit MPI's `int` count.
///
/// MPI-3.1 counts are C `int` and Debian 12's Open MPI 4.1 has none of MPI-4's large-count `_c`
/// calls, so a tensor of 2^31 or more elements cannot be named in one call. MpiCommunicator
/// therefore issues every transfer as an ordered series of calls, each of at most
/// mpi_max_count() elements, planned by the pure functions below (unit-tested with counts such
/// as 2^31 + 5 without allocating them). The limit is process-wide and must be the same on
/// every rank, since both sides of a transfer chunk it independently.
///
/// The default limit is the largest multiple of kMpiChunkAlign elements not above INT_MAX, so
/// every chunk of a tensor starts a whole number of 4 KiB pages (at 1 byte per element, more at
/// 2 or 4) after its first element: chunk boundaries keep the alignment of the tensor for the
/// transport's page registration and for the SIMD loops of the reductions.
///
/// What covers the other MPI paths:
///  - host scalars (Communicator::all_reduce_host) take an `int` count and go through the same
///    plan;
///  - StagedCommunicator keeps int64 counts and size_t bytes on the host side and hands the
///    transfer itself to MpiCommunicator;
///  - MPI-IO happens only inside parallel HDF5 (checkpoint/sharded_checkpoint.cpp writes and
///    reads hyperslabs with H5Dwrite / H5Dread). Since HDF5 1.10.2 its MPI-IO driver transfers
///    more than 2 GB in one H5Dwrite / H5Dread itself (HDF5 1.10.2 release notes: "MPI I/O
///    transfers now allow reading or writing of more than 2GB of data in a single I/O
///    operation"; Debian 12 ships 1.10.8), and Open MPI fixed the matching size_t → int
///    truncations of its ompio component in the 4.0 series (open-mpi/ompi issue 7045; Debian 12
///    ships 4.1.4), so hyperslabs need no chunking here;
///  - the remaining direct MPI calls of meshtrain move a few ints, strings or records whose
///    count is bounded by the rank or shard count; those that could in principle grow convert
///    with checked_int_count, which throws instead of truncating.
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

/// One call of a chunked transfer: `count` elements starting `offset` elements into the buffer
/// (or into each rank's block, for collectives with per-rank blocks).
struct MpiChunk {
  int64_t offset = 0;
  int count = 0;
};

/// Alignment (elements) of the default limit and of the per-rank limit derived from it.
inline constexpr int64_t kMpiChunkAlign = 4096;
/// The default mpi_max_count(): the largest multiple of kMpiChunkAlign ≤ INT_MAX (2147479552).
inline constexpr int64_t kMpiDefaultMaxCount = int64_t(INT_MAX) / kMpiChunkAlign * kMpiChunkAlign;

/// Splits a transfer of `n` elements into consecutive chunks of `max_count` elements and a
/// shorter last one, in order. n = 0 gives one empty chunk, so an empty transfer is still one
/// MPI call (every rank still takes part in the collective, a receive still matches its send).
/// @throws std::invalid_argument when n < 0 or max_count is outside [1, INT_MAX].
std::vector<MpiChunk> plan_mpi_chunks(int64_t n, int64_t max_count);

/// The per-rank chunk limit of a collective with per-rank blocks (reduce-scatter, all-gather,
/// all-to-all) over `ranks` ranks: one call of those moves `ranks` blocks, and Open MPI's
/// non-blocking implementations count the whole (ranks × block) in one int (libnbc's
/// reduce_scatter_block computes `count = p * recvcount`), so the block limit is
/// max_count / ranks, rounded down to a multiple of kMpiChunkAlign when at least that, and never
/// below 1 element.
/// @throws std::invalid_argument when ranks < 1 or max_count is outside [1, INT_MAX].
int64_t per_rank_max_count(int64_t max_count, int ranks);

/// The process-wide chunk limit (elements per MPI call) in force: kMpiDefaultMaxCount unless a
/// test lowered it. Throws nothing.
int64_t mpi_max_count();

/// Sets the process-wide chunk limit (elements per MPI call) of every transfer issued from now
/// on, so that tests exercise the chunked paths on small tensors; every rank must set the same
/// value at the same point of the program. Restore with kMpiDefaultMaxCount.
/// @throws std::invalid_argument when max_count is outside [1, INT_MAX].
void set_mpi_max_count_for_testing(int64_t max_count);

/// `n` as an MPI `int` count. For counts that are bounded in practice (records per shard,
/// message lengths) where chunking would be overkill: a count past INT_MAX is an error, never a
/// silent truncation.
/// @throws CommError "<what>: N elements exceed the MPI int count limit (2147483647)" when
/// n > INT_MAX; std::invalid_argument when n < 0.
int checked_int_count(int64_t n, const std::string& what);

}  // namespace meshtrain
