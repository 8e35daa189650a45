// Safetensors files (the Hugging Face tensor format): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the
// raw little-endian tensor bytes (offsets relative to the end of the header). Reading maps the file
// and decodes on demand; writing goes through write_atomically. Sharded folders are described by
// `model.safetensors.index.json` ({"metadata": ..., "weight_map": {tensor: shard file}}).
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/bf16.h"

namespace longtron::safetensors {

/// Element types we read and write (safetensors spelling: "F32", "BF16", ...).
enum class DType { F32, BF16, F16, F64, I64, I32 };

/// "F32", "BF16", ...
const char* dtype_name(DType dtype);
/// Bytes per element.
size_t dtype_size(DType dtype);
/// Parses a safetensors dtype string. Throws Error("<context>: unsupported dtype X ...") otherwise.
DType parse_dtype(std::string_view name, const std::string& context);

/// bfloat16 ↔ float: core/bf16.h's (named here too for the readers and writers of this format).
using ::longtron::bf16_to_float;
using ::longtron::float_to_bf16;
/// IEEE half bits → float (exact, subnormals and inf/NaN included).
float f16_to_float(uint16_t bits);
/// float → IEEE half bits, round to nearest even; overflow → ±inf, NaN stays NaN.
uint16_t float_to_f16(float value);

/// One tensor entry of a header. `begin`/`end` are byte offsets into the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  /// Product of shape (1 for a scalar, shape []).
  int64_t numel() const;
};

/// "[2, 3]" — for messages.
std::string shape_string(std::span<const int64_t> shape);

/// One safetensors file, memory-mapped read-only for the object's lifetime. The constructor
/// validates the whole header: throws Error naming the file (and tensor) when the file is shorter
/// than 8 bytes or than its header, the header is not JSON / not an object, an entry lacks
/// dtype/shape/data_offsets, a dtype is unknown, a shape is negative, offsets are reversed or lie
/// outside the file, or a byte range does not match numel × dtype size; when the header nests
/// deeper than 64 levels or names a tensor twice; and when the tensors do not tile the data bytes
/// exactly (an overlap, a hole, or bytes after the last tensor). Untrusted names and values appear
/// in messages shortened.
class File {
 public:
  explicit File(const std::filesystem::path& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Entries ordered by their data offset.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const;
  /// Throws Error "<file>: no tensor <name>" when absent.
  const TensorInfo& info(const std::string& name) const;
  /// The `__metadata__` object (empty object if none).
  const nlohmann::json& metadata() const { return metadata_; }
  /// The raw little-endian bytes of a tensor.
  std::span<const uint8_t> bytes(const std::string& name) const;
  /// Decodes a F32/BF16/F16/F64 tensor into `out` (numel floats). When `expected_shape` is given
  /// (non-empty span or `check_shape`), a different shape throws Error naming file, tensor and both
  /// shapes. Integer dtypes throw, and so does a NaN or infinite element (after conversion to
  /// float), naming the tensor and the element's index.
  void read_floats(const std::string& name, std::span<const int64_t> expected_shape, float* out,
                   bool check_shape = true) const;
  /// Decodes the block rows [row0, row0 + rows) × columns [col0, col0 + cols) of a F32/BF16/F16/
  /// F64 tensor seen as a matrix of shape[0] rows of numel / shape[0] values (a 1-D tensor: rows of
  /// one value; a scalar: one row) into out[rows × cols], row-major: one shard of a tensor, read
  /// from the mapping without decoding the rest. Throws Error naming the tensor when the block
  /// lies outside it, for an integer dtype, and for a NaN or infinite element (naming its index
  /// in the whole tensor).
  void read_block(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                  float* out) const;
  /// Bytes of tensor data decoded by read_floats and read_block so far (a load that reads each
  /// tensor once decodes the file's data bytes once).
  uint64_t bytes_decoded() const { return decoded_; }
  /// Bytes of tensor data in the file (after the header).
  uint64_t data_bytes() const { return size_ - data_start_; }
  /// Decodes a floating tensor to a new vector (no shape check).
  std::vector<float> read_floats(const std::string& name) const;
  /// Reads an I64/I32 tensor (any shape) as int64 values.
  std::vector<int64_t> read_ints(const std::string& name) const;
  /// Reads an F64/F32 tensor as doubles; a NaN or infinite element throws, as for read_floats.
  std::vector<double> read_doubles(const std::string& name) const;

 private:
  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  nlohmann::json metadata_ = nlohmann::json::object();
  mutable std::atomic<uint64_t> decoded_{0};

  // Throws Error naming the tensor and index of the first non-finite of `n` values.
  template <typename T>
  void check_finite(const T* values, size_t n, const std::string& name) const;
};

/// A checkpoint: a single `.safetensors` file, a folder holding `model.safetensors`, or a folder
/// holding `model.safetensors.index.json` whose `weight_map` names each tensor's shard. Shards are
/// opened once each. Throws Error naming the path when none of these is found, the index is not
/// valid JSON or lacks `weight_map`, a shard is missing, or a shard lacks a tensor the map puts there.
class Reader {
 public:
  /// `path`: a .safetensors file or a folder as above. `stem` chooses the file names in a folder
  /// ("model" → model.safetensors / model.safetensors.index.json).
  explicit Reader(const std::filesystem::path& path, const std::string& stem = "model");
  ~Reader();
  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// The file that holds `name`; throws Error "<path>: no tensor <name>" when absent.
  const File& file_of(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  /// Sum of the files' bytes_decoded() / data_bytes().
  uint64_t bytes_decoded() const;
  uint64_t data_bytes() const;
  /// As File::read_floats with a shape check.
  void read_floats(const std::string& name, std::span<const int64_t> expected_shape,
                   float* out) const;

 private:
  std::filesystem::path path_;
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, size_t> where_;  // tensor → index into files_
};

/// One tensor to write. Either `f32` (converted to `dtype`, which must then be F32, BF16 or F16)
/// or `raw` (bytes already in `dtype`, numel × dtype_size of them) is set.
struct WriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  const float* f32 = nullptr;
  const void* raw = nullptr;
};

/// Writes one safetensors file atomically (temporary name, then rename). Tensors are laid out in
/// the given order; the header is padded with spaces to a multiple of 8 bytes (as the reference
/// writer does). Throws Error on duplicate or empty names, a null source, an impossible
/// conversion, a negative dimension, or an I/O failure (naming the file). A non-empty
/// `progress_label` shows the write's progress on stderr under that label (core/progress.h) when
/// the data is kProgressMinBytes or more.
void write_file(const std::filesystem::path& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata = {},
                const std::string& progress_label = "");

/// Writes `tensors` as `<stem>-0000i-of-0000n.safetensors` shards of at most `max_shard_bytes` of
/// data each (a larger tensor gets a shard of its own) plus `<stem>.safetensors.index.json` with
/// metadata.total_size and weight_map, into the existing folder `dir`. Returns the shard count.
int write_sharded(const std::filesystem::path& dir, const std::vector<WriteTensor>& tensors,
                  uint64_t max_shard_bytes, const std::string& stem = "model",
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace longtron::safetensors
