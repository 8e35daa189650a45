// The distributed engine on 2 ranks against one process on the same global batch (docs/parallel.md):
// dp2 (ZeRO-1 off and on), tp2 in each Megatron mode (also with a tied embedding/head), a checkpoint saved under one layout and
// resumed under another, and layout errors raised before any work.
// GCC 12 reports -Wmaybe-uninitialized for parallel::Layout's std::string member inside the
// ParityCase temporaries of check_resume once inlined; every member has a default initialiser, so
// it is a false positive of that compiler (GCC 13 does not report it).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "engine_parity.h"

#include <cstdlib>

#include "core/error.h"


namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(EngineNp2, Dp2) { check_parity({"dp2", layout(1, TensorMode::kMtp, 1)}); }
TEST(EngineNp2, Dp2Zero1) { check_parity({"dp2 zero1", layout(1, TensorMode::kMtp, -1)}); }
// ZeRO-1 by reduce-scatter: one dp2 zero1 step sends (ring bytes, CommStats::sent) at most 2/3 of
// what the same step sends with the gradient all-reduce. The all-reduce step is today's path,
// taken when AdamW's zero1 communicator is not the grid's (here a copy of the group). The
// scalar all-reduces (counts, loss, norm, verdicts) are the same in both and are the only
// all-reduces of the reduce-scatter step; both steps land on the same parameters up to the
// summation order.
TEST(EngineNp2, Dp2Zero1ReduceScatterSendsTwoThirdsOfTheAllReduceStep) {
  const ParityCase c{"dp2 zero1 bytes", layout(1, TensorMode::kMtp, -1)};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  struct Run {
    comm::CommStats sent;
    std::vector<float> params;
  };
  auto run = [&](bool sliced) {
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    EXPECT_TRUE(engine.shards_gradients());
    comm::CommPtr z = sliced ? grid.zero1 : grid.zero1->split(0, grid.zero1->rank());
    train::AdamW adam(engine.local_layout(), parity_optimizer(), z);
    const comm::CommStats before = comm::global_stats();
    const train::StepResult r =
        train::train_step(engine, adam, dp_share(global_rows(c, 0), grid), parity_step_options());
    EXPECT_FALSE(r.skipped);
    Run out;
    const comm::CommStats& after = comm::global_stats();
    for (int k = 0; k < comm::kNumKinds; ++k) out.sent.sent[k] = after.sent[k] - before.sent[k];
    out.params.assign(engine.params().data(), engine.params().data() + engine.params().numel());
    return out;
  };
  const Run rs = run(true), ar = run(false);
  const auto all_reduce = int(comm::Kind::kAllReduce);
  const uint64_t scalars = rs.sent.sent[all_reduce];
  const uint64_t rs_total = rs.sent.total_sent(), ar_total = ar.sent.total_sent();
  const uint64_t grad_bytes = 4 * uint64_t(ar.params.size());
  // The reduce-scatter step: a reduce-scatter and an all-gather, half the buffer each.
  EXPECT_EQ(rs.sent.sent[int(comm::Kind::kReduceScatter)] + rs.sent.sent[int(comm::Kind::kAllGather)],
            grad_bytes);
  EXPECT_LT(scalars, 128u);
  EXPECT_LE(3 * (rs_total - scalars), 2 * (ar_total - scalars));
  EXPECT_LE(double(rs_total), (2.0 / 3.0) * double(ar_total) + double(scalars));
  double worst = 0;
  for (size_t i = 0; i < rs.params.size(); ++i)
    worst = std::max(worst, double(std::abs(rs.params[i] - ar.params[i])));
  EXPECT_LT(worst, 1e-6);
  if (world()->rank() == 0)
    std::printf("[zero1 bytes] one dp2 step: reduce-scatter %llu B, all-reduce %llu B sent per rank "
                "(ratio %.4f; scalars %llu B); max |param diff| %.2e\n",
                (unsigned long long)rs_total, (unsigned long long)ar_total,
                double(rs_total) / double(ar_total), (unsigned long long)scalars, worst);
}

// The non-finite update check on reduce-scattered slices: a learning rate that is infinite in
// float makes every rank's slice update non-finite; both ranks skip, nothing changes.
TEST(EngineNp2, Dp2Zero1SkipsANonFiniteUpdateOnEveryRank) {
  const ParityCase c{"dp2 zero1 lr inf", layout(1, TensorMode::kMtp, -1)};
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  const std::vector<float> before(engine.params().data(),
                                  engine.params().data() + engine.params().numel());
  train::StepOptions o = parity_step_options();
  o.lr = 1e39;
  const train::StepResult r = train::train_step(engine, adam, dp_share(global_rows(c, 0), grid), o);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(r.update_nonfinite);
  EXPECT_TRUE(std::isfinite(r.grad_norm));
  EXPECT_EQ(adam.step(), 0);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), engine.params().data()));
}

