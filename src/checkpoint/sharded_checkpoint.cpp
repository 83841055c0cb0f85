#include "checkpoint/sharded_checkpoint.hpp"

#include "checkpoint/xxh3_dispatch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "checkpoint/dataset_offsets.hpp"
#include "checkpoint/h5_util.hpp"
#include "checkpoint/model_args_h5.hpp"
#include "checkpoint/node_read.hpp"
#include "checkpoint/stream_verifier.hpp"
#include "model/parameter_catalog.hpp"
#include "comm/mpi/mpi_chunking.hpp"
#include "util/errors.hpp"

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
// A save that found a non-finite value (`nonfinite`) outranks an I/O failure: it is thrown as
// NonFiniteError, which stops the run with its own status rather than as bad input.
void agree(MPI_Comm world, const std::string& path, const std::string& local_error, bool nonfinite = false) {
  int bad = local_error.empty() ? 0 : (nonfinite ? 2 : 1), worst = 0;
  MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, world);
  if (!worst) return;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  int first = bad == worst ? rank : 1 << 30, lowest = 0;
  MPI_Allreduce(&first, &lowest, 1, MPI_INT, MPI_MIN, world);
  int len = int(local_error.size());
  MPI_Bcast(&len, 1, MPI_INT, lowest, world);
  std::string msg = local_error;
  msg.resize(size_t(len));
  MPI_Bcast(msg.data(), len, MPI_CHAR, lowest, world);
  if (msg.rfind(path, 0) != 0) msg = path + ": " + msg;
  if (worst == 2) throw NonFiniteError(msg);
  throw CheckpointError(msg);
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

Handle create_bytes_dataset(hid_t file, const std::string& name, int64_t n, const std::string& path) {
  const hsize_t dims[1] = {hsize_t(n)};
  Handle space{n > 0 ? H5Screate_simple(1, dims, nullptr) : H5Screate(H5S_NULL), H5Sclose};
  Handle ds{H5Dcreate2(file, name.c_str(), H5T_NATIVE_UCHAR, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
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

// Fault injection for the failed-save test: MESHTRAIN_TEST_KILL_SAVE_AT_STEP=N makes the last
// rank of `world` exit abruptly (as a killed rank would) after writing its first shard of the
// step-N checkpoint, leaving a partial .tmp file behind.
void die_if_injected(MPI_Comm world, int64_t step) {
  static const char* env = std::getenv("MESHTRAIN_TEST_KILL_SAVE_AT_STEP");
  if (!env || std::atoll(env) != step) return;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  if (rank == size - 1) std::_Exit(9);
}

std::string state_name(const Parameter& p, const std::string& which) { return "/optimizer/" + p.name + "/" + which; }

std::string join(const std::vector<hsize_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  return out;
}

std::vector<hsize_t> split(const std::string& s) {
  std::vector<hsize_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(hsize_t(std::stoull(item)));
  return out;
}

// XXH3-64 of a shard's n floats as stored (float32, little-endian), as 16 hex digits.
std::string shard_hash_hex(const float* data, size_t n) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(data, n * sizeof(float))));
  return hex;
}

// shard_hash_hex() of a shard about to be saved, and the index of its first NaN / inf element
// in *first_nonfinite (-1 if none). The streaming hash equals the one-shot XXH3-64; each 64 KiB
// block is tested (exponent bits all ones) right before it is hashed, so the test reads bytes
// the hash is about to read anyway and the save makes no extra pass over memory.
std::string saved_shard_hash_hex(const float* data, size_t n, int64_t* first_nonfinite) {
  constexpr size_t kBlock = 16384;
  *first_nonfinite = -1;
  XXH3_state_t* st = XXH3_createState();
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    if (*first_nonfinite < 0) {
      uint32_t all_ones = 0;  // any element whose exponent is all ones (inf or NaN)
      for (size_t i = 0; i < m; ++i) {
        uint32_t bits;
        std::memcpy(&bits, data + b + i, sizeof bits);
        all_ones |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
      }
      if (all_ones)
        for (size_t i = 0; i < m && *first_nonfinite < 0; ++i)
          if (!std::isfinite(data[b + i])) *first_nonfinite = int64_t(b + i);
    }
    XXH3_64bits_update(st, data + b, m * sizeof(float));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(st)));
  XXH3_freeState(st);
  return hex;
}

