// LoRA on 2 ranks against one process (lora_parity.h): data parallel (ZeRO-1 off and on) and
// tensor parallel in each Megatron mode, InternLM2 (one wqkv adapter) and Llama (q/k/v adapters
// on the fused, kv-group-split wqkv), with recomputation; ISP, 2D-Attention and 2D tensor
// parallel.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // as engine_np2_test.cpp (GCC 12)
#include "bf16_here.h"
#include "lora_parity.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(LoraNp2, Dp2) { check_lora_parity(lora_case("dp2", layout(1, TensorMode::kMtp, 1), "llama")); }
TEST(LoraNp2, Dp2Zero1) {
  check_lora_parity(lora_case("dp2 zero1", layout(1, TensorMode::kMtp, -1), "internlm2"));
}
TEST(LoraNp2, Mtp2) {
  check_lora_parity(lora_case("mtp2 internlm2", layout(2, TensorMode::kMtp), "internlm2"));
  check_lora_parity(lora_case("mtp2 llama", layout(2, TensorMode::kMtp), "llama"));
}
TEST(LoraNp2, Msp2) {
  check_lora_parity(lora_case("msp2 llama", layout(2, TensorMode::kMsp), "llama"));
}
TEST(LoraNp2, Fsp2WithCheckpoint) {
  ParityCase c = lora_case("fsp2 internlm2 checkpoint", layout(2, TensorMode::kFsp), "internlm2");
  c.model.checkpoint = true;
  check_lora_parity(c);
}
TEST(LoraNp2, Msp2Bf16Checkpoint) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  ParityCase c = lora_case("msp2 llama bf16 checkpoint", layout(2, TensorMode::kMsp), "llama");
  c.model.checkpoint = true;
  check_lora_parity(c, /*bf16=*/true);
}
// An even rank (one process then runs the bf16 adapters as AVX512-BF16 dot products) and a scale
// that is not a power of two (1.25): MSP's adapters run as GEMM calls and must agree.
TEST(LoraNp2, Msp2Bf16EvenRankScaleNotPowerOfTwo) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  ParityCase c = lora_case("msp2 llama bf16 rank 4 alpha 5", layout(2, TensorMode::kMsp), "llama");
  c.model.lora.rank = 4;
  c.model.lora.alpha = 5.0;
  check_lora_parity(c, /*bf16=*/true);
}

// ISP: the adapters sharded on rows over the weight group (weight 2: A's 3 rows as 2 + 1, w1's
// and w3's B 85 rows as 43 + 42) or whole (weight 1), with recomputation and bf16; the sharded
// adapters resume under MSP and back.
TEST(LoraNp2, Isp2) {
  check_lora_parity(lora_case("isp2 w2 llama", lora_isp(2, 2), "llama"));
  check_lora_parity(lora_case("isp2 w1 internlm2", lora_isp(2, 1), "internlm2"));
  ParityCase c = lora_case("isp2 w2 internlm2 checkpoint", lora_isp(2, 2), "internlm2");
  c.model.checkpoint = true;
  check_lora_parity(c);
}
// The gathers of the sharded adapters join the base's prefetch order (parallel.weight.overlap);
// each element of the adapter table is held by exactly one of the two weight ranks.
TEST(LoraNp2, Isp2OverlapAdaptersShardedOnce) {
  parallel::Layout l = lora_isp(2, 2);
  l.weight_overlap = true;
  check_lora_parity(lora_case("isp2 w2 overlap llama", l, "llama"));
  parallel::ParallelEngine engine(lora_model("llama"), parallel::make_grid(world(), l), 42, 16);
  double held[2] = {double(engine.train_layout().numel()), 0};
  world()->all_reduce(held, 1);
  held[1] = double(engine.train_full_layout().numel());
  EXPECT_EQ(held[0], held[1]);
  EXPECT_LT(double(engine.train_layout().numel()), held[1]);
}
TEST(LoraNp2, Isp2Bf16) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  check_lora_parity(lora_case("isp2 w2 llama bf16", lora_isp(2, 2), "llama"), /*bf16=*/true);
}
TEST(LoraNp2, IspSaveW2ResumeMsp2AndBack) {
  ParityCase c = lora_case("isp2 w2 -> msp2", lora_isp(2, 2), "llama");
  c.steps = 4;
  check_lora_resume(c, lora_isp(2, 2), layout(2, TensorMode::kMsp), 2);
  c.name = "msp2 -> isp2 w2";
  check_lora_resume(c, layout(2, TensorMode::kMsp), lora_isp(2, 2), 2);
}
// 2D-Attention: context parallel over 2 ranks (zigzag: each rank holds two non-adjacent chunks),
// with recomputation and bf16.
TEST(LoraNp2, ContextParallel2Bf16Checkpoint) {
  ParityCase c = lora_case("cp2 llama checkpoint", lora_isp(2, 1, 2), "llama");
  c.model.checkpoint = true;
  check_lora_parity(c);
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) return;
  c.name = "cp2 llama bf16 checkpoint";
  check_lora_parity(c, /*bf16=*/true);
}
// 2D tensor parallel: x2×y1 (B of wqkv/w1/w3 split on rows over X, A of wo/w2 on columns over
// X) and x1×y2 (the other way round), with recomputation and bf16; the adapters saved under one
// 2D layout resume under the other and under dp2.
TEST(LoraNp2, Tp2dX2Y1) {
  check_lora_parity(lora_case("2d x2 y1 llama", lora_2d(2, 1), "llama"));
  parallel::Layout overlapped = lora_2d(2, 1);  // the base's chunked forms; the adapters' u as is
  overlapped.tensor_2d_overlap = "matmul_with_rs";
  check_lora_parity(lora_case("2d x2 y1 matmul_with_rs", overlapped, "internlm2"));
}
TEST(LoraNp2, Tp2dX1Y2Checkpoint) {
  ParityCase c = lora_case("2d x1 y2 internlm2 checkpoint", lora_2d(1, 2), "internlm2");
  c.model.checkpoint = true;
  check_lora_parity(c);
}
TEST(LoraNp2, Tp2dX2Y1Bf16Checkpoint) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  ParityCase c = lora_case("2d x2 y1 llama bf16 checkpoint", lora_2d(2, 1), "llama");
  c.model.checkpoint = true;
  check_lora_parity(c, /*bf16=*/true);
}
TEST(LoraNp2, Tp2dSaveX1Y2ResumeX2Y1AndDp2) {
  ParityCase c = lora_case("2d x1 y2 -> 2d x2 y1", lora_2d(1, 2), "llama");
  c.steps = 4;
  check_lora_resume(c, lora_2d(1, 2), lora_2d(2, 1), 2);
  c.name = "2d x2 y1 -> dp2 zero1";
  check_lora_resume(c, lora_2d(2, 1), layout(1, TensorMode::kMtp, -1), 2);
}

}  // namespace
}  // namespace longtron::testing
