#include "checkpoint/safetensors_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tensor/bf16.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian data");

// The specification caps the header at 100 MB; a larger length is a damaged or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kMergeGap = 1 << 20;         // read across a gap this small rather than seek
constexpr uint64_t kMaxReadBytes = 64ull << 20;  // one pread's buffer at most

[[noreturn]] void fail(const std::string& file, const std::string& what) { throw CheckpointError(file + ": " + what); }

// Reads exactly n bytes at `offset`, or throws naming `file`.
void pread_all(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& file) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail(file, r == 0 ? "unexpected end of file (truncated?)" : std::string("read error: ") + std::strerror(errno));
    p += r, n -= uint64_t(r), offset += uint64_t(r);
  }
}

int element_bytes_of(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

}  // namespace

struct SafetensorsFolder::OpenFile {
  int fd = -1;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

int SafetensorsTensor::element_bytes() const { return element_bytes_of(dtype); }

SafetensorsFolder::~SafetensorsFolder() = default;

int SafetensorsFolder::fd_of(const std::string& file) const { return files_.at(file)->fd; }

SafetensorsFolder::SafetensorsFolder(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::map<std::string, std::vector<std::string>> expected;  // file → tensor names weight_map puts there
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    const fs::path index = fs::path(path) / "model.safetensors.index.json", single = fs::path(path) / "model.safetensors";
    if (fs::is_regular_file(index, ec)) {
      nlohmann::json j;
      try {
        std::ifstream in(index);
        j = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        fail(index.string(), std::string("not a JSON safetensors index: ") + e.what());
      }
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail(index.string(), "no \"weight_map\" object (tensor name → shard file)");
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string()) fail(index.string(), "weight_map[\"" + name + "\"] is not a file name");
        const std::string f = (fs::path(path) / file.get<std::string>()).string();
        if (!expected.count(f)) files.push_back(f);
        expected[f].push_back(name);
      }
    } else if (fs::is_regular_file(single, ec)) {
      files.push_back(single.string());
    } else {
      fail(path, "holds neither model.safetensors nor model.safetensors.index.json (not a Hugging Face model folder)");
    }
  } else {
    files.push_back(path);
  }
  for (const std::string& f : files) {
    auto of = std::make_unique<OpenFile>();
    of->fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (of->fd < 0) fail(f, std::string("cannot open: ") + std::strerror(errno));
    struct stat st{};
    if (::fstat(of->fd, &st) != 0) fail(f, std::string("cannot stat: ") + std::strerror(errno));
    const uint64_t size = uint64_t(st.st_size);
    uint64_t header_len = 0;
    if (size < 8) fail(f, "shorter than a safetensors header length (8 bytes)");
    pread_all(of->fd, &header_len, 8, 0, f);
    if (header_len > kMaxHeaderBytes || header_len > size - 8)
      fail(f, "header length " + std::to_string(header_len) + " exceeds the file (" + std::to_string(size) +
                  " bytes) or the 100 MB limit: not a safetensors file");
    std::string text(header_len, '\0');
    pread_all(of->fd, text.data(), header_len, 8, f);
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      fail(f, std::string("safetensors header is not JSON: ") + e.what());
    }
    if (!h.is_object()) fail(f, "safetensors header is not a JSON object");
    const uint64_t data_start = 8 + header_len, data_bytes = size - data_start;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") continue;
      const std::string where = "tensor " + name;
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
          !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
        fail(f, where + ": needs dtype, shape and data_offsets [begin, end)");
      SafetensorsTensor t;
      t.file = f;
      t.dtype = v["dtype"].get<std::string>();
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) fail(f, where + ": shape holds a value that is not a non-negative integer");
        t.shape.push_back(d.get<int64_t>());
        numel *= d.get<uint64_t>();
      }
      const auto& off = v["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) fail(f, where + ": data_offsets are not integers");
      const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
      if (begin > end || end > data_bytes)
        fail(f, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                    ") fall outside the data section (" + std::to_string(data_bytes) + " bytes; truncated file?)");
      if (t.element_bytes() > 0 && end - begin != numel * uint64_t(t.element_bytes()))
        fail(f, where + ": " + std::to_string(end - begin) + " bytes of data for " + std::to_string(numel) + " " + t.dtype +
                    " elements");
      t.offset = data_start + begin;
      t.bytes = end - begin;
      tensors_[name] = std::move(t);
    }
    for (const std::string& name : expected[f])
      if (!tensors_.count(name) || tensors_[name].file != f)
        fail(f, "model.safetensors.index.json puts tensor " + name + " in this file, which does not hold it");
    ::posix_fadvise(of->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    files_[f] = std::move(of);
  }
}

const SafetensorsTensor* SafetensorsFolder::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t SafetensorsFolder::read(const std::string& name, std::vector<RowPiece> pieces) const {
  const SafetensorsTensor* t = find(name);
  if (!t) fail(path_, "no tensor " + name);
  const int eb = t->element_bytes();
  if (eb == 0)
    fail(t->file, "tensor " + name + " is " + t->dtype + ": loading it is not implemented yet (F32, BF16 and F16 are)");
  const int64_t rows = t->shape.size() >= 2 ? t->shape[0] : 1;
  const int64_t row_len = rows > 0 ? int64_t(t->bytes / uint64_t(eb)) / rows : 0;
  for (const RowPiece& p : pieces)
    if (p.row < 0 || p.row >= rows || p.col < 0 || p.count < 0 || p.col + p.count > row_len)
      fail(t->file, "tensor " + name + ": elements [" + std::to_string(p.col) + ", " + std::to_string(p.col + p.count) +
                        ") of row " + std::to_string(p.row) + " fall outside its [" + std::to_string(rows) + ", " +
                        std::to_string(row_len) + "] view");
  auto begin_of = [&](const RowPiece& p) { return t->offset + uint64_t(p.row * row_len + p.col) * uint64_t(eb); };
  std::sort(pieces.begin(), pieces.end(), [&](const RowPiece& a, const RowPiece& b) { return begin_of(a) < begin_of(b); });
  const int fd = fd_of(t->file);
  std::vector<char> buf;
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size();) {
    // One pread covers pieces [i, j): neighbours closer than kMergeGap, at most kMaxReadBytes.
    const uint64_t start = begin_of(pieces[i]);
    uint64_t end = start + uint64_t(pieces[i].count) * uint64_t(eb);
    size_t j = i + 1;
    for (; j < pieces.size(); ++j) {
      const uint64_t b = begin_of(pieces[j]), e = b + uint64_t(pieces[j].count) * uint64_t(eb);
      if (b > end + kMergeGap || std::max(e, end) - start > kMaxReadBytes) break;
      end = std::max(end, e);
    }
    buf.resize(end - start);
    pread_all(fd, buf.data(), end - start, start, t->file);
    total += end - start;
    for (size_t k = i; k < j; ++k) {
      const RowPiece& p = pieces[k];
      const char* src = buf.data() + (begin_of(p) - start);
      if (eb == 4) {
        std::memcpy(p.dst, src, size_t(p.count) * 4);
      } else if (t->dtype == "BF16") {
        for (int64_t x = 0; x < p.count; ++x) {
          uint16_t h;
          std::memcpy(&h, src + 2 * x, 2);
          p.dst[x] = float_from_bf16(h);
        }
      } else {
        for (int64_t x = 0; x < p.count; ++x) {
          _Float16 h;
          std::memcpy(&h, src + 2 * x, 2);
          p.dst[x] = float(h);
        }
      }
    }
    i = j;
  }
  return total;
}

}  // namespace meshtrain