// "[3, 17]": the global index of element `k` of hyperslab {start, count} (row-major).
std::string global_index_text(const std::vector<hsize_t>& start, const std::vector<hsize_t>& count, int64_t k) {
  std::vector<hsize_t> idx(count.size());
  for (size_t d = count.size(); d-- > 0;) {
    idx[d] = start[d] + hsize_t(k) % count[d];
    k /= int64_t(count[d]);
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

// One line per written hyperslab: "dataset<TAB>start<TAB>count<TAB>xxh3 hex".
std::string checksum_line(const std::string& name, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                          const std::string& hash_hex) {
  return name + "\t" + join(start) + "\t" + join(count) + "\t" + hash_hex + "\n";
}

// Every rank's text, concatenated in rank order, on every rank. Lengths travel as int64 so that
// every rank sees the same total and throws the same CommError if it exceeds MPI's int counts.
std::string all_gather_text(MPI_Comm world, const std::string& mine, const std::string& what) {
  int size = 0;
  MPI_Comm_size(world, &size);
  const int64_t len = int64_t(mine.size());
  std::vector<int64_t> lens64(static_cast<size_t>(size));
  MPI_Allgather(&len, 1, MPI_INT64_T, lens64.data(), 1, MPI_INT64_T, world);
  int64_t total = 0;
  for (int64_t l : lens64) total += l;
  checked_int_count(total, what);  // then every length and displacement below fits an int
  std::vector<int> lens(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  for (int r = 0, at = 0; r < size; ++r) {
    lens[size_t(r)] = int(lens64[size_t(r)]);
    displs[size_t(r)] = at;
    at += lens[size_t(r)];
  }
  std::string all(size_t(total), '\0');
  MPI_Allgatherv(mine.data(), int(len), MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, world);
  return all;
}

// "/model/layers.{i}.moe.expert_bias" of every MoE block of `args`, in block order.
std::vector<std::string> expert_bias_names(const ModelArgs& args) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < args.n_layers; ++i)
    if (args.is_moe_layer(i)) names.push_back("/model/layers." + std::to_string(i) + ".moe.expert_bias");
  return names;
}

// Why rank 0 must not write the snapshot's expert biases ("" when they are fine: a vector per
// MoE block of num_experts finite values); *nonfinite says whether a value is NaN or inf.
std::string expert_bias_problem(const CheckpointSnapshot& snap, const std::string& path, bool* nonfinite) {
  *nonfinite = false;
  const std::vector<std::string> names = expert_bias_names(snap.args);
  const std::vector<std::vector<float>>& biases = snap.state.expert_bias;
  if (biases.size() != names.size())
    return path + ": " + std::to_string(biases.size()) + " expert-bias vectors for " + std::to_string(names.size()) +
           " MoE blocks";
  for (size_t j = 0; j < names.size(); ++j) {
    const std::vector<float>& b = biases[j];
    const bool finite = std::all_of(b.begin(), b.end(), [](float v) { return std::isfinite(v); });
    *nonfinite = !finite;
    if (int64_t(b.size()) != snap.args.num_experts || !finite)
      return path + ": refusing to write " + names[j] + " (" + std::to_string(b.size()) + " values" +
             (finite ? "" : ", non-finite") + ")";
  }
  return "";
}

// The refusal of a shard whose element `bad` (of hyperslab {start, count}) is NaN or inf.
std::string nonfinite_message(const std::string& path, const std::string& dataset, const std::vector<hsize_t>& start,
                              const std::vector<hsize_t>& count, int64_t bad, float value, int64_t step) {
  return path + ": refusing to publish a checkpoint with a non-finite value: " + dataset +
         global_index_text(start, count, bad) + " = " + std::to_string(value) + " (step " + std::to_string(step) + ")";
}

}  // namespace

