// The engine's bf16 weight copy across a training step: the AdamW update refreshes it in its own
// pass (no stale copy after an update, no second read of the weights), and any other write of the
// weights, which goes through ParallelEngine::params(), makes it stale, so the next pass remakes
// it. On a dense engine over a one-rank communicator.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/bf16.h"
#include "model/model_testing.h"
#include "modes/engine.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "train/step.h"

namespace longtron {
namespace {

using testing::append_document;
using testing::random_document;

data::MicroBatch row(unsigned seed) {
  std::mt19937_64 rng(seed);
  data::MicroBatch b;
  append_document(b, random_document(rng, 10, 32));
  append_document(b, random_document(rng, 6, 32));
  return b;
}

bool native_bf16() { return ops::cpu_has_avx512_bf16() && ops::gemm_backend().native_bf16; }

parallel::Grid one_rank() {
  return parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
}

/// The loss of `b` on a fresh bf16 engine over `weights` (its copy is made from them now).
double fresh_loss(const model::Params<float>& weights, const data::MicroBatch& b) {
  parallel::ParallelEngine e(testing::tiny_config(), one_rank(), weights);
  e.set_compute_type(ops::ComputeType::kBFloat16);
  return e.forward_loss(b).sum;
}

TEST(WeightCopy, TheUpdateRefreshesTheCopyItWrites) {
  if (!native_bf16()) GTEST_SKIP() << "this CPU has no native bf16";
  parallel::ParallelEngine engine(testing::tiny_config(), one_rank(), 42);
  engine.set_compute_type(ops::ComputeType::kBFloat16);
  train::AdamW adam(engine.local_layout(), train::OptimizerConfig{});
  train::StepOptions o;
  o.lr = 1e-2;
  const std::vector<data::MicroBatch> rows{row(1), row(2)};
  for (int step = 0; step < 2; ++step) {
    const model::Params<float> before = std::as_const(engine).params();
    ASSERT_FALSE(train::train_step(engine, adam, rows, o).skipped);
    const model::Params<float>& p = std::as_const(engine).params();
    ASSERT_NE(std::vector<float>(p.data(), p.data() + p.numel()),
              std::vector<float>(before.data(), before.data() + before.numel()));
    // Valid without a remake: the update wrote the rounding of every new weight.
    ASSERT_TRUE(engine.compute().weights().valid()) << "step " << step;
    const uint16_t* bits = engine.compute().weights().of(p.data(), p.numel());
    ASSERT_NE(bits, nullptr);
    for (int64_t i = 0; i < p.numel(); ++i)
      ASSERT_EQ(bits[i], float_to_bf16(p.data()[i])) << "step " << step << " element " << i;
    // And the passes read it: the loss is the one of an engine that rounds these weights anew.
    EXPECT_EQ(engine.forward_loss(row(3)).sum, fresh_loss(p, row(3))) << "step " << step;
  }
}

TEST(WeightCopy, AWriteOutsideTheUpdateIsNeverReadStale) {
  if (!native_bf16()) GTEST_SKIP() << "this CPU has no native bf16";
  parallel::ParallelEngine engine(testing::tiny_config(), one_rank(), 42);
  engine.set_compute_type(ops::ComputeType::kBFloat16);
  const double loss0 = engine.forward_loss(row(4)).sum;  // makes the copy
  ASSERT_TRUE(engine.compute().weights().valid());
  model::Params<float>& w = engine.params();  // the writer's way in: the copy is stale now
  EXPECT_FALSE(engine.compute().weights().valid());
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] *= 1.5f;
  const double loss1 = engine.forward_loss(row(4)).sum;
  EXPECT_NE(loss1, loss0);
  EXPECT_EQ(loss1, fresh_loss(std::as_const(engine).params(), row(4)));
}

TEST(WeightCopy, Float32KeepsNoCopy) {
  parallel::ParallelEngine engine(testing::tiny_config(), one_rank(), 42);
  train::AdamW adam(engine.local_layout(), train::OptimizerConfig{});
  train::StepOptions o;
  o.lr = 1e-2;
  ASSERT_FALSE(train::train_step(engine, adam, {row(1)}, o).skipped);
  engine.forward_loss(row(2));
  EXPECT_EQ(engine.compute().weight_copy_bytes(), 0);
  EXPECT_FALSE(engine.compute().bf16());
}

}  // namespace
}  // namespace longtron
