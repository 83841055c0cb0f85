#include "checkpoint/sharded_checkpoint.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "util/errors.hpp"

#include "checkpoint/h5_util.hpp"

namespace meshtrain {

namespace {

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr int64_t kFormatVersion = 1;

using h5::Handle;

// A file access property list for MPI-IO over `world`.
Handle mpio_fapl(MPI_Comm world) {
  Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  H5Pset_fapl_mpio(fapl.id, world, MPI_INFO_NULL);
  return fapl;
}

// Every rank learns whether any rank failed (and the first message), so all throw together.
void agree(MPI_Comm world, const std::string& path, const std::string& local_error) {
  int bad = local_error.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, world);
  if (!any) return;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  int first = bad ? rank : 1 << 30, lowest = 0;
  MPI_Allreduce(&first, &lowest, 1, MPI_INT, MPI_MIN, world);
  int len = int(local_error.size());
  MPI_Bcast(&len, 1, MPI_INT, lowest, world);
  std::string msg = local_error;
  msg.resize(size_t(len));
  MPI_Bcast(msg.data(), len, MPI_CHAR, lowest, world);
  throw CheckpointError(msg.rfind(path, 0) == 0 ? msg : path + ": " + msg);
}

Handle create_dataset(hid_t file, const std::string& name, const Shape& shape, const std::string& path) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  Handle ds{H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) h5::fail(path, "cannot create dataset " + name);
  return ds;
}

// Writes (or reads) host [n] as hyperslab (start, count) of dataset `ds`.
bool transfer(hid_t ds, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, float* host, bool write) {
  Handle file_space{H5Dget_space(ds), H5Sclose};
  if (H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0) return false;
  Handle mem{H5Screate_simple(int(count.size()), count.data(), nullptr), H5Sclose};
  return write ? H5Dwrite(ds, H5T_NATIVE_FLOAT, mem.id, file_space.id, H5P_DEFAULT, host) >= 0
               : H5Dread(ds, H5T_NATIVE_FLOAT, mem.id, file_space.id, H5P_DEFAULT, host) >= 0;
}

std::string state_name(const Parameter& p, const char* which) { return "/optimizer/" + p.name + "/" + which; }

}  // namespace

void shard_hyperslab(const Parameter& p, int64_t first_elem, int64_t n, std::vector<hsize_t>& start,
                     std::vector<hsize_t>& count) {
  const Shape& local = p.local_shape;
  const int64_t row = shape_numel(local) / local[0];
  if (first_elem % row || n % row) throw std::invalid_argument(p.name + ": a checkpoint shard must be whole rows");
  start.assign(local.size(), 0);
  count.assign(local.begin(), local.end());
  start[0] = hsize_t(first_elem / row);
  count[0] = hsize_t(n / row);
  const int d = p.sharding.tp_dim;
  if (d >= 0) start[size_t(d)] += hsize_t(p.sharding.tp_first);
}

