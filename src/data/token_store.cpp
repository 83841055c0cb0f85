#include "data/token_store.hpp"

#include <hdf5.h>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw DataError(path + ": " + what); }

struct H5Id {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Id() {
    if (id >= 0) close(id);
  }
};

template <class T>
std::vector<T> read_1d(hid_t file, const std::string& path, const std::string& name, hid_t mem_type) {
  if (H5Lexists(file, name.substr(0, name.rfind('/')).c_str(), H5P_DEFAULT) <= 0 ||
      H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0)
    fail(path, "dataset " + name + " is missing (not a meshtrain token store? see doc/data-format.md)");
  H5Id ds{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
  H5Id space{H5Dget_space(ds.id), H5Sclose};
  if (H5Sget_simple_extent_ndims(space.id) != 1) fail(path, "dataset " + name + " must be 1-D");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.id, &n, nullptr);
  std::vector<T> out(n);
  if (n && H5Dread(ds.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    fail(path, "cannot read dataset " + name + " (truncated or corrupt file)");
  return out;
}

}  // namespace

TokenStore::TokenStore(const std::string& path) : path_(path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become DataError messages, not HDF5 stack dumps
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail(path, "cannot open token store (missing or unreadable; create it with `meshtrain data prepare`)");
    std::fclose(f);
    fail(path, "not an HDF5 file (truncated or corrupt token store)");
  }
  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) fail(path, "cannot open as HDF5");
  if (H5Aexists(file.id, "vocab_size") <= 0) fail(path, "attribute vocab_size is missing (not a meshtrain token store)");
  {
    H5Id a{H5Aopen(file.id, "vocab_size", H5P_DEFAULT), H5Aclose};
    if (H5Aread(a.id, H5T_NATIVE_INT64, &vocab_size_) < 0 || vocab_size_ < 2)
      fail(path, "attribute vocab_size is unreadable or < 2");
  }
  if (H5Aexists(file.id, "eos_id") > 0) {
    H5Id a{H5Aopen(file.id, "eos_id", H5P_DEFAULT), H5Aclose};
    if (H5Aread(a.id, H5T_NATIVE_INT64, &eos_id_) < 0 || eos_id_ < 0 || eos_id_ >= vocab_size_)
      fail(path, "attribute eos_id is unreadable or outside the vocabulary [0, " + std::to_string(vocab_size_) + ")");
  }
  for (auto [name, split] : {std::pair{"train", &train_}, {"validation", &validation_}}) {
    const std::string g = std::string("/") + name;
    split->tokens = read_1d<int32_t>(file.id, path, g + "/tokens", H5T_NATIVE_INT32);
    split->doc_offsets = read_1d<uint64_t>(file.id, path, g + "/doc_offsets", H5T_NATIVE_UINT64);
    if (split->tokens.empty()) fail(path, "split '" + std::string(name) + "' holds no tokens");
    const auto& off = split->doc_offsets;
    if (off.size() < 2 || off.front() != 0 || off.back() != split->tokens.size())
      fail(path, g + "/doc_offsets must start at 0 and end at the token count " + std::to_string(split->tokens.size()));
    for (size_t i = 1; i < off.size(); ++i)
      if (off[i] <= off[i - 1]) fail(path, g + "/doc_offsets must increase (entry " + std::to_string(i) + ")");
    for (size_t i = 0; i < split->tokens.size(); ++i)
      if (split->tokens[i] < 0 || split->tokens[i] >= vocab_size_)
        fail(path, g + "/tokens[" + std::to_string(i) + "] = " + std::to_string(split->tokens[i]) +
                       " is outside the vocabulary [0, " + std::to_string(vocab_size_) + ")");
  }
  if (H5Lexists(file.id, "/tokenizer", H5P_DEFAULT) > 0 && H5Lexists(file.id, "/tokenizer/model", H5P_DEFAULT) > 0) {
    auto bytes = read_1d<uint8_t>(file.id, path, "/tokenizer/model", H5T_NATIVE_UINT8);
    tokenizer_model_.assign(bytes.begin(), bytes.end());
  }
}

const TokenSplit& TokenStore::split(const std::string& name) const {
  if (name == "train") return train_;
  if (name == "validation") return validation_;
  throw DataError(path_ + ": unknown split '" + name + "' (train | validation)");
}

}  // namespace meshtrain
