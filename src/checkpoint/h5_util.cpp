#include "checkpoint/h5_util.hpp"

#include <vector>

#include "util/errors.hpp"

namespace meshtrain::h5 {

void fail(const std::string& path, const std::string& what) { throw CheckpointError(path + ": " + what); }

namespace {
void write_scalar(hid_t loc, const char* name, hid_t type, const void* value, const std::string& path) {
  Handle space{H5Screate(H5S_SCALAR), H5Sclose};
  Handle a{H5Acreate2(loc, name, type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  if (a.id < 0 || H5Awrite(a.id, type, value) < 0) fail(path, std::string("cannot write attribute ") + name);
}
}  // namespace

void write_attr(hid_t loc, const char* name, int64_t value, const std::string& path) {
  write_scalar(loc, name, H5T_NATIVE_INT64, &value, path);
}

void write_attr(hid_t loc, const char* name, double value, const std::string& path) {
  write_scalar(loc, name, H5T_NATIVE_DOUBLE, &value, path);
}

void write_attr(hid_t loc, const char* name, const std::string& value, const std::string& path) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, H5T_VARIABLE);
  H5Tset_cset(type.id, H5T_CSET_UTF8);
  const char* c = value.c_str();
  write_scalar(loc, name, type.id, &c, path);
}

namespace {
void read_scalar(hid_t loc, const char* name, hid_t type, void* value, const std::string& path) {
  if (H5Aexists(loc, name) <= 0) fail(path, std::string("missing attribute ") + name);
  Handle a{H5Aopen(loc, name, H5P_DEFAULT), H5Aclose};
  if (a.id < 0 || H5Aread(a.id, type, value) < 0) fail(path, std::string("cannot read attribute ") + name);
}
}  // namespace

int64_t read_int_attr(hid_t loc, const char* name, const std::string& path) {
  int64_t v = 0;
  read_scalar(loc, name, H5T_NATIVE_INT64, &v, path);
  return v;
}

double read_double_attr(hid_t loc, const char* name, const std::string& path) {
  double v = 0;
  read_scalar(loc, name, H5T_NATIVE_DOUBLE, &v, path);
  return v;
}

std::string read_string_attr(hid_t loc, const char* name, const std::string& path) {
  Handle type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, H5T_VARIABLE);
  H5Tset_cset(type.id, H5T_CSET_UTF8);
  char* c = nullptr;
  read_scalar(loc, name, type.id, &c, path);
  std::string out = c ? c : "";
  H5free_memory(c);
  return out;
}

}  // namespace meshtrain::h5
