#include "checkpoint/model_dump.hpp"

#include <hdf5.h>

#include <cstdio>

#include "checkpoint/h5_util.hpp"
#include "checkpoint/model_args_h5.hpp"
#include "model/layers/moe.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

using h5::fail;
using H5Handle = h5::Handle;

void write_dataset(hid_t group, const std::string& name, const Shape& shape, hid_t type, const void* data,
                   const std::string& path) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  H5Handle ds{H5Dcreate2(group, name.c_str(), type, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0 || H5Dwrite(ds.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail(path, "cannot write dataset " + name);
}

void write_tensors(hid_t file, const char* group_name, Transformer& model, Device& dev, bool grads,
                   const std::string& path, const std::vector<std::vector<float>>* global_values) {
  H5Handle g{H5Gcreate2(file, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    if (global_values) {
      write_dataset(g.id, p->name, p->shape, H5T_NATIVE_FLOAT, (*global_values)[i].data(), path);
      continue;
    }
    if (p->local_shape != p->shape) fail(path, p->name + " is split over tensor-parallel ranks; pass its global values");
    const Tensor& t = grads ? p->grad : p->value;
    std::vector<float> host(size_t(t.numel()));
    dev.download(host.data(), t, t.nbytes());
    write_dataset(g.id, p->name, p->shape, H5T_NATIVE_FLOAT, host.data(), path);
  }
}

}  // namespace

void write_model_dump(const std::string& path, Transformer& model, Device& dev, const DumpOptions& opt) {
  const std::string tmp = path + ".tmp";
  {
    H5Handle f{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (f.id < 0) fail(tmp, "cannot create file");
    write_model_args(f.id, model.args(), tmp);
    write_tensors(f.id, "/params", model, dev, false, tmp, opt.global_values);
    if (opt.grads) {
      write_tensors(f.id, "/grads", model, dev, true, tmp, nullptr);
      h5::write_attr(f.id, "loss", double(opt.loss), tmp);
      h5::write_attr(f.id, "moe_force_load_balance", int64_t(opt.moe_force_load_balance), tmp);
    }
    if (!model.moe_layers().empty()) {  // state that is not a parameter: the MoE selection biases
      H5Handle g{H5Gcreate2(f.id, "/buffers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      for (const MoE* m : model.moe_layers())
        write_dataset(g.id, m->name() + ".expert_bias", {m->num_experts()}, H5T_NATIVE_FLOAT, m->expert_bias().data(),
                      tmp);
    }
    if (opt.tokens) {
      H5Handle g{H5Gcreate2(f.id, "/batch", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      write_dataset(g.id, "tokens", {opt.batch, opt.seq_len + 1}, H5T_NATIVE_INT32, opt.tokens->data(), tmp);
    }
    if (H5Fflush(f.id, H5F_SCOPE_GLOBAL) < 0) fail(tmp, "flush failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "cannot rename from " + tmp);
}

void read_model_dump(const std::string& path, Transformer& model, Device& dev, const std::string& group) {
  H5Handle f{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (f.id < 0) fail(path, "cannot open as HDF5");
  for (Parameter* p : model.parameters()) {
    const std::string ds_name = group + "/" + p->name;
    if (H5Lexists(f.id, group.c_str(), H5P_DEFAULT) <= 0 || H5Lexists(f.id, ds_name.c_str(), H5P_DEFAULT) <= 0)
      fail(path, "dataset " + ds_name + " missing");
    H5Handle ds{H5Dopen2(f.id, ds_name.c_str(), H5P_DEFAULT), H5Dclose};
    H5Handle space{H5Dget_space(ds.id), H5Sclose};
    std::vector<hsize_t> dims(size_t(H5Sget_simple_extent_ndims(space.id)));
    H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
    if (Shape(dims.begin(), dims.end()) != p->shape)
      fail(path, "dataset " + ds_name + " has shape " + shape_str(Shape(dims.begin(), dims.end())) + ", model needs " +
                     shape_str(p->shape));
    std::vector<float> host(size_t(p->value.numel()));
    if (H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()) < 0)
      fail(path, "cannot read dataset " + ds_name);
    dev.upload(p->value, host.data(), host.size() * sizeof(float));
  }
}

}  // namespace meshtrain
