// Vocabulary checks of ids and labels (see vocab_check.h).
#include "ops/vocab_check.h"

#include "core/error.h"
#include "core/ignore_index.h"

namespace longtron::ops {

void check_token_ids(const int32_t* ids, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n)
    check(ids[n] >= 0 && ids[n] < V, "input_ids[{}] = {} is outside the vocabulary [0, {})", n,
          ids[n], V);
}

void check_labels(const int32_t* labels, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n)
    check(labels[n] == kIgnoreIndex || (labels[n] >= 0 && labels[n] < V),
          "labels[{}] = {} is neither {} nor inside the vocabulary [0, {})", n, labels[n],
          kIgnoreIndex, V);
}

}  // namespace longtron::ops
