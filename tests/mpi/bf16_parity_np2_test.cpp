// bf16 mixed precision (model.dtype = "bfloat16") on 2 ranks against one bf16 process on the same
// global batch: dp2, tp2 in each Megatron mode, ISP, 2D-Attention's context parallelism (cp2, each
// balance) and a Mistral model whose sliding window is shorter than its documents; contract (docs/parallel.md): step-1 loss within
// 1e-3 relative and gradient norm within 1e-2. Every GEMM rounds its inputs to bf16 elementwise, so
// sharding changes only fp32 summation orders; a changed order can move an activation across a
// bf16 rounding boundary, hence the looser bounds than fp32's. The layout must also be as far from
// the fp32 run as the bf16 reference is (its GEMMs were bf16).
#include "bf16_here.h"
#include "cp_parity.h"

#include "ops/precision.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

void check_bf16_parity(const ParityCase& c) {
  if (longtron::testing::bf16_gemm_refused_here()) return;  // the same on every rank
  const RunResult fp32 = run_reference(c);
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const RunResult ref = run_reference(c, ops::ComputeType::kBFloat16);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  engine.set_compute_type(ops::ComputeType::kBFloat16);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  RunResult got;
  run_engine_steps(engine, adam, c, 0, c.steps, got);
  const ParityErrors e = parity_errors(engine.full_layout(), got, ref);
  const ParityErrors vs32 = parity_errors(engine.full_layout(), ref, fp32);
  if (world()->rank() == 0)
    std::printf("[bf16 parity] %-18s mode %-5s: step-1 loss %.6f rel err %.2e, grad norm %.6f "
                "rel err %.2e, max grad err %.2e (%s), %d-step loss max rel err %.2e; bf16 vs "
                "fp32 reference: loss %.2e, norm %.2e, grads %.2e\n",
                c.name.c_str(), engine.mode().c_str(), ref.losses[0], e.loss1, ref.norms[0],
                e.norm1, e.grads, e.worst.c_str(), c.steps, e.losses, vs32.loss1, vs32.norm1,
                vs32.grads);
  EXPECT_LT(e.loss1, 1e-3) << c.name;
  EXPECT_LT(e.norm1, 1e-2) << c.name;
  // Its GEMMs were bf16: the layout is as far from the fp32 run as the bf16 reference is.
  const ParityErrors got_vs32 = parity_errors(engine.full_layout(), got, fp32);
  EXPECT_GT(got_vs32.grads, 0.5 * vs32.grads) << c.name << " looks like a float32 run";
  // Sharding alone changes only fp32 summation orders, so those layouts stay much closer to the
  // bf16 reference than bf16 is to fp32. Ring attention (context parallel) also rounds each key
  // block's probabilities to bf16 against that block's own row maximum, a different rounding path
  // of the same size as bf16's own error: there the contract bounds above are the test.
  if (!c.layout.seq2d) {
    EXPECT_LT(e.grads, 0.5 * vs32.grads) << c.name << " worst tensor " << e.worst;
  }
}

TEST(Bf16ParityNp2, Dp2) { check_bf16_parity({"dp2", layout(1, TensorMode::kMtp, 1)}); }
TEST(Bf16ParityNp2, Dp2Zero1) { check_bf16_parity({"dp2 zero1", layout(1, TensorMode::kMtp, -1)}); }
TEST(Bf16ParityNp2, Tp2Mtp) { check_bf16_parity({"tp2 mtp", layout(2, TensorMode::kMtp)}); }
TEST(Bf16ParityNp2, Tp2Msp) { check_bf16_parity({"tp2 msp", layout(2, TensorMode::kMsp)}); }
TEST(Bf16ParityNp2, Tp2Fsp) { check_bf16_parity({"tp2 fsp", layout(2, TensorMode::kFsp)}); }
TEST(Bf16ParityNp2, Isp2) { check_bf16_parity({"isp2", isp(2, 1)}); }
TEST(Bf16ParityNp2, Isp2Weight2) { check_bf16_parity({"isp2 w2", isp(2, 2)}); }

TEST(Bf16ParityNp2, Cp2EveryBalance) {
  for (const char* b : kBalances) check_bf16_parity({std::string("cp2 ") + b, seq2d(2, 2, 1, b)});
}
TEST(Bf16ParityNp2, WindowIsp2AndCp2) {
  ParityCase isp2{"isp2 window", isp(2, 1)};
  isp2.model = windowed_model();
  check_bf16_parity(isp2);
  ParityCase tp2{"tp2 window", layout(2, TensorMode::kMtp)};
  tp2.model = windowed_model();
  check_bf16_parity(tp2);
  for (const char* b : {"zigzag", "document"}) {
    ParityCase cp2{std::string("cp2 window ") + b, seq2d(2, 2, 1, b)};
    cp2.model = windowed_model();
    check_bf16_parity(cp2);
  }
}

}  // namespace
}  // namespace longtron::testing
