#pragma once
/// @file Small HDF5 helpers shared by model dumps and sharded checkpoints: an owning handle and
/// scalar / string attributes. Errors are CheckpointError naming the file.
#include <hdf5.h>

#include <cstdint>
#include <string>

namespace meshtrain::h5 {

/// Closes an HDF5 id with the matching close function (H5Fclose, H5Dclose, ...) on scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id(o.id), close(o.close) { o.id = -1; }
  ~Handle() {
    if (id >= 0) close(id);
  }
};

/// @throws CheckpointError("path: what").
[[noreturn]] void fail(const std::string& path, const std::string& what);

/// Scalar int64 / double and variable-length string attributes on `loc`.
void write_attr(hid_t loc, const char* name, int64_t value, const std::string& path);
void write_attr(hid_t loc, const char* name, double value, const std::string& path);
void write_attr(hid_t loc, const char* name, const std::string& value, const std::string& path);
/// @throws CheckpointError when the attribute is missing or of another type.
int64_t read_int_attr(hid_t loc, const char* name, const std::string& path);
double read_double_attr(hid_t loc, const char* name, const std::string& path);
std::string read_string_attr(hid_t loc, const char* name, const std::string& path);

}  // namespace meshtrain::h5
