// The 2D form of the tensor-parallel linear (parallel/tp_linear.h) against the dense linear on the
// same full tensors, for both role assignments (A = X, R = Y and A = Y, R = X), with and without a
// bias, each overlap option, and as the w1/w3 gate/up op. Rank (a, r) must hold: y = rows block r
// (of |R|) × out block a of the dense y; dx = rows block a × in block r of the dense dx; dW = block
// (a, r); db (summed over R) = out block a of the dense db.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "model/params.h"
#include "mpi_test_main.h"
#include "ops/ops.h"
#include "parallel/layout.h"
#include "parallel/tp_linear.h"

namespace longtron::testing {

inline std::vector<float> rand_floats(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(gen);
  return v;
}

/// Block [r0, r0+rows) × [c0, c0+cols) of full [*, C].
inline std::vector<float> sub(const std::vector<float>& full, int64_t C, int64_t r0, int64_t rows,
                              int64_t c0, int64_t cols) {
  std::vector<float> b(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) b[size_t(i * cols + j)] = full[size_t((r0 + i) * C + c0 + j)];
  return b;
}

inline double rel_err(const float* a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return diff / scale;
}

/// One case: groups (ag, rs), N tokens; a pair is the gate/up op (w1 and w3 sharing the input).
inline void check_linear_2d(const comm::CommPtr& ag, const comm::CommPtr& rs, int64_t N,
                            bool with_bias, parallel::Overlap2D overlap, bool pair) {
  model::ModelConfig c;
  c.vocab_size = 8, c.hidden_size = 16, c.num_layers = 1, c.num_attention_heads = 2;
  c.num_kv_attention_heads = 1, c.multiple_of = 1, c.qkv_bias = true;
  const model::ParamTable full(c);
  const int w = full.layers[0].wqkv, wb = full.layers[0].wqkv_bias;  // the second weight: w1's
  const int64_t out = full.view(w).shape[0], in = full.view(w).shape[1];  // 32 × 16
  const int A = ag->size(), R = rs->size(), a = ag->rank(), r = rs->rank();
  const int64_t ol = out / A, il = in / R, nA = N / A, nR = N / R;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& v : full.views()) shapes.push_back(v.shape);
  shapes[size_t(w)] = {ol, il};
  shapes[size_t(wb)] = {ol};
  const int w2 = full.layers[0].w1;  // second member of a pair: same shape as w
  shapes[size_t(w2)] = {ol, il};
  const model::ParamTable local = full.with_shapes(shapes);
  model::Params<float> p(local), g(local);
  g.zero();

  const auto W = rand_floats(out * in, 1), W2 = rand_floats(out * in, 2), b = rand_floats(out, 3);
  const auto x = rand_floats(N * in, 4), dy = rand_floats(N * out, 5), dy2 = rand_floats(N * out, 6);
  std::copy_n(sub(W, in, a * ol, ol, r * il, il).data(), ol * il, p.ptr(w));
  std::copy_n(sub(W2, in, a * ol, ol, r * il, il).data(), ol * il, p.ptr(w2));
  std::copy_n(b.data() + a * ol, ol, p.ptr(wb));

  // Dense reference (one process): y = x·Wᵀ + b, dx = dy·W (+ dy2·W2 for a pair).
  std::vector<float> y(N * out), y2(N * out), dx(N * in), dW(out * in, 0.f), dW2(out * in, 0.f), db(out, 0.f);
  ops::linear_forward(y.data(), x.data(), W.data(), with_bias ? b.data() : nullptr, N, in, out);
  ops::linear_forward(y2.data(), x.data(), W2.data(), static_cast<const float*>(nullptr), N, in, out);
  ops::linear_backward(dx.data(), dW.data(), db.data(), dy.data(), x.data(), W.data(), N, in, out);
  if (pair) {
    std::vector<float> dx2(N * in);
    ops::linear_backward(dx2.data(), dW2.data(), static_cast<float*>(nullptr), dy2.data(), x.data(),
                         W2.data(), N, in, out);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += dx2[i];
  }

  // Alone: one linear; pair: the gate/up op over (w, w2).
  const parallel::TpLinearSpec spec{ag, parallel::SequenceParallel::kKeepGathered, rs, true,
                                    overlap};
  parallel::TensorParallelLinearOp l1(local, w, with_bias ? wb : -1, spec);
  parallel::TensorParallelGateUp l12(local, w, w2, -1, -1, spec);
  const auto xl = sub(x, in, a * nA, nA, r * il, il);
  std::vector<float> yl(nR * ol), y2l(nR * ol), dxl(nA * il, 0.f);
  if (pair) l12.forward(yl.data(), y2l.data(), xl.data(), N, p);
  else l1.forward(yl.data(), xl.data(), N, p);
  const auto dyl = sub(dy, out, r * nR, nR, a * ol, ol), dy2l = sub(dy2, out, r * nR, nR, a * ol, ol);
  if (pair) l12.backward(dxl.data(), dyl.data(), dy2l.data(), xl.data(), N, p, &g);
  else l1.backward(dxl.data(), dyl.data(), xl.data(), N, p, &g, false);
  rs->all_reduce(g.ptr(wb), ol);  // the plan's bias SUM over R

  double e[6] = {rel_err(yl.data(), sub(y, out, r * nR, nR, a * ol, ol)),
                 rel_err(dxl.data(), sub(dx, in, a * nA, nA, r * il, il)),
                 rel_err(g.ptr(w), sub(dW, in, a * ol, ol, r * il, il)),
                 with_bias ? rel_err(g.ptr(wb), sub(db, 1, a * ol, ol, 0, 1)) : 0.0,
                 pair ? rel_err(y2l.data(), sub(y2, out, r * nR, nR, a * ol, ol)) : 0.0,
                 pair ? rel_err(g.ptr(w2), sub(dW2, in, a * ol, ol, r * il, il)) : 0.0};
  world()->all_reduce(e, 6, comm::ReduceOp::kMax);
  const double worst = *std::max_element(e, e + 6);
  if (world()->rank() == 0)
    std::printf("[linear2d] |A| %d |R| %d N %lld bias %d pair %d %-14s: max rel err y %.1e dx %.1e "
                "dW %.1e db %.1e\n", A, R, (long long)N, int(with_bias), int(pair),
                parallel::overlap_2d_name(overlap), e[0], e[1], e[2], e[3]);
  EXPECT_LT(worst, 1e-5);
}

/// Every combination on a grid of x × y.
inline void check_linear_2d_grid(int x, int y) {
  parallel::Layout l;
  l.tensor_2d_x = x, l.tensor_2d_y = y;
  const parallel::Grid grid = parallel::make_grid(world(), l);
  using parallel::Overlap2D;
  for (bool ax : {true, false})
    for (Overlap2D o : {Overlap2D::kNone, Overlap2D::kAgWithMatmul, Overlap2D::kMatmulWithRs})
      for (bool pair : {false, true})
        check_linear_2d(ax ? grid.x : grid.y, ax ? grid.y : grid.x, 24, !pair, o, pair);
}

}  // namespace longtron::testing
