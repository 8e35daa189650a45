// Pre-tokenized conversations for tokenizers longtron does not run (Qwen2 and Llama 3 ship
// `tokenizer.json`): a `.jsonl` of {"input_ids": [...], "labels": [...]} rows in Hugging Face's
// aligned convention (labels[i] is input_ids[i] or -100; the model shifts), as XTuner and TRL write
// them. Each row is one document, taken as given (no BOS/EOS added).
#pragma once
#include <filesystem>
#include <memory>
#include <vector>

#include "data/dataset.h"

namespace longtron::data {

/// Reads the whole file into memory and serves each row as a document of stored ids: token i is
/// stored negated when labels[i] is -100, so that the packer's shift (label of position i-1 =
/// stored id i, -100 when <= 0) gives labels[i] as the target of position i-1. Without "labels"
/// every token but the first is a target. Throws Error naming the file and line for a row without
/// "input_ids" (raw text belongs to `prepare`), an empty row, a label that is neither -100 nor its
/// input id, or a negative id. A loss-carrying id 0 is served as kStoredLossZero. A file whose
/// first row holds "chosen_input_ids" is a file of preference pairs: open_preference_pairs.
std::unique_ptr<DocumentSource> open_pretokenized(const std::filesystem::path& file);

/// Writes `documents` (stored ids, as a DocumentSource serves them) as the rows that
/// open_pretokenized reads back to the same stored ids: input_ids[i] = stored_input, labels[i] =
/// input_ids[i] for a loss-carrying token and -100 otherwise (position 0 always -100). The one
/// on-disk format that holds a loss-carrying id 0. Throws Error naming `file` on an I/O failure.
void write_pretokenized(const std::filesystem::path& file,
                        const std::vector<const std::vector<int32_t>*>& documents);

}  // namespace longtron::data
