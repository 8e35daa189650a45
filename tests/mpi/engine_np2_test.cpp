// The distributed engine on 2 ranks against one process on the same global batch (SPEC §3):
// dp2 (ZeRO-1 off and on), tp2 in each Megatron mode, a checkpoint saved under one layout and
// resumed under another, and layout errors raised before any work.
#include "engine_parity.h"

#include "core/error.h"

namespace longtron::testing {
namespace {

using comm::TensorMode;

TEST(EngineNp2, Dp2) { check_parity({"dp2", layout(1, TensorMode::kMtp, 1)}); }
TEST(EngineNp2, Dp2Zero1) { check_parity({"dp2 zero1", layout(1, TensorMode::kMtp, -1)}); }
TEST(EngineNp2, Tp2Mtp) { check_parity({"tp2 mtp", layout(2, TensorMode::kMtp)}); }
TEST(EngineNp2, Tp2Msp) { check_parity({"tp2 msp", layout(2, TensorMode::kMsp)}); }
TEST(EngineNp2, Tp2Fsp) { check_parity({"tp2 fsp", layout(2, TensorMode::kFsp)}); }

TEST(EngineNp2, Tp2MspCheckpointedBlocks) {
  ParityCase c{"tp2 msp checkpoint", layout(2, TensorMode::kMsp)};
  c.model.checkpoint = true;
  check_parity(c);
}

TEST(EngineNp2, SaveTp2MspResumeDp2Zero1) {
  check_resume({"tp2 msp -> dp2 zero1", {}}, layout(2, TensorMode::kMsp),
               layout(1, TensorMode::kMtp, -1), 2);
}

TEST(EngineNp2, SaveDp2ResumeTp2Fsp) {
  check_resume({"dp2 -> tp2 fsp", {}}, layout(1, TensorMode::kMtp), layout(2, TensorMode::kFsp), 3);
}

// Layout errors come from the constructor, before any parameter is allocated, on every rank.
TEST(EngineNp2, LayoutErrors) {
  model::ModelConfig one_kv = tiny_model(1);  // 4 heads divide by 2, 1 kv head does not
  std::string e = engine_error(one_kv, layout(2, TensorMode::kMtp), 16);
  EXPECT_NE(e.find("num_kv_attention_heads (1)"), std::string::npos) << e;
  model::ModelConfig three = tiny_model(3);
  three.num_attention_heads = 3, three.hidden_size = 24;
  e = engine_error(three, layout(2, TensorMode::kMsp), 16);
  EXPECT_NE(e.find("num_attention_heads (3)"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout(2, TensorMode::kMsp), 15);
  EXPECT_NE(e.find("15"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout(2, TensorMode::kFsp), 15);
  EXPECT_NE(e.find("15"), std::string::npos) << e;
  // Vocabulary 101 is not divisible by 2: split unevenly, no error (the parity tests check loss).
  EXPECT_EQ(engine_error(tiny_model(), layout(2, TensorMode::kMtp), 16), "");
}

}  // namespace
}  // namespace longtron::testing
