// 2D-Attention on 2 ranks against the dense attention (see cp_attention_cases.h): hp1 x cp2.
#include "cp_attention_cases.h"

namespace longtron::testing {
namespace {

TEST(CpAttentionNp2, Cp2) {
  check_context_attention_all(1, 2);
  check_context_attention_all(1, 1);
}

}  // namespace
}  // namespace longtron::testing
