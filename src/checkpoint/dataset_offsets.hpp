#pragma once
/// @file `/dataset_offsets`: where every dataset of a checkpoint lies in the file, written once at
/// save time, so that a load plans its reads without opening each dataset. Every dataset of a
/// meshtrain checkpoint is contiguous (parallel HDF5 allocates it at creation), so a hyperslab is
/// a few byte runs at known offsets; finding those offsets through HDF5 means opening the
/// dataset — an object-header read per dataset, scattered through the file, on every rank. For
/// the 428 MB benchmark checkpoint (225 datasets) that was 11–18 ms of a 0.25–0.3 s cold load
/// before the first byte of data was read; the table is one small read.
///
/// Format: a uint8 text dataset, one line per dataset, `name<TAB>offset<TAB>dims` (offset in bytes
/// from the start of the file, dims comma-separated), with attribute `xxh3_64` = the XXH3-64 of
/// the text as 16 hex digits. A file without it (written before it existed) is read as before,
/// through HDF5; a dataset missing from it likewise.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshtrain {

/// A contiguous dataset's place: its first byte's file offset (bytes) and its dims.
struct DatasetPlace {
  uint64_t offset = 0;
  std::vector<hsize_t> dims;
};

/// Creates `/dataset_offsets` in `file` and (on `rank` 0 only) writes the places of `datasets`
/// (name, open dataset id; the same list on every rank). Collective over the file's
/// communicator: every rank calls it with the same list. A dataset without an allocated
/// contiguous address (H5Dget_offset undefined) is left out, and loads find it through HDF5.
/// Returns "" or, on rank 0, "path: cannot write dataset /dataset_offsets" (the caller agrees on
/// errors collectively). @throws CheckpointError naming `path` when the dataset cannot be created
/// (collective: every rank throws alike).
std::string write_dataset_offsets(hid_t file, const std::vector<std::pair<std::string, hid_t>>& datasets, int rank,
                                  const std::string& path);

/// The places `/dataset_offsets` lists, by dataset name; empty when `file` has no such dataset.
/// @throws CheckpointError naming `path` when the table is unreadable, malformed, or fails its
/// XXH3 checksum (a damaged table must not steer reads to the wrong bytes).
std::unordered_map<std::string, DatasetPlace> read_dataset_offsets(hid_t file, const std::string& path);

}  // namespace meshtrain
