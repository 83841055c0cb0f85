#include "data/token_store_writer.hpp"

#include <hdf5.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "util/errors.hpp"
#include "util/rng.hpp"

namespace meshtrain {

namespace {

struct H5Id {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Id() {
    if (id >= 0) close(id);
  }
};

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw DataError(path + ": " + what); }

int comm_rank(MPI_Comm c) {
  int r = 0;
  if (c != MPI_COMM_NULL) MPI_Comm_rank(c, &r);
  return r;
}
int comm_size(MPI_Comm c) {
  int n = 1;
  if (c != MPI_COMM_NULL) MPI_Comm_size(c, &n);
  return n;
}

// Every rank learns whether any rank failed; all then throw the lowest failing rank's message,
// so no rank waits in a collective that a failed rank will never join.
void agree_on_failure(MPI_Comm comm, const std::string& error) {
  if (comm == MPI_COMM_NULL) {
    if (!error.empty()) throw DataError(error);
    return;
  }
  const int me = comm_rank(comm), size = comm_size(comm);
  int first = error.empty() ? size : me;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  int len = me == first ? int(error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  std::string msg(me == first ? error : std::string(size_t(len), ' '));
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, comm);
  throw DataError(msg);
}

}  // namespace

void run_on_every_rank(MPI_Comm comm, const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const DataError& e) {
    error = e.what();
  } catch (const std::exception& e) {
    error = std::string("data prepare: ") + e.what();
  }
  agree_on_failure(comm, error);
}

