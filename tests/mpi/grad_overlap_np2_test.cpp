// dp2: Work::test; the data-parallel gradient all-reduce and ZeRO-1's reduce-scatter overlapped
// with backward against the same steps reduced after backward (grad_overlap_cases.h), fp32 and
// bf16, untied and tied head, LoRA's adapters; the buckets start inside backward; a rank without
// rows joins the same collectives; a reduction finished in the other form than the one armed is
// refused.
#include "grad_overlap_cases.h"

#include "core/error.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

// Work::test polls an all-reduce to completion without blocking (MPI_Test); a one-rank group's
// handle is complete at once.
TEST(GradOverlapNp2, WorkTestPollsAnAllReduceToCompletion) {
  std::vector<float> x(100000, float(world()->rank() + 1));
  comm::Work w = world()->all_reduce_async(x.data(), int64_t(x.size()));
  int polls = 0;
  while (!w.test()) ++polls;
  EXPECT_FALSE(w.pending());
  EXPECT_TRUE(w.test());
  EXPECT_EQ(x.front(), 3.0f);
  EXPECT_EQ(x.back(), 3.0f);
  comm::CommPtr local = comm::make_local_communicator();
  float y = 2.0f;
  comm::Work l = local->all_reduce_async(&y, 1);
  EXPECT_TRUE(l.test());
  EXPECT_EQ(y, 2.0f);
}

TEST(GradOverlapNp2, Dp2IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 fp32", layout(1, TensorMode::kMtp), tiny_model(), 16, 4, 3}, false,
                        true);
}

TEST(GradOverlapNp2, Dp2Bf16IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 bf16", layout(1, TensorMode::kMtp), tiny_model(), 16, 4, 3}, true,
                        true);
}

TEST(GradOverlapNp2, Dp2TiedHeadIsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 tied", layout(1, TensorMode::kMtp), tied_model(), 16, 2, 3}, false,
                        true);
}

// The buckets of the last micro-batch are all-reduced while its backward runs: when
// forward_backward returns, one all-reduce per bucket has been issued (the head with the final
// norm, each block, the embedding) and finish_gradients issues none of the gradient's.
TEST(GradOverlapNp2, BucketsStartInsideBackward) {
  const ParityCase c{"dp2 buckets", layout(1, TensorMode::kMtp), tiny_model(), 16, 2, 1};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  ASSERT_TRUE(engine.overlaps_gradient_reduction());
  const auto calls = [] { return comm::global_stats().calls[int(comm::Kind::kAllReduce)]; };
  engine.zero_grads();
  const uint64_t before = calls();
  engine.forward_backward(dp_share(global_rows(c, 0), grid).front(), 0.01, true);
  const uint64_t during = calls() - before;
  engine.finish_gradients();
  const uint64_t after = calls() - before - during;
  EXPECT_EQ(during, uint64_t(c.model.num_layers + 2));
  EXPECT_EQ(after, 0u);
  EXPECT_GT(engine.reduction_times().in_backward, 0.0);
}

// Rank 1 has no rows this step (no last micro-batch to overlap): its finish_gradients issues the
// same bucketed all-reduces, so the step completes and matches the reduction after backward.
TEST(GradOverlapNp2, ARankWithoutRowsJoinsTheSameCollectives) {
  const ParityCase c{"dp2 no rows", layout(1, TensorMode::kMtp), tiny_model(), 16, 2, 1};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const MicroBatch row = global_rows(c, 0).front();
  auto run = [&](bool overlap) {
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    engine.set_overlap_gradient_reduction(overlap);
    engine.zero_grads();
    if (grid.data->rank() == 0) engine.forward_backward(row, 0.05, true);
    engine.finish_gradients();
    return std::vector<float>(engine.grads().data(), engine.grads().data() + engine.grads().numel());
  };
  const std::vector<float> on = run(true), off = run(false);
  EXPECT_TRUE(same_bits(on, off));
  double sum = 0;
  for (float g : on) sum += std::abs(g);
  EXPECT_GT(sum, 0.0);  // rank 0's gradient reached rank 1
}

TEST(GradOverlapNp2, Dp2Zero1IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 zero1 fp32", layout(1, TensorMode::kMtp, -1), tiny_model(), 16, 4, 3},
                        false, true);
}

TEST(GradOverlapNp2, Dp2Zero1Bf16IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 zero1 bf16", layout(1, TensorMode::kMtp, -1), tiny_model(), 16, 4, 3},
                        true, true);
}

TEST(GradOverlapNp2, Dp2Zero1TiedHeadIsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 zero1 tied", layout(1, TensorMode::kMtp, -1), tied_model(), 16, 2, 3},
                        false, true);
}

// LoRA: the adapters' gradients are the trainable table; ZeRO-1 slices it and the buckets
// reduce-scatter the adapters of each block as its backward ends.
TEST(GradOverlapNp2, LoraDp2Zero1IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"lora dp2 zero1", layout(1, TensorMode::kMtp, -1), lora_model("llama"), 16,
                         4, 3}, false, true);
}