std::vector<ChecksumRecord> read_checksum_records(hid_t file, const std::string& path) {
  Handle ds{-1, H5Dclose};
  H5E_BEGIN_TRY { ds.id = H5Dopen2(file, "/checksums", H5P_DEFAULT); }
  H5E_END_TRY;
  if (ds.id < 0) h5::fail(path, "missing dataset /checksums (an incomplete checkpoint?)");
  Handle space{H5Dget_space(ds.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  std::string text(size_t(std::max<hssize_t>(n, 0)), '\0');
  if (n > 0 && H5Dread(ds.id, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()) < 0)
    h5::fail(path, "cannot read dataset /checksums");
  std::istringstream lines(text);
  std::string line;
  std::vector<ChecksumRecord> out;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    ChecksumRecord r;
    std::string start_s, count_s;
    if (!std::getline(f, r.dataset, '\t') || !std::getline(f, start_s, '\t') || !std::getline(f, count_s, '\t') ||
        !std::getline(f, r.xxh3_hex))
      h5::fail(path, "malformed /checksums record " + std::to_string(out.size()));
    try {
      r.start = split(start_s);
      r.count = split(count_s);
    } catch (const std::exception&) {
      h5::fail(path, "malformed /checksums record " + std::to_string(out.size()));
    }
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

void check_shard_hash(const ChecksumRecord& r, const float* data, size_t n, const std::string& path) {
  const std::string got = shard_hash_hex(data, n);
  if (r.xxh3_hex != got)
    h5::fail(path, "dataset " + r.dataset + ": the shard at [" + join(r.start) + "] + [" + join(r.count) +
                       "] fails its checksum (xxh3 " + got + ", written " + r.xxh3_hex + "): corrupt checkpoint");
}

// Re-reads record `r` through HDF5 and checks its hash. `places` (a load's /dataset_offsets, when
// it planned from one) must agree with where the dataset really lies: the loaded bytes came from
// there, and this re-read checks the dataset itself, not those bytes.
void verify_record(hid_t file, const ChecksumRecord& r, const std::string& path, std::vector<float>& host,
                   const std::unordered_map<std::string, DatasetPlace>* places = nullptr) {
  Handle d{-1, H5Dclose};
  H5E_BEGIN_TRY { d.id = H5Dopen2(file, r.dataset.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  if (d.id < 0) h5::fail(path, "missing dataset " + r.dataset + " (listed in /checksums)");
  if (places) {
    const auto it = places->find(r.dataset);
    const haddr_t real = H5Dget_offset(d.id);
    if (it != places->end() && it->second.offset != uint64_t(real))
      h5::fail(path, "dataset " + r.dataset + " lies at byte " + std::to_string(real) + ", /dataset_offsets says " +
                         std::to_string(it->second.offset) + ": corrupt checkpoint");
  }
  hsize_t elems = 1;
  for (hsize_t c : r.count) elems *= c;
  host.resize(size_t(elems));
  bool ok = false;
  H5E_BEGIN_TRY { ok = transfer(d.id, r.start, r.count, host.data(), false); }
  H5E_END_TRY;
  if (!ok) h5::fail(path, "cannot read dataset " + r.dataset + " at [" + join(r.start) + "] (truncated or corrupt file)");
  check_shard_hash(r, host.data(), host.size(), path);
}


}  // namespace

int64_t verify_checksums(hid_t file, int rank, int size, const std::string& path) {
  const std::vector<ChecksumRecord> records = read_checksum_records(file, path);
  std::vector<float> host;
  for (size_t i = 0; i < records.size(); ++i)
    if (int64_t(i) % size == rank) verify_record(file, records[i], path, host);
  return int64_t(records.size());
}

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
  start[0] += hsize_t(p.sharding.ep_first);  // an expert-parallel rank's experts (0 otherwise)
}

CheckpointSnapshot plan_checkpoint(const Transformer& model, const std::vector<LocalShard>& shards, const Optimizer& opt,
                                   const TrainState& state, const CheckpointRole& role, const CheckpointMeta& meta) {
  CheckpointSnapshot snap;
  snap.args = model.args();
  snap.state = state;
  snap.meta = meta;
  snap.meta.optimizer = opt.name();
  // Every rank creates every dataset, also those of parameters it does not hold (pipeline
  // stages): the catalog lists the whole model from its arguments. Each parameter's value and
  // moments are created one after the other, the order load_checkpoint's reads follow.
  const ParameterCatalog catalog(model.args(), model.tensor_parallel());
  for (const CatalogEntry& e : catalog.entries()) {
    const Parameter& p = e.meta;
    snap.datasets.emplace_back("/model/" + p.name, p.shape);
    if (meta.model_only) continue;
    for (const std::string& which : opt.state_names(p)) snap.datasets.emplace_back(state_name(p, which), p.shape);
  }
  for (const std::string& name : expert_bias_names(snap.args)) snap.datasets.emplace_back(name, Shape{snap.args.num_experts});
  for (size_t i = 0; i < shards.size(); ++i) {
    const LocalShard& ls = shards[i];
    const int64_t n = ls.value.numel();
    // A tied embedding's copy on the last pipeline stage equals the first stage's, which writes it.
    const bool writes = role.dp_primary && (ls.param->sharding.tp_dim >= 0 || role.tp_primary) &&
                        !model.is_tied_copy(ls.param);
    if (n == 0 || !writes) continue;
    std::vector<hsize_t> start, count;
    shard_hyperslab(*ls.param, ls.first_elem, n, start, count);
    snap.shards.push_back({"/model/" + ls.param->name, start, count, ls.value, {}, {}});
    if (meta.model_only) continue;
    const std::vector<std::string> names = opt.state_names(*ls.param);
    const std::vector<Tensor> states = opt.state_of(i);
    for (size_t k = 0; k < names.size(); ++k) snap.shards.push_back({state_name(*ls.param, names[k]), start, count, states[k], {}, {}});
  }
  return snap;
}

void stage_checkpoint(CheckpointSnapshot& snap, MPI_Comm world, const std::string& path, Device& dev,
                      CheckpointSnapshot* recycle) {
  std::string error;
  for (size_t k = 0; k < snap.shards.size(); ++k) {
    StagedShard& s = snap.shards[k];
    // The same layout saves the same hyperslabs in the same order: the previous buffers fit.
    if (recycle && k < recycle->shards.size()) s.values = std::move(recycle->shards[k].values);
    const size_t n = size_t(s.source.numel());
    s.values.resize(n);
    dev.download(s.values.data(), s.source, n * sizeof(float));
    s.source = Tensor();  // the snapshot no longer refers to device memory
    int64_t bad = -1;
    s.xxh3_hex = saved_shard_hash_hex(s.values.data(), n, &bad);
    if (bad >= 0 && error.empty()) error = nonfinite_message(path, s.dataset, s.start, s.count, bad, s.values[size_t(bad)], snap.state.step);
  }
  bool nonfinite = !error.empty();
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank == 0 && error.empty()) error = expert_bias_problem(snap, path, &nonfinite);
  snap.staged = true;
  agree(world, path, error, nonfinite);
}

void save_checkpoint(const std::string& path, MPI_Comm world, Device& dev, const Transformer& model,
                     const std::vector<LocalShard>& shards, const Optimizer& opt, const TrainState& state,
                     const CheckpointRole& role, const CheckpointMeta& meta) {
  write_checkpoint(path, world, plan_checkpoint(model, shards, opt, state, role, meta), &dev);
}

void write_checkpoint(const std::string& path, MPI_Comm world, const CheckpointSnapshot& snap, Device* dev) {
  std::string error;
  bool nonfinite = false;  // a NaN / inf in what some rank was about to write: the file is refused
  const CheckpointMeta& meta = snap.meta;
  const TrainState& state = snap.state;
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
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
      h5::write_attr(g.id, "model", snap.args.name + " " + snap.args.flavor, path);
      h5::write_attr(g.id, "meshtrain_version", std::string(MESHTRAIN_VERSION), path);
      h5::write_attr(g.id, "seq_len", meta.seq_len, path);
      h5::write_attr(g.id, "model_only", int64_t(meta.model_only), path);
      h5::write_attr(g.id, "optimizer", snap.meta.optimizer, path);
      Handle args{H5Gcreate2(g.id, "model_args", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      write_model_args(args.id, snap.args, path);
    }
    {
      Handle g{H5Gcreate2(file.id, "/train_state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      h5::write_attr(g.id, "step", state.step, path);
      h5::write_attr(g.id, "tokens_seen", state.tokens_seen, path);
      h5::write_attr(g.id, "loader_cursor", state.loader_cursor, path);
      h5::write_attr(g.id, "optimizer_step", state.optimizer_step, path);
      h5::write_attr(g.id, "lr", state.lr, path);
      h5::write_attr(g.id, "seed", state.seed, path);
      h5::write_attr(g.id, "rng", std::string("counter-based SplitMix64 of (seed, stream, index); the seed is the state"), path);
    }
    // Dataset handles stay open until every rank has written: H5Dopen / H5Dclose of a dataset
    // being written are collective in parallel HDF5, so they are created and closed by all ranks
    // in the same order.
    std::map<std::string, Handle> datasets;
    for (const auto& [name, shape] : snap.datasets) datasets.emplace(name, create_dataset(file.id, name, shape, path));
    {  // where each lies, for loads to plan their reads without opening every dataset
      std::vector<std::pair<std::string, hid_t>> places;
      for (const auto& [name, ds] : datasets) places.emplace_back(name, ds.id);
      error = write_dataset_offsets(file.id, places, world_rank, path);
    }
    // MoE selection biases: small [E] datasets, written by rank 0 (every rank holds them all).
    const std::vector<std::string> bias_names = expert_bias_names(snap.args);
    if (world_rank == 0 && error.empty()) error = expert_bias_problem(snap, path, &nonfinite);
    // Shard data: independent writes of this rank's hyperslabs, each checksummed.
    std::string checksums;
    for (size_t j = 0; j < bias_names.size() && error.empty() && world_rank == 0; ++j) {
      const std::vector<float>& b = state.expert_bias[j];
      const std::vector<hsize_t> start{0}, count{hsize_t(b.size())};
      int64_t bad = -1;
      const std::string hash = saved_shard_hash_hex(b.data(), b.size(), &bad);
      if (!transfer(datasets.at(bias_names[j]).id, start, count, const_cast<float*>(b.data()), true)) {
        error = path + ": cannot write dataset " + bias_names[j];
        break;
      }
      checksums += checksum_line(bias_names[j], start, count, hash);
    }
    std::vector<float> host;  // a plan's shards pass through here one at a time
    for (size_t k = 0; k < snap.shards.size() && error.empty(); ++k) {
      const StagedShard& s = snap.shards[k];
      const float* data = s.values.data();
      std::string hash = s.xxh3_hex;
      if (!snap.staged) {
        const size_t n = size_t(s.source.numel());
        host.resize(n);
        dev->download(host.data(), s.source, n * sizeof(float));
        int64_t bad = -1;
        hash = saved_shard_hash_hex(host.data(), n, &bad);
        if (bad >= 0) {
          error = nonfinite_message(path, s.dataset, s.start, s.count, bad, host[size_t(bad)], state.step);
          nonfinite = true;
          break;
        }
        data = host.data();
      }
      if (!transfer(datasets.at(s.dataset).id, s.start, s.count, const_cast<float*>(data), true)) {
        error = path + ": cannot write dataset " + s.dataset;
        break;
      }
      checksums += checksum_line(s.dataset, s.start, s.count, hash);
      die_if_injected(world, state.step);
    }
    // /checksums: every rank's records (gathered), one uint8 text dataset written by rank 0.
    const std::string all = all_gather_text(world, checksums, path + ": /checksums (bytes over all ranks)");
    {
      Handle ds = create_bytes_dataset(file.id, "/checksums", int64_t(all.size()), path);
      h5::write_attr(ds.id, "algorithm", std::string("xxh3_64"), path);
      if (world_rank == 0 && !all.empty() &&
          H5Dwrite(ds.id, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()) < 0 && error.empty())
        error = path + ": cannot write dataset /checksums";
    }
    if (H5Fflush(file.id, H5F_SCOPE_GLOBAL) < 0 && error.empty()) error = path + ": cannot flush";
    int any_nonfinite = nonfinite ? 1 : 0;  // every rank learns it before the collective close
    MPI_Allreduce(MPI_IN_PLACE, &any_nonfinite, 1, MPI_INT, MPI_MAX, world);
    nonfinite = any_nonfinite != 0;
  }  // the datasets, then the file, close collectively
  if (nonfinite && world_rank == 0) std::remove(path.c_str());  // the .tmp is never renamed into place: delete it
  agree(world, path, error, nonfinite);
}

TrainState load_checkpoint(const std::string& path, MPI_Comm world, Device& dev, const Transformer& model,
                           const std::vector<LocalShard>& shards, Optimizer& opt, bool model_only) {
  TrainState state;
  std::string error;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  Handle file{-1, H5Fclose};
  std::vector<ChecksumRecord> records;
  std::vector<int> verified;  // per /checksums record: 1 once a node reader has hashed it from the stream
  std::vector<float> host;
  // Where each planned read lands: the tensor, the host bytes (the tensor itself, or staging).
  struct LandedRead {
    Tensor dst;
    char* host;
  };
  std::vector<LandedRead> reads;
  std::vector<std::vector<float>> staged;
  std::vector<FileExtent> extents;
  uint64_t file_size = 0;
  std::unordered_map<std::string, DatasetPlace> places;  // /dataset_offsets (empty in older files)
  try {
    // Every rank opens the file read-only on its own (no collective requirements on reads). A
    // missing or non-HDF5 file becomes our message, not HDF5's error stack.
    H5E_BEGIN_TRY { file.id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
    H5E_END_TRY;
    if (file.id < 0) h5::fail(path, "cannot open as an HDF5 checkpoint (missing, truncated or not HDF5)");
    {
      Handle g{H5Gopen2(file.id, "/meta", H5P_DEFAULT), H5Gclose};
      if (g.id < 0 || h5::read_string_attr(g.id, "format", path) != kFormat) h5::fail(path, "not a meshtrain checkpoint (no /meta format)");
      const int64_t v = h5::read_int_attr(g.id, "format_version", path);
      if (v != kFormatVersion) h5::fail(path, "format version " + std::to_string(v) + ", this meshtrain reads " + std::to_string(kFormatVersion));
      if (!model_only && h5::read_int_attr(g.id, "model_only", path))
        h5::fail(path, "a model-only checkpoint ([checkpoint] last_save_model_only) has no optimizer state to resume "
                       "training from; set [checkpoint] load_step to an earlier step, or export it");
      const std::string saved_by = H5Aexists(g.id, "optimizer") > 0 ? h5::read_string_attr(g.id, "optimizer", path) : "AdamW";
      if (!model_only && saved_by != opt.name())
        h5::fail(path, "holds " + saved_by + " state but [optimizer] name is " + opt.name() +
                           ": resume with the optimizer that saved it, or start from its weights only with "
                           "[checkpoint] initial_load_path and initial_load_model_only = true");
    }
    {
      Handle g{H5Gopen2(file.id, "/train_state", H5P_DEFAULT), H5Gclose};
      if (g.id < 0) h5::fail(path, "missing /train_state");
      state.step = h5::read_int_attr(g.id, "step", path);
      state.tokens_seen = h5::read_int_attr(g.id, "tokens_seen", path);
      state.loader_cursor = h5::read_int_attr(g.id, "loader_cursor", path);
      state.optimizer_step = h5::read_int_attr(g.id, "optimizer_step", path);
      state.lr = h5::read_double_attr(g.id, "lr", path);
      state.seed = h5::read_int_attr(g.id, "seed", path);
    }
    // MoE selection biases: every rank reads all of them (a few floats per block); the
    // round-robin checksum pass below verifies them.
    const ModelArgs& args = model.args();
    for (int64_t i = 0; i < args.n_layers; ++i) {
      if (!args.is_moe_layer(i)) continue;
      const std::string name = "/model/layers." + std::to_string(i) + ".moe.expert_bias";
      Handle ds{-1, H5Dclose};
      H5E_BEGIN_TRY { ds.id = H5Dopen2(file.id, name.c_str(), H5P_DEFAULT); }
      H5E_END_TRY;
      if (ds.id < 0) h5::fail(path, "missing dataset " + name + " (a checkpoint of another model?)");
      Handle space{H5Dget_space(ds.id), H5Sclose};
      if (H5Sget_simple_extent_ndims(space.id) != 1 || H5Sget_simple_extent_npoints(space.id) != args.num_experts)
        h5::fail(path, "dataset " + name + " does not hold " + std::to_string(args.num_experts) + " values");
      std::vector<float> b(size_t(args.num_experts));
      if (!transfer(ds.id, {0}, {hsize_t(b.size())}, b.data(), false))
        h5::fail(path, "cannot read dataset " + name + " (truncated or corrupt file)");
      state.expert_bias.push_back(std::move(b));
    }
    records = read_checksum_records(file.id, path);
    if (model_only)  // the optimizer state is not read, so its records are not verified either
      std::erase_if(records, [](const ChecksumRecord& r) { return r.dataset.rfind("/optimizer/", 0) == 0; });
    verified.assign(records.size(), 0);
    places = read_dataset_offsets(file.id, path);
    // Where dataset `name` lies and its dims: from /dataset_offsets, else (an older file, or a
    // dataset it does not list) by opening the dataset.
    auto place_of = [&](const std::string& name) {
      if (auto it = places.find(name); it != places.end()) return it->second;
      Handle ds{-1, H5Dclose};
      H5E_BEGIN_TRY { ds.id = H5Dopen2(file.id, name.c_str(), H5P_DEFAULT); }
      H5E_END_TRY;
      if (ds.id < 0) h5::fail(path, "missing dataset " + name + " (a checkpoint of another model?)");
      Handle space{H5Dget_space(ds.id), H5Sclose};
      DatasetPlace place;
      place.dims.resize(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
      H5Sget_simple_extent_dims(space.id, place.dims.data(), nullptr);
      const haddr_t base = H5Dget_offset(ds.id);
      if (base == HADDR_UNDEF) h5::fail(path, "dataset " + name + " is not stored contiguously (not written by meshtrain?)");
      place.offset = uint64_t(base);
      return place;
    };
    // What this rank holds: every parameter piece (replicated parameters — DDP, ZeRO-1/2 — the
    // whole tp slab; FSDP the shard) and, unless model_only, its shards' AdamW moments.
    struct Read {
      std::string name;
      const Parameter* p;
      Tensor dst;
      int64_t first_elem;
    };
    std::vector<Read> plan;
    for (const ParameterPiece& piece : local_parameter_pieces(model, shards))
      plan.push_back({"/model/" + piece.p->name, piece.p, piece.dst, piece.first_elem});
    for (size_t i = 0; i < shards.size() && !model_only; ++i) {
      const LocalShard& ls = shards[i];
      const int64_t n = ls.value.numel();
      if (n == 0) continue;
      const std::vector<std::string> names = opt.state_names(*ls.param);
      const std::vector<Tensor> states = opt.state_of(i);
      for (size_t k = 0; k < names.size(); ++k) plan.push_back({state_name(*ls.param, names[k]), ls.param, states[k], ls.first_elem});
    }
    std::erase_if(plan, [](const Read& r) { return r.dst.numel() == 0; });
    // Each read becomes the byte runs of its hyperslab in the (contiguous) dataset, landing in the
    // tensor itself on host-memory devices, else in a staging buffer uploaded afterwards.
    for (const Read& r : plan) {
      const DatasetPlace place = place_of(r.name);
      if (Shape(place.dims.begin(), place.dims.end()) != r.p->shape)
        h5::fail(path, "dataset " + r.name + " has shape " + shape_str(Shape(place.dims.begin(), place.dims.end())) +
                           ", the model needs " + shape_str(r.p->shape));
      std::vector<hsize_t> start, count;
      shard_hyperslab(*r.p, r.first_elem, r.dst.numel(), start, count);
      const uint64_t base = place.offset;
      char* dst = static_cast<char*>(dev.host_address(r.dst));
      if (!dst) {
        staged.emplace_back(size_t(r.dst.numel()));
        dst = reinterpret_cast<char*>(staged.back().data());
      }
      reads.push_back({r.dst, dst});
      for (const FileExtent& e : box_extents(base, std::vector<hsize_t>(r.p->shape.begin(), r.p->shape.end()), start, count, dst))
        extents.push_back(e);
    }
    file_size = uint64_t(std::filesystem::file_size(path));
  } catch (const std::exception& e) {
    error = e.what();
  }
  // The read itself is collective: only when every rank could plan it.
  int failed = error.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, world);
  if (!failed) try {
      // Each node's reader hashes every record whose bytes stream past it whole, as they pass
      // (a streaming XXH3 per record, fed while the next requests are read from disk), whatever
      // layout wrote the shards and whatever layout reads them: the checkpoint is read once.
      NodeReader node(world);
      std::vector<size_t> streamed;  // records the node's reader hashes
      std::unique_ptr<StreamVerifier> verifier;
      if (node.reader()) {
        std::vector<ChecksumRecord> recs;
        std::vector<std::vector<FileExtent>> runs;
        // dataset → offset, dims: the same places the ranks' reads were planned from
        std::unordered_map<std::string, std::pair<haddr_t, std::vector<hsize_t>>> where;
        for (size_t i = 0; i < records.size(); ++i) {
          auto it = where.find(records[i].dataset);
          if (auto listed = places.find(records[i].dataset); it == where.end() && listed != places.end())
            it = where.emplace(records[i].dataset, std::make_pair(haddr_t(listed->second.offset), listed->second.dims)).first;
          if (it == where.end()) {
            Handle ds{-1, H5Dclose};
            H5E_BEGIN_TRY { ds.id = H5Dopen2(file.id, records[i].dataset.c_str(), H5P_DEFAULT); }
            H5E_END_TRY;
            std::vector<hsize_t> dims;
            const haddr_t base = ds.id < 0 ? HADDR_UNDEF : H5Dget_offset(ds.id);
            if (base != HADDR_UNDEF) {
              Handle space{H5Dget_space(ds.id), H5Sclose};
              dims.resize(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
              H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
            }
            it = where.emplace(records[i].dataset, std::make_pair(base, dims)).first;
          }
          const auto& [base, dims] = it->second;
          if (base == HADDR_UNDEF) continue;  // left to the re-read below, which names the problem
          try {
            runs.push_back(box_extents(base, dims, records[i].start, records[i].count, nullptr));
          } catch (const std::invalid_argument&) {
            continue;  // a record outside its dataset: the re-read reports it
          }
          recs.push_back(records[i]);
          streamed.push_back(i);
        }
        verifier = std::make_unique<StreamVerifier>(std::move(recs), std::move(runs));
      }
      node.read(path, file_size, std::move(extents), verifier ? ChunkObserver([&](uint64_t o, const char* d, uint64_t n) {
                                                                  verifier->observe(o, d, n);
                                                                })
                                                              : ChunkObserver());
      for (const LandedRead& r : reads)
        if (!dev.host_address(r.dst)) dev.upload(r.dst, r.host, size_t(r.dst.numel()) * sizeof(float));
      if (verifier) {
        const std::vector<int> ok = verifier->finish(path);
        for (size_t k = 0; k < streamed.size(); ++k) verified[streamed[k]] |= ok[k];
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  // Records no reader saw whole (a node that did not need all of a record's bytes) are re-read,
  // dealt round-robin. Every rank takes part in the collectives, whatever happened above.
  int64_t n_records = error.empty() ? int64_t(records.size()) : -1, max_records = 0;
  MPI_Allreduce(&n_records, &max_records, 1, MPI_INT64_T, MPI_MAX, world);
  verified.resize(size_t(std::max<int64_t>(max_records, 0)), 0);
  if (max_records > 0)  // the same max_records on every rank, so every rank throws alike
    MPI_Allreduce(MPI_IN_PLACE, verified.data(), checked_int_count(max_records, path + ": /checksums records"),
                  MPI_INT, MPI_MAX, world);
  if (error.empty()) try {
      for (size_t i = 0, k = 0; i < records.size(); ++i)
        if (!verified[i] && int64_t(k++) % size == rank) verify_record(file.id, records[i], path, host, &places);
    } catch (const std::exception& e) {
      error = e.what();
    }
  agree(world, path, error);
  if (!model_only) opt.set_step_count(state.optimizer_step);
  return state;
}

}  // namespace meshtrain

namespace meshtrain {

std::vector<ParameterPiece> local_parameter_pieces(const Transformer& model, const std::vector<LocalShard>& shards) {
  std::vector<ParameterPiece> out;
  const bool replicated = model.flat_params().defined();
  std::unordered_map<const Parameter*, std::vector<size_t>> shards_of;
  for (size_t i = 0; i < shards.size(); ++i) shards_of[shards[i].param].push_back(i);
  for (Parameter* p : model.parameters()) {
    if (replicated) out.push_back({p, p->value.reshape({p->value.numel()}), 0});
    else
      for (size_t i : shards_of[p]) out.push_back({p, shards[i].value, shards[i].first_elem});
  }
  std::erase_if(out, [](const ParameterPiece& r) { return r.dst.numel() == 0; });
  return out;
}

void agree_on_outcome(MPI_Comm world, const std::string& path, const std::string& local_error) {
  agree(world, path, local_error);
}

}  // namespace meshtrain
