// Central finite differences in double for the kernel tests: every backward is checked against
// (L(x + h) − L(x − h)) / 2h of a scalar loss L = Σ dout ∘ forward(x) with a random dout.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace longtron::testing {

inline std::vector<double> random_vector(int64_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Compares grad[i] with scale · the central difference (loss(x_i + h) − loss(x_i − h)) / 2h for
/// every i of `indices` (x[i] is perturbed in place and restored). A difference above
/// tolerance(fd) fails; the first five failures are reported with name(i). Returns the number of
/// elements compared (indices.size(), unless an index is out of range: that fails the test).
inline int64_t expect_fd_at(double* x, const double* grad, int64_t n,
                            const std::vector<int64_t>& indices,
                            const std::function<double()>& loss,
                            const std::function<double(double)>& tolerance,
                            const std::function<std::string(int64_t)>& name, double scale = 1.0,
                            double h = 1e-5) {
  int failures = 0;
  int64_t compared = 0;
  for (int64_t i : indices) {
    if (i < 0 || i >= n) {
      ADD_FAILURE() << name(i) << ": index out of range [0, " << n << ")";
      continue;
    }
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    const double fd = scale * (plus - minus) / (2 * h);
    ++compared;
    if (std::abs(grad[i] - fd) > tolerance(fd) && failures++ < 5) {
      ADD_FAILURE() << name(i) << ": analytic " << grad[i] << " vs finite difference " << fd;
    }
  }
  EXPECT_EQ(failures, 0) << name(-1);
  return compared;
}

/// Compares grad[idx] with the central difference of loss() in x[idx] (x is perturbed in place and
/// restored) for every `stride`-th element (and always the last one). Tolerance is relative to
/// max(1, |fd|).
inline void expect_fd(std::vector<double>& x, const std::vector<double>& grad,
                      const std::function<double()>& loss, const std::string& what,
                      double tol = 1e-6, int64_t stride = 1, double h = 1e-5) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<int64_t> checked;
  for (int64_t i = 0; i < n; i += stride) checked.push_back(i);
  if (n > 0 && checked.back() != n - 1) checked.push_back(n - 1);
  expect_fd_at(
      x.data(), grad.data(), n, checked, loss,
      [tol](double fd) { return tol * std::max(1.0, std::abs(fd)); },
      [&what](int64_t i) { return i < 0 ? what : what + "[" + std::to_string(i) + "]"; }, 1.0,
      h);
}

}  // namespace longtron::testing