TEST(EngineNp2, Tp2Mtp) { check_parity({"tp2 mtp", layout(2, TensorMode::kMtp)}); }
TEST(EngineNp2, Tp2Msp) { check_parity({"tp2 msp", layout(2, TensorMode::kMsp)}); }
TEST(EngineNp2, Tp2Fsp) { check_parity({"tp2 fsp", layout(2, TensorMode::kFsp)}); }

// A tied embedding/head (one table split on vocabulary rows for both uses) in each Megatron mode.
TEST(EngineNp2, Tp2TiedEveryMegatronMode) {
  const std::pair<const char*, TensorMode> modes[] = {
      {"tp2 mtp tied", TensorMode::kMtp}, {"tp2 msp tied", TensorMode::kMsp},
      {"tp2 fsp tied", TensorMode::kFsp}};
  for (const auto& [name, mode] : modes) {
    ParityCase c{name, layout(2, mode)};
    c.model = tied_model();
    check_parity(c);
  }
}

TEST(EngineNp2, SaveTp2FspTiedResumeDp2Zero1) {
  ParityCase c{"tp2 fsp tied -> dp2 zero1", {}};
  c.model = tied_model();
  check_resume(c, layout(2, TensorMode::kFsp), layout(1, TensorMode::kMtp, -1), 2);
}

TEST(EngineNp2, Tp2MspCheckpointedBlocks) {
  ParityCase c{"tp2 msp checkpoint", layout(2, TensorMode::kMsp)};
  c.model.checkpoint = true;
  check_parity(c);
}

TEST(EngineNp2, SaveTp2MspResumeDp2Zero1) {
  check_resume({"tp2 msp -> dp2 zero1", {}}, layout(2, TensorMode::kMsp),
               layout(1, TensorMode::kMtp, -1), 2);
}

TEST(EngineNp2, SaveDp2ResumeTp2Fsp) {
  check_resume({"dp2 -> tp2 fsp", {}}, layout(1, TensorMode::kMtp), layout(2, TensorMode::kFsp), 3);
}

// ZeRO-1 state round trips: slices gathered into full HF moments resume without ZeRO-1, and a
// plain dp2 checkpoint resumes into slices.
TEST(EngineNp2, SaveDp2Zero1ResumeDp2) {
  check_resume({"dp2 zero1 -> dp2", {}}, layout(1, TensorMode::kMtp, -1), layout(1, TensorMode::kMtp, 1), 2);
}

TEST(EngineNp2, SaveDp2ResumeDp2Zero1) {
  check_resume({"dp2 -> dp2 zero1", {}}, layout(1, TensorMode::kMtp, 1), layout(1, TensorMode::kMtp, -1), 3);
}

// ZeRO-1 shards the AdamW state itself: each of 2 ranks holds its own slice of m and v (about half
// of the 2·n floats), the slices cover the buffer exactly, and without ZeRO-1 each rank holds 2·n.
TEST(EngineNp2, Zero1HoldsHalfTheState) {
  ParityCase c{"zero1 state", {}};
  for (int zero1 : {-1, 1}) {
    parallel::Grid grid = parallel::make_grid(world(), layout(1, TensorMode::kMtp, zero1));
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
    const int64_t n = engine.local_layout().numel();
    int64_t total = adam.state_numel();
    world()->all_reduce(&total, 1);
    if (zero1 == 1) {
      EXPECT_EQ(adam.state_numel(), 2 * n);
      continue;
    }
    EXPECT_EQ(adam.state_numel(), 2 * (adam.shard_end() - adam.shard_begin()));
    EXPECT_LE(std::abs(adam.state_numel() - n), 2) << "n = " << n;  // ceil(n/2) or floor(n/2)
    EXPECT_EQ(total, 2 * n);
  }
}

// Layout errors come from the constructor, before any parameter is allocated, on every rank.
TEST(EngineNp2, LayoutErrors) {
  model::ModelConfig one_kv = tiny_model(1);  // 4 heads divide by 2, 1 kv head does not
  std::string e = engine_error(one_kv, layout(2, TensorMode::kMtp), 16);
  EXPECT_NE(e.find("num_kv_attention_heads (1)"), std::string::npos) << e;
  model::ModelConfig three = tiny_model(3);
  three.num_attention_heads = 3, three.hidden_size = 24;
  e = engine_error(three, layout(2, TensorMode::kMsp), 16);
  EXPECT_NE(e.find("num_attention_heads (3)"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout(2, TensorMode::kMsp), 15);
  EXPECT_NE(e.find("15"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout(2, TensorMode::kFsp), 15);
  EXPECT_NE(e.find("15"), std::string::npos) << e;
  // Vocabulary 101 is not divisible by 2: split unevenly, no error (the parity tests check loss).
  EXPECT_EQ(engine_error(tiny_model(), layout(2, TensorMode::kMtp), 16), "");
}

}  // namespace
}  // namespace longtron::testing
