// The input checks of every embedding and every head + loss, whatever the parallel mode: token
// ids inside the vocabulary, labels inside it or the ignore index. One wording for every layout.
#pragma once
#include <cstdint>

namespace longtron::ops {

/// Throws Error "input_ids[n] = id is outside the vocabulary [0, V)" for the first id[n] of
/// ids[N] outside [0, V).
void check_token_ids(const int32_t* ids, int64_t N, int64_t V);

/// Throws Error "labels[n] = y is neither -100 nor inside the vocabulary [0, V)" for the first
/// label of labels[N] that is neither kIgnoreIndex (core/ignore_index.h) nor in [0, V).
void check_labels(const int32_t* labels, int64_t N, int64_t V);

}  // namespace longtron::ops
