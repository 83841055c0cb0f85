#include "checkpoint/dataset_offsets.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "checkpoint/h5_util.hpp"
#include "checkpoint/xxh3_dispatch.hpp"

namespace meshtrain {

namespace {

constexpr const char* kName = "/dataset_offsets";

std::string hex_of(const std::string& text) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return hex;
}

}  // namespace

std::string write_dataset_offsets(hid_t file, const std::vector<std::pair<std::string, hid_t>>& datasets, int rank,
                                  const std::string& path) {
  std::string text;
  for (const auto& [name, id] : datasets) {
    const haddr_t offset = H5Dget_offset(id);
    if (offset == HADDR_UNDEF) continue;
    h5::Handle space{H5Dget_space(id), H5Sclose};
    std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
    H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
    text += name + '\t' + std::to_string(offset) + '\t';
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i) text += ',';
      text += std::to_string(dims[i]);
    }
    text += '\n';
  }
  const hsize_t n[1] = {hsize_t(text.size())};
  h5::Handle space{text.empty() ? H5Screate(H5S_NULL) : H5Screate_simple(1, n, nullptr), H5Sclose};
  h5::Handle ds{H5Dcreate2(file, kName, H5T_NATIVE_UCHAR, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) h5::fail(path, std::string("cannot create dataset ") + kName);
  h5::write_attr(ds.id, "xxh3_64", hex_of(text), path);
  if (rank == 0 && !text.empty() && H5Dwrite(ds.id, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()) < 0)
    return path + ": cannot write dataset " + kName;
  return "";
}

std::unordered_map<std::string, DatasetPlace> read_dataset_offsets(hid_t file, const std::string& path) {
  std::unordered_map<std::string, DatasetPlace> out;
  if (H5Lexists(file, kName + 1, H5P_DEFAULT) <= 0) return out;  // an older checkpoint
  h5::Handle ds{H5Dopen2(file, kName, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) h5::fail(path, std::string("cannot open dataset ") + kName);
  h5::Handle space{H5Dget_space(ds.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  std::string text(size_t(std::max<hssize_t>(n, 0)), '\0');
  if (n > 0 && H5Dread(ds.id, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()) < 0)
    h5::fail(path, std::string("cannot read dataset ") + kName);
  const std::string want = h5::read_string_attr(ds.id, "xxh3_64", path), got = hex_of(text);
  if (want != got)
    h5::fail(path, std::string("dataset ") + kName + " fails its checksum (xxh3 " + got + ", written " + want +
                       "): corrupt checkpoint");
  std::istringstream lines(text);
  std::string line;
  for (size_t k = 0; std::getline(lines, line); ++k) {
    std::istringstream f(line);
    std::string name, offset, dims, item;
    if (!std::getline(f, name, '\t') || !std::getline(f, offset, '\t') || !std::getline(f, dims))
      h5::fail(path, std::string("malformed ") + kName + " line " + std::to_string(k + 1));
    DatasetPlace place;
    try {
      place.offset = std::stoull(offset);
      std::istringstream d(dims);
      while (std::getline(d, item, ',')) place.dims.push_back(hsize_t(std::stoull(item)));
    } catch (const std::exception&) {
      h5::fail(path, std::string("malformed ") + kName + " line " + std::to_string(k + 1));
    }
    out[name] = std::move(place);
  }
  return out;
}

}  // namespace meshtrain
