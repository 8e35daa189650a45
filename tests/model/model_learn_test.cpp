// The float model learns: AdamW steps on one packed row drive its loss down (a smoke test of the
// training path in float with InternEvo's init; the full trainer is tested in tests/train).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "model/decoder.h"
#include "model_testing.h"
#include "ops/ops.h"

namespace longtron::model {
namespace {

TEST(ModelLearn, LossFallsUnderAdamW) {
  ModelConfig c = testing::tiny_config();
  c.checkpoint = true;
  const ParamTable layout(c);
  Params<float> params(layout), grads(layout), m(layout), v(layout);
  init_params(params, 3);
  Decoder<float> model(layout, params);
  std::mt19937_64 rng(8);
  data::MicroBatch row;
  for (int64_t len : {12, 1, 9, 20}) {
    testing::append_document(row, testing::random_document(rng, len, c.vocab_size));
  }
  testing::append_pad(row, 6);
  const double first = model.forward_loss(row).sum;
  for (int step = 1; step <= 60; ++step) {
    grads.zero();
    model.forward_backward(row, grads, 1.0 / 38.0);  // token mean
    ops::adamw_update(params.data(), m.data(), v.data(), grads.data(), params.numel(),
                      1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
  }
  const LossSum last = model.forward_loss(row);
  EXPECT_EQ(last.count, 11 + 0 + 8 + 19);
  EXPECT_LT(last.sum, 0.3 * first) << "first " << first << " last " << last.sum;
  std::printf("loss %.4f -> %.4f nats/token\n", first / 38.0, last.sum / 38.0);
}

}  // namespace
}  // namespace longtron::model
