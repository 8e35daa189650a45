// Tensor-parallel layers (see layers.h). The GEMMs are ops::gemm / ops::linear_forward; the
// communication is the mappings' collectives, issued asynchronously in backward where a GEMM that
// does not depend on them can run meanwhile (Megatron's allreduce_dgrad overlap).
#include "parallel/layers.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/ignore_index.h"
#include "ops/fast_math.h"
#include "ops/ops.h"
#include "parallel/mappings.h"

namespace longtron::parallel {
namespace {

// Rows of this rank's sequence shard; N must divide evenly (the layout validation ensures it).
int64_t shard_rows(int64_t N, Communicator& comm) {
  check(N % comm.size() == 0,
        "sequence parallel: the row of {} tokens is not divisible by the tensor-parallel size {}",
        N, comm.size());
  return N / comm.size();
}

}  // namespace

Range shard_range(int64_t total, int parts, int rank) {
  check(parts >= 1 && rank >= 0 && rank < parts, "shard_range: rank {} outside [0, {})", rank,
        parts);
  int64_t base = total / parts, extra = total % parts;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

// ---- ColumnParallelLinear ------------------------------------------------------------------------

void column_parallel_forward(float* y, float* x_full, const float* x, const float* W,
                             const float* bias, int64_t N, int64_t in, int64_t out_local,
                             SequenceParallel sp, Communicator& comm) {
  const float* X = x;
  if (sp != SequenceParallel::kNone) {
    check(x_full != nullptr, "column_parallel_forward: sequence parallel needs an x_full buffer");
    all_gather_first_dim_forward(x_full, x, N, in, comm);
    X = x_full;
  }
  ops::linear_forward(y, X, W, bias, N, in, out_local);
}

void column_parallel_backward(float* dx, float* dW, float* dbias, const float* dy, float* x_full,
                              const float* x, const float* W, int64_t N, int64_t in,
                              int64_t out_local, SequenceParallel sp, Communicator& comm) {
  const float* X = x;
  comm::Work gather;
  if (sp != SequenceParallel::kNone) {
    int64_t rows = shard_rows(N, comm);
    check(x_full != nullptr, "column_parallel_backward: sequence parallel needs an x_full buffer");
    // FSP kept only the shard: gather it again, overlapped with the input-gradient GEMM.
    if (sp == SequenceParallel::kRegather)
      gather = comm.all_gather_async(x_full, x, rows * in);
    X = x_full;
  }
  comm::Work reduce;
  std::vector<float> dx_partial;
  if (dx != nullptr) {
    // dX = dY·W_r is a partial sum over the output features each rank holds.
    float* target = dx;
    if (sp != SequenceParallel::kNone) {
      dx_partial.resize(size_t(N * in));
      target = dx_partial.data();
    }
    ops::gemm(false, false, N, in, out_local, 1.0f, dy, W, 0.0f, target);
    if (sp == SequenceParallel::kNone)
      reduce = comm.all_reduce_async(dx, N * in);
    else {
      gather.wait();  // MPI progresses collectives in issue order; finish the gather first
      reduce = comm.reduce_scatter_async(dx, dx_partial.data(), N / comm.size() * in);
    }
  }
  gather.wait();
  if (dW != nullptr) ops::linear_weight_grad(dW, dy, X, N, in, out_local);
  ops::bias_grad(dbias, dy, N, out_local);
  reduce.wait();
}

// ---- RowParallelLinear ---------------------------------------------------------------------------

void row_parallel_forward(float* y, const float* x, const float* W, const float* bias, int64_t N,
                          int64_t in_local, int64_t out, SequenceParallel sp, Communicator& comm) {
  int64_t rows = N;
  if (sp == SequenceParallel::kNone) {
    ops::linear_forward(y, x, W, static_cast<const float*>(nullptr), N, in_local, out);
    reduce_from_group_forward(y, N * out, comm);
  } else {
    rows = shard_rows(N, comm);
    std::vector<float> partial(size_t(N * out));
    ops::linear_forward(partial.data(), x, W, static_cast<const float*>(nullptr), N, in_local,
                        out);
    reduce_scatter_first_dim_forward(y, partial.data(), N, out, comm);
  }
  // The bias is added once, after the reduction (adding it before would count it T times).
  if (bias != nullptr)
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t o = 0; o < out; ++o) y[n * out + o] += bias[o];
}

void row_parallel_backward(float* dx, float* dW, float* dbias, const float* dy, const float* x,
                           const float* W, int64_t N, int64_t in_local, int64_t out,
                           SequenceParallel sp, Communicator& comm) {
  const float* dY = dy;
  std::vector<float> dy_full;
  int64_t rows = N;
  if (sp != SequenceParallel::kNone) {
    rows = shard_rows(N, comm);
    dy_full.resize(size_t(N * out));
    reduce_scatter_first_dim_backward(dy_full.data(), dy, N, out, comm);
    dY = dy_full.data();
  }
  if (dx != nullptr) ops::gemm(false, false, N, in_local, out, 1.0f, dY, W, 0.0f, dx);
  if (dW != nullptr) ops::linear_weight_grad(dW, dY, x, N, in_local, out);
  ops::bias_grad(dbias, dy, rows, out);
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

}  // namespace longtron::parallel
