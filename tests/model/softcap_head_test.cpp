// The soft-capped chunked head (Gemma 3's final_logit_softcapping): the loss of cap · tanh(xf·Wᵀ /
// cap) computed directly in double, its gradients against finite differences, the same for any
// chunking, float near double.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/fd_check.h"
#include "model/layers.h"
#include "model/softcap_cross_entropy.h"
#include "ops/compute_context.h"

namespace longtron::model {
namespace {

using testing::expect_fd;
using testing::random_vector;
using Vec = std::vector<double>;

constexpr int64_t N = 7, V = 11, H = 5;
constexpr double kCap = 2.5, kScale = 0.25;

const std::vector<int32_t> kLabels = {3, -100, 0, 10, 7, -100, 4};

/// Σ over valid rows of lse(c) − c[label], c = cap · tanh(xf·Wᵀ / cap), straight from the formula.
double direct_loss(const Vec& xf, const Vec& W, double cap, Vec* per_token = nullptr) {
  double sum = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> c(V);
    double m = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t h = 0; h < H; ++h) z += xf[n * H + h] * W[v * H + h];
      c[v] = cap * std::tanh(z / cap);
      m = std::max(m, c[v]);
    }
    double s = 0;
    for (double x : c) s += std::exp(x - m);
    const double token = kLabels[n] < 0 ? 0.0 : m + std::log(s) - c[kLabels[n]];
    if (per_token) (*per_token)[n] = token;
    sum += token;
  }
  return sum;
}

struct Result {
  LossSum loss;
  std::vector<double> dx, dW, token;
};

template <typename T>
Result run(const Vec& xf, const Vec& W, int64_t chunk) {
  const std::vector<T> x(xf.begin(), xf.end()), w(W.begin(), W.end());
  std::vector<T> dx(N * H), dW(V * H, T(0));
  Result r;
  r.token.assign(N, 0.0);
  HeadChunks<T> scratch;
  DenseChunkCrossEntropy<T> dense(V);
  SoftcapCrossEntropy<T> ce(dense, V, kCap);
  r.loss = chunked_head_loss(ops::ComputeContext::fp32(), scratch, ce, dx.data(), dW.data(),
                             x.data(), w.data(), kLabels.data(), N, V, H, chunk, kScale,
                             r.token.data());
  r.dx.assign(dx.begin(), dx.end());
  r.dW.assign(dW.begin(), dW.end());
  return r;
}

TEST(SoftcapHead, LossIsTheCappedLogitsCrossEntropy) {
  const Vec xf = random_vector(N * H, 31, 2.0), W = random_vector(V * H, 32, 2.0);
  Vec token(N);
  const double expect = direct_loss(xf, W, kCap, &token);
  EXPECT_GT(std::abs(expect - direct_loss(xf, W, 1e6)), 0.1) << "the cap must matter here";
  const Result r = run<double>(xf, W, N);
  EXPECT_EQ(r.loss.count, 5);
  EXPECT_NEAR(r.loss.sum, expect, 1e-12 * std::abs(expect));
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(r.token[n], token[n], 1e-12) << n;
}

TEST(SoftcapHead, BackwardMatchesFiniteDifferencesForEveryChunking) {
  Vec xf = random_vector(N * H, 33, 2.0), W = random_vector(V * H, 34, 2.0);
  const Result whole = run<double>(xf, W, N);
  auto loss = [&] { return kScale * direct_loss(xf, W, kCap); };
  expect_fd(xf, whole.dx, loss, "dxf");
  expect_fd(W, whole.dW, loss, "dW");
  for (const int64_t chunk : {int64_t(1), int64_t(3)}) {
    const Result r = run<double>(xf, W, chunk);
    EXPECT_NEAR(r.loss.sum, whole.loss.sum, 1e-12 * std::abs(whole.loss.sum)) << chunk;
    for (size_t i = 0; i < r.dx.size(); ++i) EXPECT_NEAR(r.dx[i], whole.dx[i], 1e-13) << chunk;
    for (size_t i = 0; i < r.dW.size(); ++i) EXPECT_NEAR(r.dW[i], whole.dW[i], 1e-13) << chunk;
  }
  const Result f = run<float>(xf, W, 3);
  EXPECT_NEAR(f.loss.sum, whole.loss.sum, 1e-5 * std::abs(whole.loss.sum));
  for (size_t i = 0; i < f.dx.size(); ++i) EXPECT_NEAR(f.dx[i], whole.dx[i], 1e-5) << i;
  for (size_t i = 0; i < f.dW.size(); ++i) EXPECT_NEAR(f.dW[i], whole.dW[i], 1e-5) << i;
}

TEST(SoftcapHead, RefusesACapThatIsNotPositive) {
  DenseChunkCrossEntropy<double> dense(V);
  EXPECT_THROW(SoftcapCrossEntropy<double>(dense, V, 0.0), Error);
  EXPECT_THROW(SoftcapCrossEntropy<double>(dense, V, -30.0), Error);
}

}  // namespace
}  // namespace longtron::model
