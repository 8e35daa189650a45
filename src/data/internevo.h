// InternEvo's tokenized format (docs/data.md): X.bin = JSON lines {"tokens": [int, ...]}, X.bin.meta =
// .npy of (byte offset, token count[, index]) per line. Reader and writer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "data/dataset.h"

namespace longtron::data {

/// Opens an InternEvo `.bin` (memory-mapped). With `X.bin.meta` present its rows give each
/// document's line offset (which must start a line) and length (int32/int64, (N,2) or (N,3) using
/// column 1); without it the
/// file is scanned once and the meta rebuilt in memory (never written: the data may be read-only).
/// A document is parsed when read_tokens asks for it, and checked then: a line that is not
/// {"tokens": [int32, ...]} or whose length disagrees with the meta throws Error naming the file,
/// the line number and byte offset. Blank lines are skipped when scanning.
std::unique_ptr<DocumentSource> open_internevo(const std::filesystem::path& bin_path);

/// Streams documents to an InternEvo `.bin`; finish() writes `.bin.meta` as int64 (N, 2).
class InternEvoWriter {
 public:
  explicit InternEvoWriter(const std::filesystem::path& bin_path);
  void add_document(const int32_t* tokens, size_t count);
  /// Closes the .bin and writes the .meta. Throws Error on an I/O failure.
  void finish();
  size_t num_documents() const { return lengths_.size(); }

 private:
  std::filesystem::path path_;
  std::ofstream bin_;
  int bin_errno_ = 0;  ///< errno of the first failed write (its cause, for the message)
  std::vector<int64_t> offsets_;
  std::vector<int64_t> lengths_;
  int64_t bytes_ = 0;
  std::string line_;
};

}  // namespace longtron::data