void save_checkpoint(const std::string& path, MPI_Comm world, Device& dev, const Transformer& model,
                     const std::vector<LocalShard>& shards, const AdamW& opt, const TrainState& state,
                     const CheckpointRole& role, const CheckpointMeta& meta) {
  std::string error;
  {
    Handle fapl = mpio_fapl(world);
    Handle file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id), H5Fclose};
    if (file.id < 0) h5::fail(path, "cannot create file");  // H5Fcreate is collective: every rank fails
    // Metadata (groups, datasets, attributes) is created collectively with identical arguments.
    {
      Handle g{H5Gcreate2(file.id, "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      h5::write_attr(g.id, "format", std::string(kFormat), path);
      h5::write_attr(g.id, "format_version", kFormatVersion, path);
      h5::write_attr(g.id, "deck", meta.deck_toml, path);
      h5::write_attr(g.id, "layout", meta.layout, path);
      h5::write_attr(g.id, "world_size", meta.world_size, path);
      h5::write_attr(g.id, "model", model.args().name + " " + model.args().flavor, path);
    }
    {
      Handle g{H5Gcreate2(file.id, "/train_state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      h5::write_attr(g.id, "step", state.step, path);
      h5::write_attr(g.id, "tokens_seen", state.tokens_seen, path);
      h5::write_attr(g.id, "loader_cursor", state.loader_cursor, path);
      h5::write_attr(g.id, "optimizer_step", state.optimizer_step, path);
    }
    // Dataset handles stay open until every rank has written: H5Dopen / H5Dclose of a dataset
    // being written are collective in parallel HDF5, so they are created and closed by all ranks
    // in the same order.
    std::map<std::string, Handle> datasets;
    for (Parameter* p : model.parameters())
      for (const std::string& name : {"/model/" + p->name, state_name(*p, "exp_avg"), state_name(*p, "exp_avg_sq")})
        datasets.emplace(name, create_dataset(file.id, name, p->shape, path));
    // Shard data: independent writes of this rank's hyperslabs.
    std::vector<float> host;
    std::vector<hsize_t> start, count;
    for (size_t i = 0; i < shards.size() && error.empty(); ++i) {
      const LocalShard& ls = shards[i];
      const int64_t n = ls.value.numel();
      const bool writes = role.dp_primary && (ls.param->sharding.tp_dim >= 0 || role.tp_primary);
      if (n == 0 || !writes) continue;
      shard_hyperslab(*ls.param, ls.first_elem, n, start, count);
      host.resize(size_t(n));
      const std::pair<std::string, Tensor> parts[] = {{"/model/" + ls.param->name, ls.value},
                                                      {state_name(*ls.param, "exp_avg"), opt.exp_avg().view({n}, opt.offset(i))},
                                                      {state_name(*ls.param, "exp_avg_sq"), opt.exp_avg_sq().view({n}, opt.offset(i))}};
      for (const auto& [name, t] : parts) {
        dev.download(host.data(), t, size_t(n) * sizeof(float));
        if (!transfer(datasets.at(name).id, start, count, host.data(), true)) {
          error = path + ": cannot write dataset " + name;
          break;
        }
      }
    }
    if (H5Fflush(file.id, H5F_SCOPE_GLOBAL) < 0 && error.empty()) error = path + ": cannot flush";
  }  // the datasets, then the file, close collectively
  agree(world, path, error);
}

TrainState load_checkpoint(const std::string& path, MPI_Comm world, Device& dev, const Transformer& model,
                           const std::vector<LocalShard>& shards, AdamW& opt) {
  TrainState state;
  std::string error;
  try {
    // Every rank opens the file read-only on its own (no collective requirements on reads). A
    // missing or non-HDF5 file becomes our message, not HDF5's error stack.
    Handle file{-1, H5Fclose};
    H5E_BEGIN_TRY { file.id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
    H5E_END_TRY;
    if (file.id < 0) h5::fail(path, "cannot open as an HDF5 checkpoint");
    {
      Handle g{H5Gopen2(file.id, "/meta", H5P_DEFAULT), H5Gclose};
      if (g.id < 0 || h5::read_string_attr(g.id, "format", path) != kFormat) h5::fail(path, "not a meshtrain checkpoint (no /meta format)");
      const int64_t v = h5::read_int_attr(g.id, "format_version", path);
      if (v != kFormatVersion) h5::fail(path, "format version " + std::to_string(v) + ", this meshtrain reads " + std::to_string(kFormatVersion));
    }
    {
      Handle g{H5Gopen2(file.id, "/train_state", H5P_DEFAULT), H5Gclose};
      if (g.id < 0) h5::fail(path, "missing /train_state");
      state.step = h5::read_int_attr(g.id, "step", path);
      state.tokens_seen = h5::read_int_attr(g.id, "tokens_seen", path);
      state.loader_cursor = h5::read_int_attr(g.id, "loader_cursor", path);
      state.optimizer_step = h5::read_int_attr(g.id, "optimizer_step", path);
    }
    auto open_checked = [&](const std::string& name, const Parameter& p) {
      Handle ds{-1, H5Dclose};
      H5E_BEGIN_TRY { ds.id = H5Dopen2(file.id, name.c_str(), H5P_DEFAULT); }
      H5E_END_TRY;
      if (ds.id < 0) h5::fail(path, "missing dataset " + name + " (a checkpoint of another model?)");
      Handle space{H5Dget_space(ds.id), H5Sclose};
      std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
      H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
      if (Shape(dims.begin(), dims.end()) != p.shape)
        h5::fail(path, "dataset " + name + " has shape " + shape_str(Shape(dims.begin(), dims.end())) +
                           ", the model needs " + shape_str(p.shape));
      const hid_t id = ds.id;
      ds.id = -1;
      return Handle{id, H5Dclose};
    };
    std::vector<float> host;
    std::vector<hsize_t> start, count;
    auto read_into = [&](const std::string& name, const Parameter& p, const Tensor& dst, int64_t first_elem) {
      const int64_t n = dst.numel();
      if (n == 0) return;
      Handle ds = open_checked(name, p);
      shard_hyperslab(p, first_elem, n, start, count);
      host.resize(size_t(n));
      if (!transfer(ds.id, start, count, host.data(), false)) h5::fail(path, "cannot read dataset " + name);
      dev.upload(dst, host.data(), size_t(n) * sizeof(float));
    };
    // Replicated parameters (DDP, ZeRO-1/2): every element of the tp slab; FSDP: the shard.
    if (model.flat_params().defined()) {
      for (Parameter* p : model.parameters()) read_into("/model/" + p->name, *p, p->value.reshape({p->value.numel()}), 0);
    } else {
      for (const LocalShard& ls : shards) read_into("/model/" + ls.param->name, *ls.param, ls.value, ls.first_elem);
    }
    for (size_t i = 0; i < shards.size(); ++i) {
      const LocalShard& ls = shards[i];
      const int64_t n = ls.value.numel();
      read_into(state_name(*ls.param, "exp_avg"), *ls.param, opt.exp_avg().view({n}, opt.offset(i)), ls.first_elem);
      read_into(state_name(*ls.param, "exp_avg_sq"), *ls.param, opt.exp_avg_sq().view({n}, opt.offset(i)), ls.first_elem);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, path, error);
  opt.set_step_count(state.optimizer_step);
  return state;
}

}  // namespace meshtrain
