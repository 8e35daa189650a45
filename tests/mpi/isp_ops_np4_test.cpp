// ISP ops on 4 ranks against the dense ops (see isp_ops_cases.h): T=4, W != T, dp2 x isp2.
#include "isp_ops_cases.h"

namespace longtron::testing {
namespace {

TEST(IspOpsNp4, AllToAllPair) { check_all_to_all(); }

TEST(IspOpsNp4, Linear) {
  model::ParamTable full(op_model(2));
  for (const Layout& l : {isp_layout(4, 4), isp_layout(2, 4), isp_layout(4, 2), isp_layout(2, 2)}) {
    check_linear(l, full.layers[0].w1, false);  // 85 rows: uneven over 2 and 4
    check_linear(l, full.output, false);
  }
}

TEST(IspOpsNp4, Bf16GathersMoveHalfTheBytesAndRoundAsBefore) {
  check_bf16_gathers(isp_layout(4, 4), true, true);   // 37 and 85 rows over 4: padded chunks
  check_bf16_gathers(isp_layout(2, 2), false, false);  // two weight groups
}

TEST(IspOpsNp4, Attention) {
  check_attention(isp_layout(4, 4), 4);
  check_attention(isp_layout(4, 4), 2);  // each kv head repeated twice
  check_attention(isp_layout(4, 4), 1);  // repeated 4 times
  check_attention(isp_layout(4, 4), 2, 8);  // the kernels over groups of whole documents
  check_attention(isp_layout(2, 2), 2);  // two sequence-parallel groups
}

TEST(IspOpsNp4, Embedding) {
  check_embedding(isp_layout(4, 4));
  check_embedding(isp_layout(4, 2));
  check_embedding(isp_layout(2, 4));
}

TEST(IspOpsNp4, HeadWithAPaddingShard) {
  check_head(isp_layout(4, 4));
  check_head(isp_layout(2, 4));
  check_head(isp_layout(4, 2));
}

}  // namespace
}  // namespace longtron::testing
