// One interface over every tokenized format (docs/data.md): a file is a list of documents, each a run
// of token ids. The packer reads documents through it and never knows the format.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace longtron::data {

/// Documents of one tokenized file (InternEvo .bin/.bin.meta or Megatron .idx/.bin), memory-mapped.
/// Token ids are returned as int32 exactly as stored: a negative id means "input, no loss"
/// (docs/data.md) and is handled by the packer, not here.
class DocumentSource {
 public:
  virtual ~DocumentSource() = default;
  /// Number of documents in the file.
  virtual size_t num_documents() const = 0;
  /// Token count of document i (i < num_documents()).
  virtual size_t document_length(size_t i) const = 0;
  /// Copies tokens [begin, begin + count) of document i into out[0, count).
  /// Throws Error naming the file and offset if the stored data is malformed.
  virtual void read_tokens(size_t i, size_t begin, size_t count, int32_t* out) const = 0;
  /// The file this source reads (for error messages).
  virtual const std::filesystem::path& path() const = 0;
};

/// A tokenized dataset: its files in sorted path order (packs never cross a file boundary).
using Dataset = std::vector<std::unique_ptr<DocumentSource>>;

}  // namespace longtron::data
