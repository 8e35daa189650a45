// Preference pairs on disk (docs/preference.md): a `.jsonl` of TRL's tokenized columns, one pair a
// line, {"prompt_input_ids": [...], "chosen_input_ids": [...], "rejected_input_ids": [...]}. The
// pair's two sequences are prompt + chosen and prompt + rejected; loss falls on the answer ids.
// `longtron prepare --preference` writes this format; training reads it from data.train_folder.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace longtron::data {

/// The ids of one pair as TRL's tokenized columns hold them.
struct PairIds {
  std::vector<int32_t> prompt, chosen, rejected;
};

/// The pairs of one file as documents: document 2i is prompt + chosen of pair i, document 2i + 1
/// prompt + rejected, every id stored as a loss-carrying target (kStoredLossZero for id 0) so that
/// the packer's labels cover the prompt too (ORPO's NLL reads them); prompt_length() says where
/// the answer starts. The packer recognises the type and keeps a pair's two documents together
/// (packing/pair_pack.h).
class PairSource : public DocumentSource {
 public:
  /// `pairs`: every prompt, chosen and rejected non-empty (else Error naming `name` and the
  /// pair's line). `lines`: each pair's 1-based line in the file (empty: pair p is line p + 1).
  PairSource(std::vector<PairIds> pairs, std::filesystem::path name, std::vector<int64_t> lines = {});
  size_t num_documents() const override { return 2 * pairs_.size(); }
  size_t document_length(size_t i) const override;
  void read_tokens(size_t i, size_t begin, size_t count, int32_t* out) const override;
  const std::filesystem::path& path() const override { return name_; }
  /// Number of pairs (num_documents() / 2).
  size_t num_pairs() const { return pairs_.size(); }
  /// Prompt tokens at the start of document i (the same for both documents of a pair).
  size_t prompt_length(size_t i) const { return pairs_.at(i / 2).prompt.size(); }
  /// The 1-based line of pair p in its file (for messages).
  int64_t line_of(size_t p) const { return lines_.empty() ? int64_t(p) + 1 : lines_.at(p); }
  const PairIds& pair(size_t p) const { return pairs_.at(p); }

 private:
  const std::vector<int32_t>& answer(size_t i) const {
    return i % 2 == 0 ? pairs_.at(i / 2).chosen : pairs_.at(i / 2).rejected;
  }
  std::vector<PairIds> pairs_;
  std::filesystem::path name_;
  std::vector<int64_t> lines_;
};

/// Whether a parsed first line of a `.jsonl` is a preference pair (has "chosen_input_ids").
bool is_pair_row(const std::string& first_line);

/// Reads a whole pairs file. Throws Error naming the file and line for a line that is not an
/// object with the three arrays, an empty array, an id that is not an integer in [0, 2^31), or a
/// line with "input_ids" (a supervised row in a preference file).
std::unique_ptr<PairSource> open_preference_pairs(const std::filesystem::path& file);

/// Writes `pairs` in the format open_preference_pairs reads. Throws Error on an I/O failure.
void write_preference_pairs(const std::filesystem::path& file, const std::vector<PairIds>& pairs);

}  // namespace longtron::data
