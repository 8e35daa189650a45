// LoRA on 2 ranks against one process (lora_parity.h): data parallel (ZeRO-1 off and on) and
// tensor parallel in each Megatron mode, InternLM2 (one wqkv adapter) and Llama (q/k/v adapters
// on the fused, kv-group-split wqkv), with recomputation; and the layouts not yet supported
// refused naming themselves.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // as engine_np2_test.cpp (GCC 12)
#include "lora_parity.h"
#include "bf16_here.h"

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

TEST(LoraNp2, Isp2) {
  check_lora_parity(lora_case("isp2 w2 llama", lora_isp(2, 2), "llama"));
  check_lora_parity(lora_case("isp2 w1 internlm2", lora_isp(2, 1), "internlm2"));
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
TEST(LoraNp2, Tp2dIsRefusedNamingTheLayout) {
  parallel::Layout l;
  l.tensor_2d_x = 2;
  l.tensor_2d_y = 1;
  const std::string e = engine_error(lora_model("llama"), l, 16);
  EXPECT_NE(e.find("[lora] under the '2d' parallel layout is not implemented"), std::string::npos) << e;
}

}  // namespace
}  // namespace longtron::testing
