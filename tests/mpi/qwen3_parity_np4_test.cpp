// Qwen3 (per-head q/k norms) on 4 ranks against one process: Megatron with one kv head per rank,
// dp2 × tp2, ISP over 4 ranks and 2D tensor parallel x2×y2 (see qwen3_parity.h).
#include "qwen3_parity.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(Qwen3Np4, Msp4) {
  ParityCase c{"qwen3 tp4 msp", layout(4, TensorMode::kMsp)};
  c.model = qwen3_model(4);
  check_parity(c);
}

TEST(Qwen3Np4, Dp2Tp2Zero1) {
  ParityCase c{"qwen3 dp2 tp2 zero1", layout(2, TensorMode::kFsp, -1)};
  c.model = qwen3_model();
  check_parity(c);
}

TEST(Qwen3Np4, Isp4Weight4) {
  IspCase c{"qwen3 isp4 w4", isp(4, 4)};
  c.model = qwen3_model(4);
  check_isp_parity(c);
}

TEST(Qwen3Np4, TwoDX2Y2) {
  ParityCase c{"qwen3 2d x2 y2", layout_2d(2, 2)};
  c.model = qwen3_model();
  check_parity(c);
}

}  // namespace
}  // namespace longtron::testing
