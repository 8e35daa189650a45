// 2D tensor parallel on 2 ranks: x2×y1 (= MSP) and x1×y2 against one process, with each overlap
// option; overlap options equal to "none" (to float rounding); x2×y1 against MSP; size errors.
#include "tp2d_cases.h"
#include "tp2d_linear_cases.h"

#include <tuple>

#include "core/error.h"

namespace longtron::testing {
namespace {

TEST(Tp2dNp2, Linear2DMatchesDense) {
  check_linear_2d_grid(2, 1);
  check_linear_2d_grid(1, 2);
}

TEST(Tp2dNp2, X2Y1) { check_parity({"2d x2 y1", layout_2d(2, 1)}); }
TEST(Tp2dNp2, X2Y1AgWithMatmul) { check_parity({"2d x2 y1 ag_with_matmul", layout_2d(2, 1, "ag_with_matmul")}); }
TEST(Tp2dNp2, X2Y1MatmulWithRs) { check_parity({"2d x2 y1 matmul_with_rs", layout_2d(2, 1, "matmul_with_rs")}); }
// A tied embedding/head: one table split on vocabulary rows over the tensor group (101: uneven).
TEST(Tp2dNp2, TiedX2Y1AndX1Y2) {
  for (const auto& [name, x, y] : {std::tuple{"2d x2 y1 tied", 2, 1}, std::tuple{"2d x1 y2 tied", 1, 2}}) {
    ParityCase c{name, layout_2d(x, y)};
    c.model = tied_model();
    check_parity(c);
  }
}
TEST(Tp2dNp2, X1Y2) { check_parity({"2d x1 y2", layout_2d(1, 2)}); }
TEST(Tp2dNp2, X1Y2AgWithMatmul) { check_parity({"2d x1 y2 ag_with_matmul", layout_2d(1, 2, "ag_with_matmul")}); }
TEST(Tp2dNp2, X1Y2MatmulWithRs) { check_parity({"2d x1 y2 matmul_with_rs", layout_2d(1, 2, "matmul_with_rs")}); }

TEST(Tp2dNp2, X2Y1CheckpointedBlocksZero1) {
  ParityCase c{"2d x2 y1 checkpoint", layout_2d(2, 1)};
  c.model.checkpoint = true;
  check_parity(c);
}

// Full-tensor checkpoints move between 2D and other layouts (engine gather_full/scatter_full).
TEST(Tp2dNp2, SaveX1Y2ResumeX2Y1Overlap) {
  // The case's own layout is unused (check_resume takes both); named, as GCC 12 warns of a
  // value-initialised Layout's strings.
  check_resume({"2d x1 y2 -> 2d x2 y1 ag", layout(1, parallel::TensorMode::kMtp)}, layout_2d(1, 2),
               layout_2d(2, 1, "ag_with_matmul"), 2);
}

// x2×y1 is MSP op for op: same collectives, same GEMM calls.
TEST(Tp2dNp2, X2Y1EqualsMsp) {
  ParityCase c{"x2y1 vs msp", layout(1, parallel::TensorMode::kMtp)};
  c.P = 32;
  compare_layouts(c, layout_2d(2, 1), "2d x2 y1", layout(2, parallel::TensorMode::kMsp), "msp tp2", 0.0);
}

// Each output element is the same dot product whatever the chunking; OpenBLAS picks its kernel by
// matrix shape, so a chunk's rows may round differently from the whole GEMM's (float rounding
// only: the bound is 1e-6 absolute on gradients of norm ~1.7, the measured value is printed).
TEST(Tp2dNp2, OverlapsEqualNone) {
  ParityCase c{"overlap", layout(1, parallel::TensorMode::kMtp)};
  c.P = 48;  // 24 rows per rank: 4 chunks of 6
  for (auto [x, y] : {std::pair{2, 1}, std::pair{1, 2}})
    for (const char* o : {"ag_with_matmul", "matmul_with_rs"})
      compare_layouts(c, layout_2d(x, y, o), fmt::format("x{} y{} {}", x, y, o),
                      layout_2d(x, y), "none", 1e-6);
}

TEST(Tp2dNp2, SizeErrorsNameTheConstraint) {
  model::ModelConfig m = tiny_model();  // 4 heads, 2 kv heads, hidden 32
  m.num_attention_heads = 3, m.num_kv_attention_heads = 1, m.hidden_size = 24;
  std::string e = engine_error(m, layout_2d(2, 1), 16);
  EXPECT_NE(e.find("num_attention_heads"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.tensor_2d.x"), std::string::npos) << e;
  m = tiny_model(1);  // kv heads 1 not divisible by x = 2
  e = engine_error(m, layout_2d(2, 1), 16);
  EXPECT_NE(e.find("num_kv_attention_heads"), std::string::npos) << e;
  m = tiny_model();
  m.num_attention_heads = 2, m.num_kv_attention_heads = 1, m.hidden_size = 34;  // hidden by y
  e = engine_error(m, layout_2d(1, 2), 16);
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout_2d(1, 2), 15);  // row by y
  EXPECT_NE(e.find("15"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.tensor_2d.y"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout_2d(2, 1), 15);  // row by x
  EXPECT_NE(e.find("parallel.tensor_2d.x"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout_2d(2, 2), 16);  // tp = x·y = 4 > world 2
  EXPECT_NE(e.find("x·y"), std::string::npos) << e;
  e = engine_error(tiny_model(), layout_2d(2, 1, "both"), 16);
  EXPECT_NE(e.find("parallel.tensor_2d.overlap"), std::string::npos) << e;
  parallel::Layout both = layout_2d(2, 1);
  both.tensor_size = 2;
  e = engine_error(tiny_model(), both, 16);
  EXPECT_NE(e.find("parallel.tensor_2d"), std::string::npos) << e;
}

}  // namespace
}  // namespace longtron::testing
