// The adjoint pairs and the tensor-parallel layers on any number of ranks (included by
// mappings_np2_test and mappings_np4_test).
// - Each mapping f and its backward f*: <f(x), y> = <x, f*(y)>, where a replicated tensor is one
//   variable (counted once) and a per-rank tensor is the concatenation over ranks (summed).
// - Each layer's forward/backward against the single-rank ops on the same full tensors.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/error.h"
#include "mpi_test_main.h"
#include "ops/ops.h"
#include "parallel/activation_blocks.h"
#include "parallel/mappings.h"
#include "parallel/tp_linear.h"
#include "parallel/vocab_parallel.h"

namespace longtron::parallel {
namespace {

using longtron::testing::world;
using Vec = std::vector<float>;

Vec random_vec(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Vec v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Inner product in the space of the tensor: replicated → local (the same on every rank); per-rank →
// summed over the group.
double gdot(const Vec& a, const Vec& b, bool replicated, Communicator& comm) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  if (!replicated) comm.all_reduce(&s, 1);
  return s;
}

// A replicated result must be bitwise the same on every rank.
void expect_replicated(const Vec& v, Communicator& comm, const char* name) {
  Vec root = v;
  comm.broadcast(root.data(), int64_t(root.size()), 0);
  EXPECT_EQ(root, v) << name << ": not replicated";
}

using Map = std::function<void(float* out, const float* in)>;

void expect_adjoint(const char* name, int64_t n_in, bool in_rep, int64_t n_out, bool out_rep,
                    const Map& f, const Map& f_star) {
  Communicator& c = *world();
  unsigned r = unsigned(c.rank());
  Vec x = random_vec(n_in, in_rep ? 11u : 11u + 100u * r);
  Vec y = random_vec(n_out, out_rep ? 13u : 13u + 100u * r);
  Vec fx(static_cast<size_t>(n_out)), fy(static_cast<size_t>(n_in));
  f(fx.data(), x.data());
  f_star(fy.data(), y.data());
  if (out_rep) expect_replicated(fx, c, name);
  if (in_rep) expect_replicated(fy, c, name);
  double lhs = gdot(fx, y, out_rep, c), rhs = gdot(x, fy, in_rep, c);
  EXPECT_NEAR(lhs, rhs, 1e-5 * (1 + std::abs(lhs))) << name;
  EXPECT_GT(std::abs(lhs), 1e-3) << name << ": degenerate test";
}

// In-place mappings as out-of-place maps.
Map in_place(void (*op)(float*, int64_t, Communicator&), int64_t n) {
  return [op, n](float* out, const float* in) {
    std::copy(in, in + n, out);
    op(out, n, *world());
  };
}

TEST(Mappings, AdjointPairs) {
  Communicator& c = *world();
  const int64_t T = c.size(), rows = 4 * T, cols = 3 * T, n = rows * cols;
  expect_adjoint("copy_to_group", n, true, n, false, in_place(copy_to_group_forward, n),
                 in_place(copy_to_group_backward, n));
  expect_adjoint("reduce_from_group", n, false, n, true, in_place(reduce_from_group_forward, n),
                 in_place(reduce_from_group_backward, n));
  auto bind = [&](auto fn) {
    return [fn, rows, cols](float* out, const float* in) { fn(out, in, rows, cols, *world()); };
  };
  expect_adjoint("scatter_last_dim", n, true, n / T, false, bind(scatter_last_dim_forward),
                 bind(scatter_last_dim_backward));
  expect_adjoint("gather_last_dim", n / T, false, n, true, bind(gather_last_dim_forward),
                 bind(gather_last_dim_backward));
  expect_adjoint("scatter_first_dim", n, true, n / T, false, bind(scatter_first_dim_forward),
                 bind(scatter_first_dim_backward));
  expect_adjoint("all_gather_first_dim", n / T, false, n, false,
                 bind(all_gather_first_dim_forward), bind(all_gather_first_dim_backward));
  expect_adjoint("reduce_scatter_first_dim", n, false, n / T, false,
                 bind(reduce_scatter_first_dim_forward), bind(reduce_scatter_first_dim_backward));
  const int64_t n_local = 3, heads = 2 * T, d = 4, m = n_local * heads * d;
  expect_adjoint(
      "ulysses_scatter_heads", m, false, m, false,
      [&](float* o, const float* i) { ulysses_scatter_heads(o, i, n_local, heads, d, *world()); },
      [&](float* o, const float* i) { ulysses_gather_heads(o, i, n_local, heads, d, *world()); });
}

// The blocks of a sequence-parallel activation, for every x × y grid of the group: gather's adjoint
// is reduce_scatter (per-rank result) and take (replicated result), and take undoes gather.
TEST(Mappings, ActivationBlocksAdjointAndRoundTrip) {
  Communicator& c = *world();
  const int T = c.size();
  const int64_t N = 4 * T, H = 3 * T;
  for (int x = 1; x <= T; ++x) {
    if (T % x != 0) continue;
    const ActivationBlocks b = ActivationBlocks::grid(world(), x, T / x);
    const int64_t mine = b.block_rows(N) * (H / b.y);
    Scratch scratch;
    const Map gather = [&](float* out, const float* in) { b.gather(out, scratch, in, N, H); };
    const Map reduce_scatter = [&](float* out, const float* in) {
      b.reduce_scatter(out, scratch, in, N, H);
    };
    const Map take = [&](float* out, const float* in) { b.take(out, in, N, H); };
    expect_adjoint("blocks gather / reduce_scatter", mine, false, N * H, false, gather,
                   reduce_scatter);
    expect_adjoint("blocks gather / take", mine, false, N * H, true, gather, take);
    const Vec block = random_vec(mine, 7u + unsigned(c.rank()));
    Vec full(static_cast<size_t>(N * H)), back(static_cast<size_t>(mine));
    gather(full.data(), block.data());
    take(back.data(), full.data());
    EXPECT_EQ(back, block) << "x" << x << " y" << b.y;
  }
  EXPECT_THROW(ActivationBlocks::rows(world()).block_rows(4 * T + 1), Error);
}

TEST(Mappings, LastDimGatherLayout) {
  Communicator& c = *world();
  const int64_t T = c.size(), rows = 3, cols = 2 * T, cl = 2;
  Vec shard(static_cast<size_t>(rows * cl)), full(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cl; ++j) shard[size_t(i * cl + j)] = float(i * 100 + c.rank() * cl + j);
  gather_last_dim_forward(full.data(), shard.data(), rows, cols, c);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(full[size_t(i * cols + j)], float(i * 100 + j));
  EXPECT_THROW(gather_last_dim_forward(full.data(), shard.data(), rows, cols + 1, c), Error);
}

// in[t, h, e] = 10000·t + 100·h + e with t the global token: checks the exact [tokens, heads,
// head_dim] layout of both directions.
TEST(Mappings, UlyssesLayoutAndRoundTrip) {
  Communicator& c = *world();
  const int64_t T = c.size(), n_local = 3, heads = 2 * T, d = 2, hl = heads / T;
  Vec in(static_cast<size_t>(n_local * heads * d));
  for (int64_t t = 0; t < n_local; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t e = 0; e < d; ++e)
        in[size_t((t * heads + h) * d + e)] = float(10000 * (c.rank() * n_local + t) + 100 * h + e);
  Vec mid(in.size()), back(in.size());
  ulysses_scatter_heads(mid.data(), in.data(), n_local, heads, d, c);
  for (int64_t t = 0; t < T * n_local; ++t)
    for (int64_t h = 0; h < hl; ++h)
      for (int64_t e = 0; e < d; ++e)
        EXPECT_EQ(mid[size_t((t * hl + h) * d + e)], float(10000 * t + 100 * (c.rank() * hl + h) + e));
  ulysses_gather_heads(back.data(), mid.data(), n_local, heads, d, c);
  EXPECT_EQ(back, in);
}

// max |a − b| / max(1, max |b|)
double rel_err(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return diff / scale;
}

// Rows [r0, r0 + nr) and columns [c0, c0 + nc) of m[*, cols].
Vec block(const Vec& m, int64_t cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  Vec out(static_cast<size_t>(nr * nc));
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) out[size_t(i * nc + j)] = m[size_t((r0 + i) * cols + c0 + j)];
  return out;
}

constexpr double kTol = 1e-5;
const SequenceParallel kModes[] = {SequenceParallel::kNone, SequenceParallel::kKeepGathered,
                                   SequenceParallel::kRegather};

TEST(Layers, ColumnParallelMatchesOneRank) {
  Communicator& c = *world();
  const int64_t T = c.size(), r = c.rank(), N = 4 * T, in = 6, out = 5 * T, ol = out / T;
  Vec X = random_vec(N * in, 1), W = random_vec(out * in, 2), b = random_vec(out, 3);
  Vec dY = random_vec(N * out, 4);
  Vec Y(static_cast<size_t>(N * out)), dX(static_cast<size_t>(N * in)), dW(W.size(), 0.f), db(b.size(), 0.f);
  ops::linear_forward(Y.data(), X.data(), W.data(), b.data(), N, in, out);
  ops::linear_backward(dX.data(), dW.data(), db.data(), dY.data(), X.data(), W.data(), N, in, out);
  for (SequenceParallel sp : kModes) {
    const bool seq = sp != SequenceParallel::kNone;
    const int64_t rows = seq ? N / T : N, r0 = seq ? r * rows : 0;
    Vec x = block(X, in, r0, rows, 0, in), Wr = block(W, in, r * ol, ol, 0, in);
    Vec br(b.begin() + r * ol, b.begin() + (r + 1) * ol);
    Vec y(static_cast<size_t>(N * ol));
    LinearShared shared;  // Megatron's column linear: input rows over the group, no reduction
    TensorParallelLinear column(in, ol, TpLinearSpec{world(), sp, nullptr}, shared);
    column.forward(y.data(), x.data(), Wr.data(), br.data(), N);
    EXPECT_LT(rel_err(y.data(), block(Y, out, 0, N, r * ol, ol).data(), N * ol), kTol);
    // FSP must not rely on the gathered copy: spoil it.
    if (sp == SequenceParallel::kRegather)
      std::fill_n(shared.gathered->data(), shared.gathered->capacity(), NAN);
    Vec dy = block(dY, out, 0, N, r * ol, ol);
    Vec dx(x.size()), dWr(Wr.size(), 0.f), dbr(br.size(), 0.f);
    column.backward(dx.data(), dWr.data(), dbr.data(), dy.data(), x.data(), Wr.data(), N, false);
    EXPECT_LT(rel_err(dx.data(), block(dX, in, r0, rows, 0, in).data(), rows * in), kTol) << int(sp);
    EXPECT_LT(rel_err(dWr.data(), block(dW, in, r * ol, ol, 0, in).data(), ol * in), kTol) << int(sp);
    EXPECT_LT(rel_err(dbr.data(), db.data() + r * ol, ol), kTol) << int(sp);
  }
}

TEST(Layers, RowParallelMatchesOneRank) {
  Communicator& c = *world();
  const int64_t T = c.size(), r = c.rank(), N = 4 * T, in = 5 * T, il = in / T, out = 6;
  Vec X = random_vec(N * in, 5), W = random_vec(out * in, 6), b = random_vec(out, 7);
  Vec dY = random_vec(N * out, 8);
  Vec Y(static_cast<size_t>(N * out)), dX(static_cast<size_t>(N * in)), dW(W.size(), 0.f), db(b.size(), 0.f);
  ops::linear_forward(Y.data(), X.data(), W.data(), b.data(), N, in, out);
  ops::linear_backward(dX.data(), dW.data(), db.data(), dY.data(), X.data(), W.data(), N, in, out);
  for (SequenceParallel sp : kModes) {
    const bool seq = sp != SequenceParallel::kNone;
    const int64_t rows = seq ? N / T : N, r0 = seq ? r * rows : 0;
    Vec x = block(X, in, 0, N, r * il, il), Wr = block(W, in, 0, out, r * il, il);
    Vec y(static_cast<size_t>(rows * out));
    // Megatron's row linear: partial outputs all-reduced, or reduce-scattered under sequence
    // parallel.
    TensorParallelLinear row(il, out, TpLinearSpec{nullptr, SequenceParallel::kNone, world(), seq});
    row.forward(y.data(), x.data(), Wr.data(), b.data(), N);
    EXPECT_LT(rel_err(y.data(), block(Y, out, r0, rows, 0, out).data(), rows * out), kTol);
    Vec dy = block(dY, out, r0, rows, 0, out);
    Vec dx(x.size()), dWr(Wr.size(), 0.f), dbr(b.size(), 0.f);
    row.backward(dx.data(), dWr.data(), dbr.data(), dy.data(), x.data(), Wr.data(), N, false);
    EXPECT_LT(rel_err(dx.data(), block(dX, in, 0, N, r * il, il).data(), N * il), kTol) << int(sp);
    EXPECT_LT(rel_err(dWr.data(), block(dW, in, 0, out, r * il, il).data(), out * il), kTol);
    if (seq) c.all_reduce(dbr.data(), out);  // the caller's sum over the group (vocab_parallel.h)
    EXPECT_LT(rel_err(dbr.data(), db.data(), out), kTol) << int(sp);
  }
}

// One vocabulary split: rank r holds [starts[r], starts[r] + counts[r]).
void check_cross_entropy(int64_t V, const std::vector<int64_t>& starts,
                         const std::vector<int64_t>& counts) {
  Communicator& c = *world();
  const int64_t N = 7, r = c.rank();
  Vec logits = random_vec(N * V, 9);
  for (float& z : logits) z *= 4;
  std::vector<int32_t> labels = {3, -100, 0, int32_t(V - 1), 2, -100, 1};
  Vec lse(static_cast<size_t>(N)), dlogits(logits.size());
  int64_t count = 0;
  double loss = ops::cross_entropy_forward(lse.data(), &count, logits.data(), labels.data(), N, V);
  float scale = 1.0f / float(count);
  ops::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), labels.data(), N, V, scale);

  const int64_t start = starts[size_t(r)], vl = counts[size_t(r)];
  Vec z = block(logits, V, 0, N, start, vl), my_lse(static_cast<size_t>(N)), dz(z.size());
  int64_t my_count = -1;
  double my_loss = vocab_parallel_cross_entropy_forward(my_lse.data(), &my_count, z.data(),
                                                        labels.data(), N, vl, start, c);
  EXPECT_EQ(my_count, count);
  EXPECT_NEAR(my_loss, loss, 1e-5 * std::abs(loss));
  EXPECT_LT(rel_err(my_lse.data(), lse.data(), N), kTol);
  vocab_parallel_cross_entropy_backward(dz.data(), z.data(), my_lse.data(), labels.data(), N, vl,
                                        start, scale);
  EXPECT_LT(rel_err(dz.data(), block(dlogits, V, 0, N, start, vl).data(), N * vl), kTol);
  // Ignored rows: zero gradient.
  for (int64_t v = 0; v < vl; ++v) EXPECT_EQ(dz[size_t(1 * vl + v)], 0.f);
  // A label outside every rank's range is an error on every rank, never a silent loss.
  labels[4] = int32_t(V);
  EXPECT_THROW(vocab_parallel_cross_entropy_forward(my_lse.data(), &my_count, z.data(),
                                                    labels.data(), N, vl, start, c),
               Error);
}

