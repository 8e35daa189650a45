// ISP ops on 2 ranks against the dense ops (see isp_ops_cases.h).
#include "isp_ops_cases.h"

namespace longtron::testing {
namespace {

TEST(IspOpsNp2, AllToAllPair) { check_all_to_all(); }

TEST(IspOpsNp2, Linear) {
  model::ParamTable full(op_model(2));
  for (const Layout& l : {isp_layout(2, 2), isp_layout(2, 1), isp_layout(1, 2)}) {
    check_linear(l, full.layers[0].wqkv, false);
    check_linear(l, full.output, false);  // 37 rows: uneven shards
  }
  check_linear(isp_layout(2, 2), full.layers[0].w1, true);
}

TEST(IspOpsNp2, Bf16GathersMoveHalfTheBytesAndRoundAsBefore) {
  for (bool step_copy : {false, true}) {
    check_bf16_gathers(isp_layout(2, 2), step_copy, false);
    check_bf16_gathers(isp_layout(1, 2), step_copy, true);
  }
  check_bf16_gathers(isp_layout(2, 1), true, false);  // W = 1: nothing to gather
}

TEST(IspOpsNp2, Attention) {
  check_attention(isp_layout(2, 2), 2);
  check_attention(isp_layout(2, 2), 1);  // T > kv heads: the kv head is repeated
  check_attention(isp_layout(2, 2), 4);
  check_attention(isp_layout(2, 2), 2, 4);  // the kernels over groups of whole documents
}

TEST(IspOpsNp2, Embedding) {
  check_embedding(isp_layout(2, 2));
  check_embedding(isp_layout(2, 1));
}

TEST(IspOpsNp2, HeadWithAPaddingShard) {
  check_head(isp_layout(2, 2));
  check_head(isp_layout(2, 1));
}

TEST(IspOpsNp2, HeadsThatCannotBeDivided) {
  EXPECT_THROW(parallel::ulysses_heads(6, 2, 4), Error);  // 6 heads over 4 ranks
  EXPECT_THROW(parallel::ulysses_heads(6, 3, 2), Error);  // 3 kv heads over 2 ranks
  EXPECT_NO_THROW(parallel::ulysses_heads(8, 2, 4));      // kv heads repeated twice
  try {
    parallel::ulysses_heads(6, 3, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_kv_attention_heads = 3"), std::string::npos);
  }
}

}  // namespace
}  // namespace longtron::testing
