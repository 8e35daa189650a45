// 2D-Attention on 4 ranks against the dense attention (see cp_attention_cases.h): hp1 x cp4
// (with 1 kv head: no repetition), hp2 x cp2 (2 kv heads split, 1 kv head repeated).
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

}  // namespace
}  // namespace longtron::testing
