#include "checkpoint/inspect.hpp"

#include <hdf5.h>

#include <cstdio>
#include <vector>

#include "checkpoint/h5_util.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

struct Entry {
  std::string name, desc;
};

std::string dtype_name(hid_t type) {
  if (H5Tget_class(type) == H5T_FLOAT) return H5Tget_size(type) == 4 ? "float32" : "float64";
  if (H5Tget_class(type) == H5T_INTEGER) return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(8 * H5Tget_size(type));
  return "other";
}

herr_t visit(hid_t obj, const char* name, const H5O_info_t* info, void* data) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  h5::Handle ds{H5Dopen2(obj, name, H5P_DEFAULT), H5Dclose};
  h5::Handle space{H5Dget_space(ds.id), H5Sclose};
  h5::Handle type{H5Dget_type(ds.id), H5Tclose};
  std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  std::string shape = "[";
  for (size_t i = 0; i < dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
  static_cast<std::vector<Entry>*>(data)->push_back({std::string("/") + name, shape + "] " + dtype_name(type.id)});
  return 0;
}

}  // namespace

std::string inspect_checkpoint(const std::string& path, bool& ok) {
  h5::Handle file{-1, H5Fclose};
  H5E_BEGIN_TRY { file.id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (file.id < 0) h5::fail(path, "cannot open as an HDF5 checkpoint (missing, truncated or not HDF5)");
  std::string out = path + "\n";
  {
    h5::Handle g{-1, H5Gclose};
    H5E_BEGIN_TRY { g.id = H5Gopen2(file.id, "/meta", H5P_DEFAULT); }
    H5E_END_TRY;
    if (g.id < 0) h5::fail(path, "not a meshtrain checkpoint (no /meta)");
    out += "format: " + h5::read_string_attr(g.id, "format", path) + " version " +
           std::to_string(h5::read_int_attr(g.id, "format_version", path)) + "\n";
    out += "model: " + h5::read_string_attr(g.id, "model", path) + "\n";
    out += "written by: meshtrain " + h5::read_string_attr(g.id, "meshtrain_version", path) + ", " +
           std::to_string(h5::read_int_attr(g.id, "world_size", path)) + " ranks, " +
           h5::read_string_attr(g.id, "layout", path) + "\n";
    out += std::string("contents: ") +
           (h5::read_int_attr(g.id, "model_only", path) ? "model only (no optimizer state; export, not resume)"
                                                        : "model and optimizer state") + "\n";
  }
  {
    h5::Handle g{H5Gopen2(file.id, "/train_state", H5P_DEFAULT), H5Gclose};
    out += "train state: step " + std::to_string(h5::read_int_attr(g.id, "step", path)) + ", tokens seen " +
           std::to_string(h5::read_int_attr(g.id, "tokens_seen", path)) + ", loader cursor " +
           std::to_string(h5::read_int_attr(g.id, "loader_cursor", path)) + ", optimizer step " +
           std::to_string(h5::read_int_attr(g.id, "optimizer_step", path)) + ", lr " +
           [&] {
             char b[32];
             std::snprintf(b, sizeof b, "%.6g", h5::read_double_attr(g.id, "lr", path));
             return std::string(b);
           }() + ", seed " + std::to_string(h5::read_int_attr(g.id, "seed", path)) + "\n";
  }
  std::vector<Entry> entries;
  H5Ovisit2(file.id, H5_INDEX_NAME, H5_ITER_INC, visit, &entries, H5O_INFO_BASIC);
  out += "datasets (" + std::to_string(entries.size()) + "):\n";
  for (const Entry& e : entries) out += "  " + e.name + "  " + e.desc + "\n";
  try {
    const int64_t n = verify_checksums(file.id, 0, 1, path);
    out += "checksums: " + std::to_string(n) + " shards, all match (xxh3_64)\n";
    ok = true;
  } catch (const CheckpointError& e) {
    out += std::string("checksums: FAILED: ") + e.what() + "\n";
    ok = false;
  }
  return out;
}

}  // namespace meshtrain
