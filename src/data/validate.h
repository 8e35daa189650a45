// Checks a tokenized dataset against a vocabulary before training or after prepare (docs/data.md).
#pragma once
#include <cstdint>

#include "data/dataset.h"
#include "data/progress_hook.h"

namespace longtron::data {

/// Reads every document of `dataset` once and throws Error naming the file, document index and
/// token position for the first empty (0-token) document or token id with abs(id) >= vocab_size
/// (negative ids mean "input, no loss", so their absolute value is checked). Also surfaces any
/// format error the reader finds (e.g. an InternEvo line disagreeing with its .meta).
/// `progress` (may be null) sees one pass "checking token ids" counted in tokens.
void validate_dataset(const Dataset& dataset, int64_t vocab_size, ProgressHook* progress = nullptr);

/// Total token count of all documents of `dataset`.
int64_t count_tokens(const Dataset& dataset);

/// Total document count of `dataset`.
int64_t count_documents(const Dataset& dataset);

}  // namespace longtron::data
