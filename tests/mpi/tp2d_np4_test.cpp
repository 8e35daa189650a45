// 2D tensor parallel on 4 ranks: x2×y2 (with each overlap option), x1×y4, dp2×(x2×y1) and
// dp2×(x1×y2) with ZeRO-1, against one process; overlaps equal (to float rounding) to "none"; per-x heads by y.
#include "tp2d_cases.h"
#include "tp2d_linear_cases.h"

namespace longtron::testing {
namespace {

TEST(Tp2dNp4, Linear2DMatchesDense) { check_linear_2d_grid(2, 2); }

TEST(Tp2dNp4, X2Y2) { check_parity({"2d x2 y2", layout_2d(2, 2)}); }
TEST(Tp2dNp4, X2Y2AgWithMatmul) { check_parity({"2d x2 y2 ag_with_matmul", layout_2d(2, 2, "ag_with_matmul")}); }
TEST(Tp2dNp4, X2Y2MatmulWithRs) { check_parity({"2d x2 y2 matmul_with_rs", layout_2d(2, 2, "matmul_with_rs")}); }
TEST(Tp2dNp4, X2Y2Tied) {
  ParityCase c{"2d x2 y2 tied", layout_2d(2, 2)};
  c.model = tied_model();
  check_parity(c);
}
TEST(Tp2dNp4, X1Y4) { check_parity({"2d x1 y4", layout_2d(1, 4)}); }
TEST(Tp2dNp4, Dp2X2Y1) { check_parity({"dp2 x 2d x2 y1", layout_2d(2, 1)}); }
TEST(Tp2dNp4, Dp2X2Y1Zero1) { check_parity({"dp2 x 2d x2 y1 zero1", layout_2d(2, 1, "none", -1)}); }
TEST(Tp2dNp4, Dp2X1Y2MatmulWithRs) { check_parity({"dp2 x 2d x1 y2 mm_rs", layout_2d(1, 2, "matmul_with_rs")}); }

TEST(Tp2dNp4, SaveX2Y2ResumeMspTp4) {
  ParityCase c{"2d x2 y2 -> msp tp4", layout(1, parallel::TensorMode::kMtp)};
  c.model = tiny_model(4);  // tp4 MSP needs kv heads divisible by 4
  check_resume(c, layout_2d(2, 2), layout(4, parallel::TensorMode::kMsp), 3);
}

TEST(Tp2dNp4, OverlapsEqualNone) {  // see tp2d_np2_test.cpp
  ParityCase c{"overlap", layout(1, parallel::TensorMode::kMtp)};
  c.P = 48;
  for (const char* o : {"ag_with_matmul", "matmul_with_rs"})
    compare_layouts(c, layout_2d(2, 2, o), std::string("x2 y2 ") + o, layout_2d(2, 2), "none", 1e-6);
}

// Evaluation (forward only, per-token losses) under x2×y2 equals one process.
TEST(Tp2dNp4, ForwardLossTokenLosses) {
  const model::ModelConfig m = tiny_model();
  const MicroBatch row = random_row(32, m.vocab_size, 99);
  model::ParamTable layout(m);
  model::Params<float> params(layout);
  model::init_params(params, 42);
  model::Decoder<float> net(layout, params);
  std::vector<double> want, got;
  const model::LossSum ref = net.forward_loss(row, &want);
  parallel::Grid grid = parallel::make_grid(world(), layout_2d(2, 2));
  parallel::ParallelEngine engine(m, grid, 42, 32);
  const model::LossSum l = engine.forward_loss(row, &got);
  EXPECT_EQ(l.count, ref.count);
  EXPECT_LT(rel(l.sum, ref.sum), 1e-5);
  ASSERT_EQ(got.size(), want.size());
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  if (world()->rank() == 0)
    std::printf("[tp2d] x2 y2 forward_loss: loss rel err %.2e, token loss max |diff| %.2e\n",
                rel(l.sum, ref.sum), err);
  EXPECT_LT(err, 1e-4);
}

TEST(Tp2dNp4, PerXHeadsByY) {
  model::ModelConfig m = tiny_model();
  m.num_attention_heads = 2, m.num_kv_attention_heads = 2;  // 1 head per x rank, y = 2
  const std::string e = engine_error(m, layout_2d(2, 2), 16);
  EXPECT_NE(e.find("heads per x rank"), std::string::npos) << e;
}

}  // namespace
}  // namespace longtron::testing
