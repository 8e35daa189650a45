// LoRA on 4 ranks against one process (lora_parity.h): data × tensor parallel with ZeRO-1 over
// the adapters, and tensor parallel over 4 ranks (4 kv heads).
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
TEST(LoraNp4, Msp4) {
  check_lora_parity(lora_case("msp4 llama", layout(4, TensorMode::kMsp), "llama", 4));
}

}  // namespace
}  // namespace longtron::testing
