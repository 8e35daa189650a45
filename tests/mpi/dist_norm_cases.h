// Distributed RMSNorm / LayerNorm (parallel/dist_norm.h) against the single-rank ops on the same
// full tensors, shared by dist_norm_np2_test.cpp and dist_norm_np4_test.cpp. Every rank draws the
// same full x[N, H], weight, bias and dout; rank (xr, yr) of a tokens × features grid holds rows
// block xr and feature block yr; its outputs and input gradients must equal the matching block of
// the single-rank op, and its weight gradients summed over the token group (x) the full-op ones.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "mpi_test_main.h"
#include "ops/layer_norm.h"
#include "ops/ops.h"
#include "parallel/dist_norm.h"

namespace longtron::testing {

template <typename T>
std::vector<T> same_random(int64_t n, unsigned seed, double mean = 0.0, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(mean, scale);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& e : v) e = static_cast<T>(d(gen));
  return v;
}

/// Block [rows r0.., cols c0..] of full [*, H] into dst[rows, cols].
template <typename T>
std::vector<T> block(const std::vector<T>& full, int64_t H, int64_t r0, int64_t rows, int64_t c0,
                     int64_t cols) {
  std::vector<T> b(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) b[size_t(r * cols + c)] = full[size_t((r0 + r) * H + c0 + c)];
  return b;
}

/// Max |a − b| / max(1, max|b|).
template <typename T>
double max_rel(const std::vector<T>& a, const std::vector<T>& b) {
  double diff = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

/// One random case on a grid: `tokens` splits rows (x), `features` splits the hidden dim (y).
template <typename T>
void check_dist_norms(comm::Communicator& tokens, comm::Communicator& features, int64_t N,
                      int64_t H, unsigned seed, double tol, double mean = 0.0) {
  const int64_t Nl = N / tokens.size(), Hl = H / features.size();
  const int64_t r0 = tokens.rank() * Nl, c0 = features.rank() * Hl;
  const T eps = T(1e-5);
  const auto x = same_random<T>(N * H, seed, mean, 2.0), dout = same_random<T>(N * H, seed + 1);
  const auto w = same_random<T>(H, seed + 2, 1.0, 0.3), b = same_random<T>(H, seed + 3);
  const auto xl = block(x, H, r0, Nl, c0, Hl), doutl = block(dout, H, r0, Nl, c0, Hl);
  const auto wl = block(w, H, 0, 1, c0, Hl), bl = block(b, H, 0, 1, c0, Hl);
  double err_rms = 0, err_ln = 0;
  {  // RMSNorm
    std::vector<T> out(N * H), rstd(N), dx(N * H), dw(H, T(0));
    ops::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), N, H, eps);
    ops::rms_norm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, H);
    std::vector<T> o(Nl * Hl), r(Nl), d(Nl * Hl), g(Hl, T(0));
    parallel::dist_rms_norm_forward(o.data(), r.data(), xl.data(), wl.data(), Nl, Hl, H, eps, features);
    parallel::dist_rms_norm_backward(d.data(), g.data(), doutl.data(), xl.data(), wl.data(), r.data(),
                                     Nl, Hl, H, features);
    tokens.all_reduce(g.data(), Hl);  // the engine's SUM over x
    err_rms = std::max({max_rel(o, block(out, H, r0, Nl, c0, Hl)),
                        max_rel(r, block(rstd, 1, r0, Nl, 0, 1)),
                        max_rel(d, block(dx, H, r0, Nl, c0, Hl)), max_rel(g, block(dw, H, 0, 1, c0, Hl))});
  }
  for (bool with_bias : {true, false}) {  // LayerNorm
    const T* bias = with_bias ? b.data() : nullptr;
    std::vector<T> out(N * H), mu(N), rstd(N), dx(N * H), dw(H, T(0)), db(H, T(0));
    ops::layer_norm_forward(out.data(), mu.data(), rstd.data(), x.data(), w.data(), bias, N, H, eps);
    ops::layer_norm_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                             x.data(), w.data(), mu.data(), rstd.data(), N, H);
    std::vector<T> o(Nl * Hl), m(Nl), r(Nl), d(Nl * Hl), g(Hl, T(0)), gb(Hl, T(0));
    parallel::dist_layer_norm_forward(o.data(), m.data(), r.data(), xl.data(), wl.data(),
                                      with_bias ? bl.data() : nullptr, Nl, Hl, H, eps, features);
    parallel::dist_layer_norm_backward(d.data(), g.data(), with_bias ? gb.data() : nullptr,
                                       doutl.data(), xl.data(), wl.data(), m.data(), r.data(), Nl,
                                       Hl, H, features);
    tokens.all_reduce(g.data(), Hl);
    tokens.all_reduce(gb.data(), Hl);
    err_ln = std::max({err_ln, max_rel(o, block(out, H, r0, Nl, c0, Hl)),
                       max_rel(m, block(mu, 1, r0, Nl, 0, 1)), max_rel(r, block(rstd, 1, r0, Nl, 0, 1)),
                       max_rel(d, block(dx, H, r0, Nl, c0, Hl)), max_rel(g, block(dw, H, 0, 1, c0, Hl)),
                       max_rel(gb, block(db, H, 0, 1, c0, Hl))});
  }
  double errs[2] = {err_rms, err_ln};
  world()->all_reduce(errs, 2, comm::ReduceOp::kMax);
  if (world()->rank() == 0)
    std::printf("[dist_norm] %s tokens/%d features/%d N %lld H %lld mean %.0f: RMSNorm max rel err "
                "%.2e, LayerNorm %.2e\n", sizeof(T) == 8 ? "double" : "float ", tokens.size(),
                features.size(), (long long)N, (long long)H, mean, errs[0], errs[1]);
  EXPECT_LT(errs[0], tol);
  EXPECT_LT(errs[1], tol);
}

/// Random shapes (N divisible by the token group, H by the feature group) in double and float.
inline void check_random_shapes(comm::Communicator& tokens, comm::Communicator& features,
                                unsigned seed) {
  std::mt19937 gen(seed);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t N = tokens.size() * std::uniform_int_distribution<int64_t>(1, 7)(gen);
    const int64_t H = features.size() * std::uniform_int_distribution<int64_t>(1, 40)(gen);
    check_dist_norms<double>(tokens, features, N, H, seed + 10 * trial, 1e-12);
    check_dist_norms<float>(tokens, features, N, H, seed + 10 * trial, 2e-5);
  }
  // A large mean: var = s/H − μ² in double keeps LayerNorm accurate (docs/tp2d.md).
  check_dist_norms<double>(tokens, features, 2 * tokens.size(), 16 * features.size(), seed, 1e-9,
                           50.0);
}

}  // namespace longtron::testing
