// PostNormLinear (Gemma 3's post-attention and post-feed-forward norms on o_proj and down_proj):
// y = x·Wᵀ · rsqrt(mean((x·Wᵀ)²) + eps) · (1 + w) from the formula, and its backward (input, linear
// weight and norm weight, accumulate_dx both ways) against finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "model/layers.h"
#include "model/model_testing.h"
#include "model/params.h"
#include "model/post_norm_linear.h"
#include "ops/fd_check.h"
#include "ops/ops.h"

namespace longtron::model {
namespace {

using testing::expect_fd;
using testing::random_vector;
using Vec = std::vector<double>;

/// Gemma's RMSNorm (weight offset 1) over the view `weight`.
class OnePlusNorm final : public NormOp<double> {
 public:
  OnePlusNorm(int weight, int64_t H, double eps) : weight_(weight), H_(H), eps_(eps) {}
  void forward(double* out, double* rstd, const double* x, int64_t N,
               const Params<double>& p) override {
    ops::rms_norm_forward(out, rstd, x, p.ptr(weight_), N, H_, eps_, nullptr, 1.0);
  }
  void backward(double* dx, const double* dout, const double* x, const double* rstd, int64_t N,
                const Params<double>& p, Params<double>* g) override {
    ops::rms_norm_backward(dx, g ? g->ptr(weight_) : nullptr, dout, x, p.ptr(weight_), rstd, N,
                           H_, 1.0);
  }

 private:
  int weight_;
  int64_t H_;
  double eps_;
};

TEST(PostNormLinear, ForwardIsTheFormulaAndBackwardMatchesFiniteDifferences) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  const int64_t H = c.hidden_size, N = 5;
  const double eps = 1e-6;
  Params<double> p(layout);
  const Vec fill = random_vector(p.numel(), 41, 0.5);
  std::copy(fill.begin(), fill.end(), p.data());
  const BlockParamIds& ids = layout.layers[0];
  const int64_t A = layout.view(ids.wo).shape[1];
  PostNormLinear<double> op(std::move(make_dense_ops<double>(layout).blocks[0].wo),
                            std::make_unique<OnePlusNorm>(ids.ffn_norm, H, eps));
  ASSERT_EQ(op.in(), A);
  ASSERT_EQ(op.out(), H);

  Vec x = random_vector(N * A, 42);
  const Vec dy = random_vector(N * H, 43);
  Vec y(N * H);
  op.forward(y.data(), x.data(), N, p);
  const double* W = p.ptr(ids.wo);
  const double* w = p.ptr(ids.ffn_norm);
  for (int64_t n = 0; n < N; ++n) {
    Vec z(H);
    double ms = 0;
    for (int64_t o = 0; o < H; ++o) {
      for (int64_t i = 0; i < A; ++i) z[o] += x[n * A + i] * W[o * A + i];
      ms += z[o] * z[o] / double(H);
    }
    for (int64_t o = 0; o < H; ++o)
      EXPECT_NEAR(y[n * H + o], z[o] / std::sqrt(ms + eps) * (1.0 + w[o]), 1e-12) << n << "," << o;
  }

  auto loss = [&] {
    Vec out(N * H);
    op.forward(out.data(), x.data(), N, p);
    return testing::dot(out, dy);
  };
  for (const bool accumulate : {false, true}) {
    Params<double> g(layout);
    g.zero();
    Vec dx(N * A, accumulate ? 1.0 : 0.0);
    op.backward(dx.data(), dy.data(), x.data(), N, p, &g, accumulate);
    if (accumulate)
      for (double& v : dx) v -= 1.0;
    expect_fd(x, dx, loss, accumulate ? "dx (accumulated)" : "dx");
    const int64_t nW = H * A;
    Vec Wv(W, W + nW), gW(g.ptr(ids.wo), g.ptr(ids.wo) + nW);
    Vec wv(w, w + H), gw(g.ptr(ids.ffn_norm), g.ptr(ids.ffn_norm) + H);
    auto loss_W = [&] {
      std::copy(Wv.begin(), Wv.end(), p.ptr(ids.wo));
      return loss();
    };
    expect_fd(Wv, gW, loss_W, "dW");
    std::copy(Wv.begin(), Wv.end(), p.ptr(ids.wo));
    auto loss_w = [&] {
      std::copy(wv.begin(), wv.end(), p.ptr(ids.ffn_norm));
      return loss();
    };
    expect_fd(wv, gw, loss_w, "dnorm");
    std::copy(wv.begin(), wv.end(), p.ptr(ids.ffn_norm));
  }
}

}  // namespace
}  // namespace longtron::model
