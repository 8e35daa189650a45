// LayerNorm kernel (ops/layer_norm.h): forward against a two-pass reference, backward against
// central finite differences in double (tests/ops/fd_check.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fd_check.h"
#include "ops/layer_norm.h"

namespace longtron::testing {
namespace {

TEST(LayerNorm, ForwardMatchesTwoPass) {
  const int64_t N = 5, H = 37;
  std::vector<double> x = random_vector(N * H, 1, 3.0), w = random_vector(H, 2), b = random_vector(H, 3);
  for (auto& v : x) v += 100.0;  // a large mean: Σx²/H − μ² must not cancel in double
  std::vector<double> out(N * H), mean(N), rstd(N);
  ops::layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, H,
                          1e-5);
  for (int64_t n = 0; n < N; ++n) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < H; ++i) mu += x[n * H + i] / H;
    for (int64_t i = 0; i < H; ++i) var += (x[n * H + i] - mu) * (x[n * H + i] - mu) / H;
    for (int64_t i = 0; i < H; ++i) {
      const double want = (x[n * H + i] - mu) / std::sqrt(var + 1e-5) * w[i] + b[i];
      EXPECT_NEAR(out[n * H + i], want, 1e-9 * std::max(1.0, std::abs(want)));
    }
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  for (bool with_bias : {true, false}) {
    const int64_t N = 3, H = 19;
    std::vector<double> x = random_vector(N * H, 4, 2.0), w = random_vector(H, 5),
                        b = random_vector(H, 6), dout = random_vector(N * H, 7);
    std::vector<double> out(N * H), mean(N), rstd(N);
    const auto loss = [&] {
      ops::layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                              with_bias ? b.data() : nullptr, N, H, 1e-5);
      return dot(out, dout);
    };
    loss();
    std::vector<double> dx(N * H), dw(H, 0.0), db(H, 0.0);
    ops::layer_norm_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                             x.data(), w.data(), mean.data(), rstd.data(), N, H);
    expect_fd(x, dx, loss, "dx");
    expect_fd(w, dw, loss, "dweight");
    if (with_bias) expect_fd(b, db, loss, "dbias");
  }
}

TEST(LayerNorm, FloatAgreesWithDouble) {
  const int64_t N = 4, H = 64;
  std::vector<double> x = random_vector(N * H, 8), w = random_vector(H, 9), dout = random_vector(N * H, 10);
  std::vector<double> out(N * H), mean(N), rstd(N), dx(N * H), dw(H, 0.0);
  ops::layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), static_cast<const double*>(nullptr), N, H, 1e-5);
  ops::layer_norm_backward(dx.data(), dw.data(), static_cast<double*>(nullptr), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, H);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), df(dout.begin(), dout.end());
  std::vector<float> of(N * H), mf(N), rf(N), dxf(N * H), dwf(H, 0.0f);
  ops::layer_norm_forward(of.data(), mf.data(), rf.data(), xf.data(), wf.data(), static_cast<const float*>(nullptr), N, H, 1e-5f);
  ops::layer_norm_backward(dxf.data(), dwf.data(), static_cast<float*>(nullptr), df.data(), xf.data(), wf.data(),
                           mf.data(), rf.data(), N, H);
  for (int64_t i = 0; i < N * H; ++i) {
    EXPECT_NEAR(of[i], out[i], 1e-5 * std::max(1.0, std::abs(out[i])));
    EXPECT_NEAR(dxf[i], dx[i], 1e-4 * std::max(1.0, std::abs(dx[i])));
  }
  for (int64_t i = 0; i < H; ++i) EXPECT_NEAR(dwf[i], dw[i], 1e-4 * std::max(1.0, std::abs(dw[i])));
}

}  // namespace
}  // namespace longtron::testing
