// 2D-Attention on 4 ranks against the dense attention (see cp_attention_cases.h): hp1 x cp4
// (with 1 kv head: no repetition), hp2 x cp2 (2 kv heads split, 1 kv head repeated); ring and
// all-gather forms, the double ring (window_size 2, both placements), sliding windows.
#include "cp_attention_cases.h"

namespace longtron::testing {
namespace {

TEST(CpAttentionNp4, Cp4) {
  check_context_attention_all(1, 4);
  check_context_attention_all(1, 1);
}

TEST(CpAttentionNp4, Hp2Cp2) {
  check_context_attention_all(2, 2);
  check_context_attention_all(2, 1);
}

TEST(CpAttentionNp4, Cp4FormsAndWindows) { check_context_attention_forms(1, 1); }

TEST(CpAttentionNp4, Hp2Cp2FormsAndWindows) { check_context_attention_forms(2, 2); }

TEST(CpAttentionNp4, Cp4DoubleRingBothPlacements) {
  check_context_attention_forms(1, 2, /*window_size=*/2, /*interleaved=*/false);
  check_context_attention_forms(1, 2, /*window_size=*/2, /*interleaved=*/true);
}

}  // namespace
}  // namespace longtron::testing