TEST(Layers, VocabParallelCrossEntropyMatchesOneRank) {
  Communicator& c = *world();
  const int T = c.size();
  for (int64_t V : {int64_t(4 * T), int64_t(4 * T + 3)}) {  // even and uneven splits
    std::vector<int64_t> starts, counts;
    for (int r = 0; r < T; ++r) {
      Range range = shard_range(V, T, r);
      starts.push_back(range.start);
      counts.push_back(range.count);
    }
    check_cross_entropy(V, starts, counts);
  }
  // Rank 0 holds the whole vocabulary, the others none (V_local = 0 must work).
  std::vector<int64_t> starts(size_t(T), 6), counts(size_t(T), 0);
  starts[0] = 0;
  counts[0] = 6;
  check_cross_entropy(6, starts, counts);
}

TEST(Layers, SplitHiddenEmbeddingMatchesOneRank) {
  Communicator& c = *world();
  const int T = c.size();
  for (int64_t H : {int64_t(3 * T), int64_t(3 * T + 1)}) {
    const int64_t V = 9, N = 6;
    Vec table = random_vec(V * H, 10), dout = random_vec(N * H, 11);
    std::vector<int32_t> ids = {4, 0, 8, 4, 2, 7};
    Vec out(static_cast<size_t>(N * H)), dtable(table.size(), 0.f);
    ops::embedding_forward(out.data(), ids.data(), table.data(), N, H);
    ops::embedding_backward(dtable.data(), dout.data(), ids.data(), N, H);
    Range cols = shard_range(H, T, c.rank());
    Vec shard = block(table, H, 0, V, cols.start, cols.count);
    Vec my_out(out.size()), my_dtable(shard.size(), 0.f);
    split_hidden_embedding_forward(my_out.data(), ids.data(), shard.data(), N, H, c);
    EXPECT_EQ(my_out, out);
    split_hidden_embedding_backward(my_dtable.data(), dout.data(), ids.data(), N, H, c);
    EXPECT_LT(rel_err(my_dtable.data(), block(dtable, H, 0, V, cols.start, cols.count).data(),
                      V * cols.count),
              kTol);
  }
}

}  // namespace
}  // namespace longtron::parallel
