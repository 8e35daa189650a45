// train_step (train/step.h), the step the trainer, the parity tests and the benchmarks share:
// counts, the gradient hook, clipping by PyTorch's clip_grad_norm_ rule, and the skip of a
// non-finite step, on a dense engine over a one-rank communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/model_testing.h"
#include "modes/engine.h"
#include "ops/sum_squares.h"
#include "parallel/layout.h"
#include "train/schedule.h"
#include "train/step.h"

namespace longtron {
namespace {

using testing::append_document;
using testing::append_pad;
using testing::random_document;

std::vector<data::MicroBatch> two_rows() {
  std::mt19937_64 rng(7);
  std::vector<data::MicroBatch> rows(2);
  append_document(rows[0], random_document(rng, 9, 32));
  append_document(rows[0], random_document(rng, 4, 32));
  append_pad(rows[0], 3);  // 16 positions: 13 tokens, 11 labels
  append_document(rows[1], random_document(rng, 16, 32));  // 16 tokens, 15 labels
  return rows;
}

struct Dense {
  parallel::Grid grid = parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  parallel::ParallelEngine engine{testing::tiny_config(), grid, 42};
  train::AdamW adam{engine.local_layout(), train::OptimizerConfig{}};
};

TEST(TrainStep, CountsAndTheGradientHookBeforeClipping) {
  Dense d;
  train::StepOptions o;
  o.lr = 1e-3;
  o.clip_grad_norm = 1e-3;  // far below the norm: clipping happens
  double hook_norm = -1;
  int calls = 0;
  o.on_gradients = [&](parallel::ParallelEngine& e) {
    ++calls;
    hook_norm = std::sqrt(ops::sum_squares(e.grads().data(), e.grads().numel()));
  };
  const auto rows = two_rows();
  const train::StepResult r = train::train_step(d.engine, d.adam, rows, o);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.labels, 11 + 15);
  EXPECT_EQ(r.tokens, 13 + 16);
  EXPECT_DOUBLE_EQ(r.sum_l2, 9.0 * 9 + 4 * 4 + 3 * 3 + 16 * 16);
  EXPECT_FALSE(r.skipped);
  EXPECT_GT(r.grad_norm, 1e-2);
  EXPECT_NEAR(hook_norm, r.grad_norm, 1e-9 * r.grad_norm);  // the norm is taken before clipping
  // The gradients stay as reduced; AdamW read them clipped (· max / (norm + 1e-6)): the
  // parameters are, bit for bit, those of an update on gradients clipped beforehand.
  const double after = std::sqrt(ops::sum_squares(d.engine.grads().data(), d.engine.grads().numel()));
  EXPECT_NEAR(after, r.grad_norm, 1e-9 * after);
  EXPECT_EQ(d.adam.step(), 1);
  Dense ref;
  train::StepOptions plain;
  plain.lr = o.lr;
  train::step_gradients(ref.engine, rows, plain);
  const double scale = train::clip_grad_norm(std::pow(ref.engine.grad_norm(), 2), 1e-3).scale;
  ASSERT_LT(scale, 1e-2);
  model::Params<float>& g = ref.engine.train_grads();
  for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] *= float(scale);
  ref.adam.update(ref.engine.train_params(), g, o.lr, ref.engine.compute().weights());
  const model::Params<float>& p = d.engine.train_params();
  const model::Params<float>& want = ref.engine.train_params();
  ASSERT_EQ(p.numel(), want.numel());
  EXPECT_TRUE(std::equal(p.data(), p.data() + p.numel(), want.data()));
}

// grad_norm needs finish_gradients after the last forward_backward (before it a rank would hold
// partial sums): the engine says so instead of returning a wrong norm.
TEST(TrainStep, GradNormBeforeFinishGradientsIsAnError) {
  Dense d;
  const auto rows = two_rows();
  d.engine.zero_grads();
  d.engine.forward_backward(rows[0], 0.1);
  EXPECT_THROW(d.engine.grad_norm(), Error);
  d.engine.finish_gradients();
  EXPECT_GT(d.engine.grad_norm(), 0.0);
  d.engine.forward_backward(rows[1], 0.1);
  EXPECT_THROW(d.engine.grad_norm(), Error);
  d.engine.zero_grads();
  EXPECT_THROW(d.engine.grad_norm(), Error);
}

TEST(TrainStep, LossIsTheTokenWeightedMeanOfTheRows) {
  Dense d;
  const auto rows = two_rows();
  model::LossSum a = d.engine.forward_loss(rows[0]), b = d.engine.forward_loss(rows[1]);
  train::StepOptions o;
  o.lr = 1e-3;
  const train::StepResult r = train::step_gradients(d.engine, rows, o);
  EXPECT_NEAR(r.loss, train::combine_step_loss({a, b}, train::LossReduction::kToken), 1e-6);
  o.loss_reduction = train::LossReduction::kMicroMean;
  EXPECT_NEAR(train::step_gradients(d.engine, rows, o).loss, train::combine_step_loss({a, b}, train::LossReduction::kMicroMean), 1e-6);
}

TEST(TrainStep, NonFiniteGradientsSkipTheUpdate) {
  Dense d;
  d.engine.params().data()[0] = std::numeric_limits<float>::quiet_NaN();  // the embedding's first row
  std::vector<data::MicroBatch> rows(1);
  append_document(rows[0], {0, 1, 2, 3});  // token 0 reads the poisoned row
  const std::vector<float> before(d.engine.params().data(), d.engine.params().data() + d.engine.params().numel());
  train::StepOptions o;
  o.lr = 1e-3;
  o.clip_grad_norm = 1.0;
  const train::StepResult r = train::train_step(d.engine, d.adam, rows, o);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(d.adam.step(), 0);
  for (size_t i = 1; i < before.size(); ++i) ASSERT_EQ(before[i], d.engine.params().data()[i]) << i;
}

// Finite loss and gradients, but a learning rate that is inf in float: the update would make
// every weight non-finite, so it is refused before anything changes (no AdamW step, no moment).
TEST(TrainStep, AnUpdateThatWouldBeNonFiniteIsSkipped) {
  Dense d;
  const std::vector<float> before(d.engine.params().data(), d.engine.params().data() + d.engine.params().numel());
  const auto rows = two_rows();
  train::StepOptions o;
  o.lr = 1e39;
  o.clip_grad_norm = 1.0;
  train::StepResult r = train::train_step(d.engine, d.adam, rows, o);
  EXPECT_TRUE(std::isfinite(r.loss) && std::isfinite(r.grad_norm));
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(r.update_nonfinite);
  EXPECT_EQ(d.adam.step(), 0);
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(before[i], d.engine.params().data()[i]) << i;
  // The same step at a sane rate is applied, and its check agreed beforehand.
  o.lr = 1e-3;
  r = train::train_step(d.engine, d.adam, rows, o);
  EXPECT_FALSE(r.skipped);
  EXPECT_FALSE(r.update_nonfinite);
  EXPECT_EQ(d.adam.step(), 1);
  EXPECT_NE(before[0], d.engine.params().data()[0]);
}

}  // namespace
}  // namespace longtron
