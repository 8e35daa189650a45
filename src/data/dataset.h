// One interface over every tokenized format (docs/data.md): a file is a list of documents, each a run
// of token ids. The packer reads documents through it and never knows the format.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <climits>
#include <memory>
#include <string>
#include <vector>

namespace longtron::data {

/// The stored id of token 0 when it carries loss. A stored id is the token id when the token is a
/// target that carries loss and the negated id when it is not (InternEvo's convention), so 0
/// cannot say "carries loss" by its sign: Hugging Face byte-level vocabularies (Llama 3, Qwen2)
/// give id 0 to "!". Only pre-tokenized rows with labels and chat documents produce it; the
/// on-disk InternEvo and Megatron formats never hold it (a stored 0 there carries no loss).
inline constexpr int32_t kStoredLossZero = INT32_MIN;

/// Stored id -> the token id the model reads.
inline int32_t stored_input(int32_t stored) {
  return stored == kStoredLossZero ? 0 : (stored < 0 ? -stored : stored);
}
/// Stored id of a target -> its label (InternEvo collate: `label if label > 0 else -100`, with
/// kStoredLossZero as label 0).
inline int32_t stored_label(int32_t stored, int32_t ignore_index) {
  return stored > 0 ? stored : (stored == kStoredLossZero ? 0 : ignore_index);
}

/// Documents of one tokenized file (InternEvo .bin/.bin.meta or Megatron .idx/.bin), memory-mapped.
/// Token ids are returned as int32 exactly as stored: a negative id (or kStoredLossZero) is
/// decoded by the packer (stored_input, stored_label), not here.
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
