// Opening a tokenized dataset whatever its format (docs/data.md).
#pragma once
#include <filesystem>

#include "data/dataset.h"

namespace longtron::data {

/// Opens `path`: a folder (every tokenized file below it, in sorted path order), a Megatron `.idx`
/// or its `.bin`, an InternEvo `.bin` of JSON lines (with or without `.bin.meta`), or a
/// pre-tokenized `.jsonl` of {"input_ids", "labels"} rows (data/pretokenized.h).
/// Throws Error naming the file (and offset/line) if anything is malformed, or if the dataset has
/// no documents.
Dataset open_dataset(const std::filesystem::path& path);

}  // namespace longtron::data
