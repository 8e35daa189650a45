// LoRA on 4 ranks against one process (lora_parity.h): data × tensor parallel with ZeRO-1 over
// the adapters, tensor parallel over 4 ranks (4 kv heads) and 2D tensor parallel.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // as engine_np2_test.cpp (GCC 12)
#include "lora_parity.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(LoraNp4, Dp2Mtp2Zero1) {
  check_lora_parity(lora_case("dp2 mtp2 zero1", layout(2, TensorMode::kMtp, -1), "llama"));
}
TEST(LoraNp4, Dp2Fsp2) {
  check_lora_parity(lora_case("dp2 fsp2", layout(2, TensorMode::kFsp), "internlm2"));
}
// 2D tensor parallel 2×2: every adapter split on one dim and summed over the other group.
TEST(LoraNp4, Tp2dX2Y2) {
  check_lora_parity(lora_case("2d x2 y2 llama", lora_2d(2, 2), "llama"));
  ParityCase c = lora_case("2d x2 y2 internlm2 checkpoint", lora_2d(2, 2), "internlm2");
  c.model.checkpoint = true;
  check_lora_parity(c);
}
TEST(LoraNp4, Dp2Tp2dX1Y2) {
  check_lora_parity(lora_case("dp2 2d x1 y2 zero1", lora_2d(1, 2), "llama"));
}
TEST(LoraNp4, Tp2dSaveX2Y2ResumeMsp4) {
  ParityCase c = lora_case("2d x2 y2 -> msp4", lora_2d(2, 2), "llama", 4);
  c.steps = 4;
  check_lora_resume(c, lora_2d(2, 2), layout(4, TensorMode::kMsp), 2);
}
// ISP with the adapters sharded over 4 weight ranks: A's 3 rows leave one rank an empty shard,
// B's rows (85 of w1/w3, 16 of k/v) are uneven; and weight 2 of tensor 4 (two WEIGHT groups).
TEST(LoraNp4, Isp4) {
  check_lora_parity(lora_case("isp4 w4 llama", lora_isp(4, 4), "llama"));
  ParityCase c = lora_case("isp4 w2 internlm2 checkpoint", lora_isp(4, 2), "internlm2");
  c.model.checkpoint = true;
  check_lora_parity(c);
}
TEST(LoraNp4, Msp4) {
  check_lora_parity(lora_case("msp4 llama", layout(4, TensorMode::kMsp), "llama", 4));
}

}  // namespace
}  // namespace longtron::testing
