// LoRA on 2 ranks against one process (lora_parity.h): data parallel (ZeRO-1 off and on) and
// tensor parallel in each Megatron mode, InternLM2 (one wqkv adapter) and Llama (q/k/v adapters
// on the fused, kv-group-split wqkv), with recomputation; and the layouts not yet supported
// refused naming themselves.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // as engine_np2_test.cpp (GCC 12)
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
  if (!ops::cpu_has_avx512_bf16() || !ops::gemm_backend().native_bf16)
    GTEST_SKIP() << "this CPU has no native bf16";
  ParityCase c = lora_case("msp2 llama bf16 checkpoint", layout(2, TensorMode::kMsp), "llama");
  c.model.checkpoint = true;
  check_lora_parity(c, /*bf16=*/true);
}

}  // namespace
}  // namespace longtron::testing