namespace {

// Sums over ranks: the exclusive prefix (this rank's base) and the total.
void scan(MPI_Comm comm, const int64_t* local, int64_t* base, int64_t* total, int n) {
  for (int i = 0; i < n; ++i) base[i] = 0, total[i] = local[i];
  if (comm == MPI_COMM_NULL) return;
  MPI_Exscan(local, base, n, MPI_INT64_T, MPI_SUM, comm);
  if (comm_rank(comm) == 0)
    for (int i = 0; i < n; ++i) base[i] = 0;  // MPI_Exscan leaves rank 0's buffer undefined
  MPI_Allreduce(local, total, n, MPI_INT64_T, MPI_SUM, comm);
}

// One rank's documents of one split, in corpus order.
struct SplitPart {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> starts;  // local start of each document in `tokens`
};

// Creates a contiguous 1-D dataset of `total` elements and writes this rank's `count` elements
// at `offset` (collectively when `dxpl` says so; a rank with nothing selects none). Contiguous,
// not chunked + deflate: parallel HDF5 builds without parallel filtered writes (Debian's 1.10)
// cannot compress collectively, and one layout for every number of ranks keeps stores identical.
void write_slab(hid_t loc, const std::string& path, const char* name, hid_t file_type, hid_t mem_type,
                const void* data, hsize_t total, hsize_t offset, hsize_t count, hid_t dxpl) {
  H5Id space{H5Screate_simple(1, &total, nullptr), H5Sclose};
  H5Id ds{H5Dcreate2(loc, name, file_type, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) fail(path, std::string("cannot create dataset ") + name);
  if (total == 0) return;
  H5Id mem{H5Screate_simple(1, count ? &count : &total, nullptr), H5Sclose};
  if (count) {
    H5Sselect_hyperslab(space.id, H5S_SELECT_SET, &offset, nullptr, &count, nullptr);
  } else {
    H5Sselect_none(space.id);
    H5Sselect_none(mem.id);
  }
  if (H5Dwrite(ds.id, mem_type, mem.id, space.id, dxpl, data) < 0) fail(path, std::string("cannot write dataset ") + name);
}

void attr_i64(hid_t loc, const std::string& path, const char* name, int64_t v) {
  H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
  H5Id a{H5Acreate2(loc, name, H5T_STD_I64LE, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  if (a.id < 0 || H5Awrite(a.id, H5T_NATIVE_INT64, &v) < 0) fail(path, std::string("cannot write attribute ") + name);
}

void attr_str(hid_t loc, const std::string& path, const char* name, const std::string& v) {
  H5Id type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, std::max<size_t>(1, v.size()));
  H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
  H5Id a{H5Acreate2(loc, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  if (a.id < 0 || H5Awrite(a.id, type.id, v.empty() ? " " : v.c_str()) < 0)
    fail(path, std::string("cannot write attribute ") + name);
}

hid_t token_file_type(int64_t vocab) {
  return vocab <= 256 ? H5T_STD_U8LE : vocab <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
}

using Visit = std::function<int64_t(const std::function<void(Document&&)>&)>;

TokenStoreSummary prepare(const std::string& path, const Visit& visit, const Tokenizer& tok, double frac,
                          const std::string& source, uint64_t input_bytes, MPI_Comm comm) {
  const int me = comm_rank(comm), nranks = comm_size(comm);
  // 1. This rank's documents, encoded in corpus order.
  std::vector<int32_t> tokens;
  std::vector<uint64_t> lengths;
  int64_t skipped = 0;
  run_on_every_rank(comm, [&] {
    skipped = visit([&](Document&& d) {
      const auto ids = tok.encode_document(d.text);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      lengths.push_back(ids.size());
    });
  });
  // 2. Global document indices decide the split; at least one document in each.
  int64_t n_docs = int64_t(lengths.size()), doc_base = 0, n_total = 0;
  scan(comm, &n_docs, &doc_base, &n_total, 1);
  if (n_total < 2)
    fail(path, "need at least 2 non-empty documents (one for train, one for validation), got " + std::to_string(n_total));
  int64_t n_val_local = 0, n_val = 0, unused = 0;
  for (int64_t i = 0; i < n_docs; ++i) n_val_local += is_validation_document(doc_base + i, frac);
  scan(comm, &n_val_local, &unused, &n_val, 1);
  SplitPart part[2];
  for (int64_t i = 0, at = 0; i < n_docs; at += int64_t(lengths[size_t(i)]), ++i) {
    const int64_t g = doc_base + i;
    bool val = is_validation_document(g, frac);
    if (n_val == 0 && g == n_total - 1) val = true;  // at least one validation document
    if (n_val == n_total && g == 0) val = false;     // and at least one for training
    SplitPart& p = part[val ? 1 : 0];
    p.starts.push_back(p.tokens.size());
    p.tokens.insert(p.tokens.end(), tokens.begin() + at, tokens.begin() + at + int64_t(lengths[size_t(i)]));
  }
  tokens.clear();
  tokens.shrink_to_fit();
  int64_t local[5] = {int64_t(part[0].tokens.size()), int64_t(part[1].tokens.size()), int64_t(part[0].starts.size()),
                      int64_t(part[1].starts.size()), skipped};
  int64_t base[5], total[5];
  scan(comm, local, base, total, 5);
  // 3. One file, each rank writing its hyperslabs.
  const std::string tmp = path + ".tmp";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  run_on_every_rank(comm, [&] {
    H5Id fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
    H5Id dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
    if (comm != MPI_COMM_NULL) {
      H5Pset_fapl_mpio(fapl.id, comm, MPI_INFO_NULL);
      H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_COLLECTIVE);
    }
    H5Id f{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id), H5Fclose};
    if (f.id < 0) fail(tmp, "cannot create file");
    const char* names[2] = {"train", "validation"};
    for (int k = 0; k < 2; ++k) {
      H5Id g{H5Gcreate2(f.id, names[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      write_slab(g.id, tmp, "tokens", token_file_type(tok.vocab_size()), H5T_NATIVE_INT32, part[k].tokens.data(),
                 hsize_t(total[k]), hsize_t(base[k]), part[k].tokens.size(), dxpl.id);
      // Offsets are global: this rank's starts shifted by its token base; the last rank adds the end.
      std::vector<uint64_t> offsets;
      for (const uint64_t s : part[k].starts) offsets.push_back(uint64_t(base[k]) + s);
      if (me == nranks - 1) offsets.push_back(uint64_t(total[k]));
      write_slab(g.id, tmp, "doc_offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, offsets.data(), hsize_t(total[2 + k] + 1),
                 hsize_t(base[2 + k]), offsets.size(), dxpl.id);
    }
    H5Id g{H5Gcreate2(f.id, "tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
    attr_str(g.id, tmp, "type", tok.type());
    for (const TokenizerFile& file : tok.files())
      write_slab(g.id, tmp, file.name.c_str(), H5T_STD_U8LE, H5T_NATIVE_UINT8, file.bytes.data(), file.bytes.size(), 0,
                 me == 0 ? file.bytes.size() : 0, dxpl.id);
    attr_i64(g.id, tmp, "adds_bos", tok.adds_bos() ? 1 : 0);
    attr_i64(f.id, tmp, "vocab_size", tok.vocab_size());
    attr_i64(f.id, tmp, "format_version", 1);
    attr_i64(f.id, tmp, "eos_id", tok.eos_id());
    attr_i64(f.id, tmp, "bos_id", tok.bos_id());
    attr_str(f.id, tmp, "format", "meshtrain-token-store");
    attr_str(f.id, tmp, "source", source);
    if (H5Fflush(f.id, H5F_SCOPE_GLOBAL) < 0) fail(tmp, "flush failed");
  });
  run_on_every_rank(comm, [&] {
    if (me == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      fail(path, "cannot rename from " + tmp);
    }
  });
  TokenStoreSummary s;
  s.train_tokens = total[0], s.validation_tokens = total[1];
  s.train_docs = total[2], s.validation_docs = total[3];
  s.skipped_lines = total[4];
  s.vocab_size = tok.vocab_size();
  s.input_bytes = input_bytes;
  return s;
}

}  // namespace

bool is_validation_document(int64_t index, double fraction) {
  return double(splitmix64(0xD0C5u ^ uint64_t(index)) % 1000000u) < fraction * 1e6;
}

TokenStoreSummary prepare_token_store(const PrepareRequest& r, MPI_Comm comm) {
  const int me = comm_rank(comm), n = comm_size(comm);
  const uint64_t bytes = r.files.empty() ? 0 : r.files.back().offset + r.files.back().bytes;
  const uint64_t begin = bytes * uint64_t(me) / uint64_t(n), end = bytes * uint64_t(me + 1) / uint64_t(n);
  const Visit visit = [&](const std::function<void(Document&&)>& doc) {
    auto last = std::chrono::steady_clock::now();
    uint64_t done = 0;  // document bytes so far: the progress line's measure of this rank's share
    return for_each_document(r.files, begin, end, r.options, [&](Document&& d) {
      done += d.text.size();
      doc(std::move(d));
      if (r.progress && std::chrono::steady_clock::now() - last > std::chrono::seconds(2)) {
        last = std::chrono::steady_clock::now();
        r.progress(done, end - begin);
      }
    });
  };
  return prepare(r.output, visit, *r.tokenizer, r.validation_fraction, r.source_description, bytes, comm);
}

TokenStoreSummary write_token_store(const std::string& path, const std::vector<Document>& docs, const Tokenizer& tok,
                                    double validation_fraction, const std::string& source_description) {
  const Visit visit = [&](const std::function<void(Document&&)>& doc) {
    for (const Document& d : docs) doc(Document(d));
    return int64_t(0);
  };
  return prepare(path, visit, tok, validation_fraction, source_description, 0, MPI_COMM_NULL);
}

}  // namespace meshtrain
