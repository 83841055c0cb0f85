#pragma once
/// @file Reading a Hugging Face model folder's tensors by byte range: `model.safetensors`, or the
/// shards `model.safetensors.index.json` lists (its "weight_map": tensor name → file). The
/// safetensors layout (Hugging Face's safetensors specification): an 8-byte little-endian header
/// length N, N bytes of JSON {name: {dtype, shape, data_offsets [begin, end)}}, then the data
/// section, row-major, little-endian. Only the headers are parsed up front; a rank then reads
/// only the rows of the tensors it holds, with pread, in file order.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string file;            ///< the .safetensors file holding it
  std::string dtype;           ///< "F32", "BF16" or "F16" (others are refused when read)
  std::vector<int64_t> shape;  ///< row-major
  uint64_t offset = 0;         ///< absolute byte offset of element 0 in `file`
  uint64_t bytes = 0;          ///< size of the data (bytes)
  /// Bytes per element of dtype; 0 for a dtype this reader does not convert.
  int element_bytes() const;
};

/// A piece of one row of a 2-D view of a tensor to copy into float32 memory: elements
/// [col, col + count) of row `row`, where the view is [shape[0], numel / shape[0]] (a 1-D
/// tensor is one row).
struct RowPiece {
  int64_t row = 0;
  int64_t col = 0;
  int64_t count = 0;
  float* dst = nullptr;  ///< `count` floats
};

/// The tensors of a Hugging Face model folder (or of one .safetensors file).
class SafetensorsFolder {
 public:
  /// Parses the headers: `path` is a folder holding model.safetensors.index.json (preferred) or
  /// model.safetensors, or a single .safetensors file.
  /// @throws CheckpointError naming the file: no safetensors in the folder, an unreadable file, a
  /// header longer than the file or not JSON, a tensor whose data_offsets fall outside the data
  /// section or disagree with its shape and dtype, a weight_map naming a missing file or a tensor
  /// its file lacks.
  explicit SafetensorsFolder(const std::string& path);
  ~SafetensorsFolder();
  SafetensorsFolder(const SafetensorsFolder&) = delete;
  SafetensorsFolder& operator=(const SafetensorsFolder&) = delete;

  /// The tensor `name`, or nullptr when the folder has none of that name.
  const SafetensorsTensor* find(const std::string& name) const;
  /// Every tensor, by name.
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  /// The folder or file given to the constructor.
  const std::string& path() const { return path_; }

  /// Copies `pieces` of tensor `name` into float32 (F32 copied, BF16 widened, F16 converted: all
  /// exact). Reads only those rows' bytes, sorted by offset, with neighbouring pieces less than
  /// 1 MiB apart merged into one pread of at most 64 MiB. Returns the bytes read from disk.
  /// @throws CheckpointError naming the file and tensor: no such tensor, a dtype other than F32 /
  /// BF16 / F16 ("not implemented yet"), a piece outside the tensor, a short read.
  uint64_t read(const std::string& name, std::vector<RowPiece> pieces) const;

 private:
  struct OpenFile;
  int fd_of(const std::string& file) const;

  std::string path_;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::unique_ptr<OpenFile>> files_;
};

}  // namespace meshtrain
