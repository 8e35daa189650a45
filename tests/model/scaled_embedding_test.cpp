// ScaledEmbedding (Gemma 3's embedding times √hidden_size): the rows times the scale, and the
// table's gradient (a token repeated included) against finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/layers.h"
#include "model/model_testing.h"
#include "model/params.h"
#include "model/scaled_embedding.h"
#include "ops/fd_check.h"

namespace longtron::model {
namespace {

using testing::random_vector;
using Vec = std::vector<double>;

TEST(ScaledEmbedding, RowsTimesTheScaleAndBackwardMatchesFiniteDifferences) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const double scale = static_cast<float>(std::sqrt(double(H)));
  Params<double> p(layout);
  const Vec fill = random_vector(p.numel(), 51);
  std::copy(fill.begin(), fill.end(), p.data());
  ScaledEmbedding<double> op(std::move(make_dense_ops<double>(layout).embedding), H, scale);
  const std::vector<int32_t> ids = {3, 7, 3, 0, 31};
  const int64_t N = std::ssize(ids);
  Vec x(N * H);
  op.forward(x.data(), ids.data(), N, p);
  const double* table = p.ptr(layout.tok_embeddings);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      EXPECT_EQ(x[n * H + h], table[ids[n] * H + h] * scale) << n << "," << h;

  const Vec dx = random_vector(N * H, 52);
  Params<double> g(layout);
  g.zero();
  op.backward(dx.data(), ids.data(), N, &g);
  const double* gt = g.ptr(layout.tok_embeddings);
  Vec t(table, table + V * H), dt(gt, gt + V * H);
  auto loss = [&] {
    std::copy(t.begin(), t.end(), p.ptr(layout.tok_embeddings));
    Vec out(N * H);
    op.forward(out.data(), ids.data(), N, p);
    return testing::dot(out, dx);
  };
  testing::expect_fd(t, dt, loss, "dtable");
  EXPECT_NE(dt[3 * H], 0.0);  // token 3, twice
  op.backward(dx.data(), ids.data(), N, nullptr);  // no gradients: nothing to do
}

}  // namespace
}  // namespace longtron::model
