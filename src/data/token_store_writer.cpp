#include "data/token_store_writer.hpp"

#include <hdf5.h>

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

void write_1d(hid_t loc, const std::string& path, const char* name, hid_t file_type, hid_t mem_type, const void* data,
              hsize_t n) {
  H5Id space{H5Screate_simple(1, &n, nullptr), H5Sclose};
  H5Id dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  if (n >= 4096) {  // chunked + deflate for large arrays; h5py and h5dump read it transparently
    const hsize_t chunk = std::min<hsize_t>(n, 1 << 20);
    H5Pset_chunk(dcpl.id, 1, &chunk);
    H5Pset_deflate(dcpl.id, 4);
  }
  H5Id ds{H5Dcreate2(loc, name, file_type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
  if (ds.id < 0 || (n && H5Dwrite(ds.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
    fail(path, std::string("cannot write dataset ") + name);
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

}  // namespace

bool is_validation_document(int64_t index, double fraction) {
  return double(splitmix64(0xD0C5u ^ uint64_t(index)) % 1000000u) < fraction * 1e6;
}

TokenStoreSummary write_token_store(const std::string& path, const std::vector<Document>& docs, const Tokenizer& tok,
                                    double validation_fraction, const std::string& source_description) {
  if (docs.size() < 2) fail(path, "need at least 2 documents (one for train, one for validation), got " + std::to_string(docs.size()));
  std::vector<bool> is_val(docs.size());
  size_t n_val = 0;
  for (size_t i = 0; i < docs.size(); ++i) n_val += (is_val[i] = is_validation_document(int64_t(i), validation_fraction));
  if (n_val == 0) is_val.back() = true;                          // at least one validation document
  if (n_val == docs.size()) is_val.front() = false;              // and at least one for training
  TokenSplit split[2];
  for (auto& s : split) s.doc_offsets.push_back(0);
  for (size_t i = 0; i < docs.size(); ++i) {
    TokenSplit& s = split[is_val[i] ? 1 : 0];
    const auto ids = tok.encode_document(docs[i].text);
    s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
    s.doc_offsets.push_back(s.tokens.size());
  }
  const std::string tmp = path + ".tmp";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  {
    H5Id f{H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (f.id < 0) fail(tmp, "cannot create file");
    const hid_t token_type = tok.vocab_size() <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
    const char* names[2] = {"train", "validation"};
    for (int k = 0; k < 2; ++k) {
      H5Id g{H5Gcreate2(f.id, names[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
      write_1d(g.id, tmp, "tokens", token_type, H5T_NATIVE_INT32, split[k].tokens.data(), split[k].tokens.size());
      write_1d(g.id, tmp, "doc_offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, split[k].doc_offsets.data(),
               split[k].doc_offsets.size());
    }
    H5Id g{H5Gcreate2(f.id, "tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
    write_1d(g.id, tmp, "model", H5T_STD_U8LE, H5T_NATIVE_UINT8, tok.model_bytes().data(), tok.model_bytes().size());
    attr_str(g.id, tmp, "type", "sentencepiece");
    attr_i64(f.id, tmp, "vocab_size", tok.vocab_size());
    attr_i64(f.id, tmp, "format_version", 1);
    attr_i64(f.id, tmp, "eos_id", tok.eos_id());
    attr_i64(f.id, tmp, "bos_id", tok.bos_id());
    attr_str(f.id, tmp, "format", "meshtrain-token-store");
    attr_str(f.id, tmp, "source", source_description);
    if (H5Fflush(f.id, H5F_SCOPE_GLOBAL) < 0) fail(tmp, "flush failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, "cannot rename from " + tmp);
  }
  TokenStoreSummary s;
  s.train_docs = int64_t(split[0].doc_offsets.size() - 1);
  s.validation_docs = int64_t(split[1].doc_offsets.size() - 1);
  s.train_tokens = int64_t(split[0].tokens.size());
  s.validation_tokens = int64_t(split[1].tokens.size());
  s.vocab_size = tok.vocab_size();
  return s;
}

}  // namespace meshtrain