// ZeRO-1's buckets: one reduce-scatter per bucket is issued inside backward and none after it;
// the slice of this rank is then bitwise the one the whole-buffer reduce-scatter gives, and the
// bytes sent are those of one reduce-scatter of the buffer (every element but this rank's slice).
TEST(GradOverlapNp2, Zero1BucketsReduceScatterInsideBackward) {
  const ParityCase c{"dp2 zero1 buckets", layout(1, TensorMode::kMtp, -1), tiny_model(), 16, 2, 1};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const MicroBatch row = dp_share(global_rows(c, 0), grid).front();
  const auto kind = int(comm::Kind::kReduceScatter);
  auto run = [&](bool overlap) {
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    engine.set_overlap_gradient_reduction(overlap);
    train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
    const std::vector<int64_t> counts = adam.shard_counts();
    engine.zero_grads();
    engine.set_gradient_slices(counts);
    const comm::CommStats before = comm::global_stats();
    engine.forward_backward(row, 0.05, true);
    const uint64_t during = comm::global_stats().calls[kind] - before.calls[kind];
    engine.finish_gradient_slices(counts);
    const uint64_t after = comm::global_stats().calls[kind] - before.calls[kind] - during;
    const uint64_t sent = comm::global_stats().sent[kind] - before.sent[kind];
    if (overlap) {
      EXPECT_EQ(during, uint64_t(c.model.num_layers + 2));
      EXPECT_EQ(after, 0u);
      EXPECT_GT(engine.reduction_times().in_backward, 0.0);
    } else {
      EXPECT_EQ(during, 0u);
      EXPECT_EQ(after, 1u);
    }
    const int64_t numel = engine.grads().numel();
    EXPECT_EQ(sent, uint64_t(4 * (numel - counts[size_t(grid.zero1->rank())])));
    return std::vector<float>(engine.grads().data() + adam.shard_begin(),
                              engine.grads().data() + adam.shard_end());
  };
  const std::vector<float> on = run(true), off = run(false);
  EXPECT_FALSE(on.empty());
  EXPECT_TRUE(same_bits(on, off));
}

// A rank without rows under ZeRO-1: its finish_gradient_slices issues the same bucketed
// reduce-scatters as the rank whose backward started them.
TEST(GradOverlapNp2, Zero1RankWithoutRowsJoinsTheSameCollectives) {
  const ParityCase c{"dp2 zero1 no rows", layout(1, TensorMode::kMtp, -1), tiny_model(), 16, 2, 1};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const MicroBatch row = global_rows(c, 0).front();
  auto run = [&](bool overlap) {
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    engine.set_overlap_gradient_reduction(overlap);
    train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
    engine.zero_grads();
    engine.set_gradient_slices(adam.shard_counts());
    if (grid.data->rank() == 0) engine.forward_backward(row, 0.05, true);
    engine.finish_gradient_slices(adam.shard_counts());
    return std::vector<float>(engine.grads().data() + adam.shard_begin(),
                              engine.grads().data() + adam.shard_end());
  };
  const std::vector<float> on = run(true), off = run(false);
  EXPECT_TRUE(same_bits(on, off));
  double sum = 0;
  for (float g : on) sum += std::abs(g);
  EXPECT_GT(sum, 0.0);  // rank 0's gradient reached rank 1's slice
}

// A reduction is finished in the form it was armed in: buckets being all-reduced are not
// reduce-scattered, nor reduce-scattered ones all-reduced, and train_step overlaps either.
TEST(GradOverlapNp2, ReductionsFinishInTheFormArmed) {
  const ParityCase c{"dp2 zero1", layout(1, TensorMode::kMtp, -1), tiny_model(), 16, 2, 1};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  const MicroBatch row = dp_share(global_rows(c, 0), grid).front();
  engine.zero_grads();
  engine.forward_backward(row, 0.05, true);
  EXPECT_THROW(engine.finish_gradient_slices(adam.shard_counts()), Error);
  engine.zero_grads();  // drops the reduction in flight
  engine.set_gradient_slices(adam.shard_counts());
  engine.forward_backward(row, 0.05, true);
  EXPECT_THROW(engine.finish_gradients(), Error);
  std::vector<int64_t> other = adam.shard_counts();
  std::swap(other.front(), other.back());
  if (other != adam.shard_counts()) {
    EXPECT_THROW(engine.finish_gradient_slices(other), Error);
  }
  engine.zero_grads();
  engine.set_gradient_slices({});
  // train_step on a ZeRO-1 grid reduce-scatters during backward.
  const train::StepResult r =
      train::train_step(engine, adam, dp_share(global_rows(c, 0), grid), parity_step_options());
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(engine.overlaps_gradient_reduction());
  EXPECT_GT(engine.reduction_times().in_backward, 0.0);
}

}  // namespace
}  // namespace longtron::testing
