// The distributed engine on 4 ranks against one process on the same global batch (docs/parallel.md):
// dp2×tp2 in each Megatron mode (with and without ZeRO-1), tp4 MSP on a model with 4 kv heads,
// dp4 with ZeRO-1 over 2 ranks, and a checkpoint moved between layouts.
#include "engine_parity.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(EngineNp4, Dp2Tp2Mtp) { check_parity({"dp2 tp2 mtp", layout(2, TensorMode::kMtp)}); }
TEST(EngineNp4, Dp2Tp2MspZero1) {
  check_parity({"dp2 tp2 msp zero1", layout(2, TensorMode::kMsp, -1)});
}
TEST(EngineNp4, Dp2Tp2Fsp) { check_parity({"dp2 tp2 fsp", layout(2, TensorMode::kFsp)}); }
TEST(EngineNp4, Dp2Tp2MtpZero1) {
  check_parity({"dp2 tp2 mtp zero1", layout(2, TensorMode::kMtp, -1)});
}

TEST(EngineNp4, Tp4Msp) {
  ParityCase c{"tp4 msp (4 kv heads)", layout(4, TensorMode::kMsp)};
  c.model = tiny_model(4);
  check_parity(c);
}

TEST(EngineNp4, Tp4MtpTied) {  // 101 vocabulary rows over 4 ranks: 26, 25, 25, 25
  ParityCase c{"tp4 mtp tied", layout(4, TensorMode::kMtp)};
  c.model = tied_model(4);
  check_parity(c);
}

TEST(EngineNp4, Dp2Tp2MspTiedZero1) {
  ParityCase c{"dp2 tp2 msp tied zero1", layout(2, TensorMode::kMsp, -1)};
  c.model = tied_model();
  check_parity(c);
}

TEST(EngineNp4, Dp4Zero1Of2) { check_parity({"dp4 zero1=2", layout(1, TensorMode::kMtp, 2)}); }

TEST(EngineNp4, SaveDp2Tp2FspResumeTp4Mtp) {
  // The case's own layout is unused (check_resume takes both); named for GCC 12, which warns
  // of a value-initialised Layout's strings.
  ParityCase c{"dp2 tp2 fsp -> tp4 mtp", layout(4, TensorMode::kMtp)};
  c.model = tiny_model(4);
  check_resume(c, layout(2, TensorMode::kFsp, -1), layout(4, TensorMode::kMtp), 2);
}

}  // namespace
}  // namespace longtron::testing
