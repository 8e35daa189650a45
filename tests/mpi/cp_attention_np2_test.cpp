// 2D-Attention on 2 ranks against the dense attention (see cp_attention_cases.h): hp1 x cp2, ring
// (default) and all-gather forms, with and without sliding windows, short and multi-tile rows.
#include "cp_attention_cases.h"

namespace longtron::testing {
namespace {

TEST(CpAttentionNp2, Cp2) {
  check_context_attention_all(1, 2);
  check_context_attention_all(1, 1);
}

TEST(CpAttentionNp2, Cp2FormsAndWindows) { check_context_attention_forms(1, 2); }

}  // namespace
}  // namespace longtron::testing
