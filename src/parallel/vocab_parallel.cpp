// Tensor-parallel layers (see vocab_parallel.h): vocab-parallel cross-entropy, the hidden-split and the
// vocab-parallel embedding.
#include "parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/ignore_index.h"
#include "ops/fast_math.h"
#include "ops/ops.h"
#include "ops/threads.h"
#include "parallel/mappings.h"

namespace longtron::parallel {

Range shard_range(int64_t total, int parts, int rank) {
  check(parts >= 1 && rank >= 0 && rank < parts, "shard_range: rank {} outside [0, {})", rank,
        parts);
  int64_t base = total / parts, extra = total % parts;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

// ---- Vocab-parallel cross-entropy ----------------------------------------------------------------

double vocab_parallel_cross_entropy_forward(float* lse, int64_t* count, const float* logits,
                                            const int32_t* labels, int64_t N, int64_t V_local,
                                            int64_t vocab_start, Communicator& comm) {
  // 1. Global row max (all-reduce MAX); a rank with no vocabulary contributes -inf.
  std::vector<float> row_max(size_t(N), -std::numeric_limits<float>::infinity());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V_local; ++v)
      row_max[size_t(n)] = std::max(row_max[size_t(n)], logits[n * V_local + v]);
  comm.all_reduce(row_max.data(), N, comm::ReduceOp::kMax);
  // 2. One SUM all-reduce of (Σ exp(z − max), target logit, owner count) per row.
  std::vector<double> acc(size_t(3 * N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V_local;
    const float m = row_max[size_t(n)];
    double sum = 0.0;
    for (int64_t v = 0; v < V_local; ++v) sum += double(ops::detail::fast_exp(row[v] - m));
    acc[size_t(3 * n)] = sum;
    int64_t local = int64_t(labels[n]) - vocab_start;
    if (labels[n] != kIgnoreIndex && local >= 0 && local < V_local) {
      acc[size_t(3 * n + 1)] = double(row[local]);
      acc[size_t(3 * n + 2)] = 1.0;
    }
  }
  comm.all_reduce(acc.data(), 3 * N);
  // 3. loss = lse − target logit over the valid rows; every rank sees the same reduced values, so
  // a label no rank owns raises the same error everywhere.
  double loss = 0.0;
  int64_t valid = 0;
  for (int64_t n = 0; n < N; ++n) {
    lse[n] = float(double(row_max[size_t(n)]) + std::log(acc[size_t(3 * n)]));
    if (labels[n] == kIgnoreIndex) continue;
    check(acc[size_t(3 * n + 2)] == 1.0,
          "vocab-parallel cross-entropy: label {} at token {} is outside the vocabulary and is "
          "not -100",
          labels[n], n);
    loss += double(lse[n]) - acc[size_t(3 * n + 1)];
    ++valid;
  }
  if (count != nullptr) *count = valid;
  return loss;
}

void vocab_parallel_cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                           const int32_t* labels, int64_t N, int64_t V_local,
                                           int64_t vocab_start, float scale) {
  for (int64_t n = 0; n < N; ++n) {
    float* d = dlogits + n * V_local;
    if (labels[n] == kIgnoreIndex) {
      std::fill(d, d + V_local, 0.0f);
      continue;
    }
    const float* row = logits + n * V_local;
    const float l = lse[n];
    for (int64_t v = 0; v < V_local; ++v) d[v] = scale * ops::detail::fast_exp(row[v] - l);
    int64_t local = int64_t(labels[n]) - vocab_start;
    if (local >= 0 && local < V_local) d[local] -= scale;
  }
}

// ---- Hidden-split embedding ----------------------------------------------------------------------

void split_hidden_embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N,
                                    int64_t H, Communicator& comm) {
  const int T = comm.size();
  Range mine = shard_range(H, T, comm.rank());
  std::vector<float> local(size_t(N * mine.count));
  ops::embedding_forward(local.data(), ids, table, N, mine.count);
  std::vector<int64_t> counts(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) counts[size_t(r)] = N * shard_range(H, T, r).count;
  std::vector<float> staged(size_t(N * H));  // [rank][N, H_r]
  comm.all_gather_v(staged.data(), local.data(), counts);
  const float* chunk = staged.data();
  for (int r = 0; r < T; ++r) {
    Range cols = shard_range(H, T, r);
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(out + n * H + cols.start, chunk + n * cols.count, size_t(cols.count) * sizeof(float));
    chunk += N * cols.count;
  }
}

void split_hidden_embedding_backward(float* dtable, const float* dout, const int32_t* ids,
                                     int64_t N, int64_t H, Communicator& comm) {
  Range mine = shard_range(H, comm.size(), comm.rank());
  std::vector<float> local(size_t(N * mine.count));
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(local.data() + n * mine.count, dout + n * H + mine.start,
                size_t(mine.count) * sizeof(float));
  ops::embedding_backward(dtable, local.data(), ids, N, mine.count);
}

// ---- Vocab-parallel embedding ------------------------------------------------------------------

void vocab_parallel_embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N,
                                      int64_t H, int64_t vocab_start, int64_t V_local) {
#pragma omp parallel for schedule(static) if (N * H > kParallelMinWorkLarge)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t local = int64_t(ids[n]) - vocab_start;
    float* row = out + n * H;
    if (local >= 0 && local < V_local) std::memcpy(row, table + local * H, size_t(H) * sizeof(float));
    else std::fill(row, row + H, 0.0f);
  }
}

void vocab_parallel_embedding_backward(float* dtable, const float* dout, const int32_t* ids,
                                       int64_t N, int64_t H, int64_t vocab_start, int64_t V_local) {
  // Repeated ids add into one row: threads split the hidden dim (ops::embedding_backward's rule).
  const int64_t blocks = (H + 63) / 64;
#pragma omp parallel for schedule(static) if (N * H > kParallelMinWorkLarge)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * 64, end = std::min(begin + 64, H);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t local = int64_t(ids[n]) - vocab_start;
      if (local < 0 || local >= V_local) continue;
      float* row = dtable + local * H;
      const float* g = dout + n * H;
      for (int64_t i = begin; i < end; ++i) row[i] += g[i];
    }
  }
}

}  // namespace longtron::parallel
