// Megatron-LM "MMap indexed dataset" (X.idx + X.bin), docs/data.md: reader and writer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "data/dataset.h"

namespace longtron::data {

/// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py DType).
enum class MegatronDtype : uint8_t {
  kUint8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6, kFloat32 = 7, kUint16 = 8
};

/// Bytes per token of a dtype code.
size_t megatron_dtype_size(MegatronDtype dtype);

/// The dtype `prepare` writes: uint16 when vocab_size < 65500, else int32 (docs/data.md).
MegatronDtype megatron_dtype_for_vocab(int64_t vocab_size);

/// Opens `prefix`.idx and `prefix`.bin (memory-mapped). The .idx is validated whole at open:
/// magic, version 1, dtype code, that the header's counts give exactly the .idx size, that the
/// pointers are the running sum of the sizes (so aligned to the dtype) and tile the .bin exactly,
/// and that doc_idx runs non-decreasing from 0 to the sequence count. Errors name the file and the
/// byte offset; untrusted counts never wrap around in the arithmetic or the message. A document is
/// sequences doc_idx[i] .. doc_idx[i+1]-1 concatenated. Float and int64 tokens must be integers
/// within int32 (checked when read).
std::unique_ptr<DocumentSource> open_megatron(const std::filesystem::path& prefix);

/// Streams a Megatron dataset to `prefix`.bin; finish() writes `prefix`.idx.
/// Values are stored as given, cast to the dtype (tests use every code).
class MegatronWriter {
 public:
  MegatronWriter(const std::filesystem::path& prefix, MegatronDtype dtype);
  /// Appends one sequence (of the current document).
  void add_sequence(const int64_t* tokens, size_t count);
  /// Closes the current document (doc_idx gets the sequence count so far).
  void end_document();
  /// One document of one sequence (what `prepare` writes).
  void add_document(const int32_t* tokens, size_t count);
  /// Writes the .idx and closes the .bin. Throws Error on an I/O failure.
  void finish();
  size_t num_documents() const { return doc_idx_.size() - 1; }

 private:
  std::filesystem::path prefix_;
  MegatronDtype dtype_;
  std::ofstream bin_;
  int bin_errno_ = 0;  ///< errno of the first failed write (its cause, for the message)
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_{0};
  int64_t bin_bytes_ = 0;
  std::vector<uint8_t> buffer_;
};

}  // namespace longtron::data
