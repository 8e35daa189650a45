// Activation recomputation per block (model.checkpoint = true) in every mode of the engine on 2
// ranks: parity with one process is unchanged (same contract as engine_parity.h).
#include "engine_parity.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

ParityCase recompute(const std::string& name, parallel::Layout l) {
  ParityCase c{name + " checkpoint", l};
  c.model.checkpoint = true;
  return c;
}

TEST(RecomputeNp2, Dp2) { check_parity(recompute("dp2", layout(1, TensorMode::kMtp))); }
TEST(RecomputeNp2, Mtp) { check_parity(recompute("tp2 mtp", layout(2, TensorMode::kMtp))); }
TEST(RecomputeNp2, Msp) { check_parity(recompute("tp2 msp", layout(2, TensorMode::kMsp))); }
TEST(RecomputeNp2, Fsp) { check_parity(recompute("tp2 fsp", layout(2, TensorMode::kFsp))); }
TEST(RecomputeNp2, Isp) {
  parallel::Layout l = layout(2, TensorMode::kIsp);
  l.weight_size = 2;
  check_parity(recompute("isp2 W=2", l));
}

// The chunked recomputation with chunks of 3 tokens (boundaries inside the rows' documents) and
// attention groups of 12 queries, against one process chunked alike: data parallel (whose ranks
// chunk too) and ISP (whose ops recompute each block whole).
ParityCase small_chunks(const std::string& name, parallel::Layout l) {
  ParityCase c = recompute(name + " chunks 3", l);
  c.model.chunk_tokens = 3;
  return c;
}
TEST(RecomputeNp2, SmallChunksDp2) { check_parity(small_chunks("dp2", layout(1, TensorMode::kMtp))); }
TEST(RecomputeNp2, SmallChunksIsp) {
  parallel::Layout l = layout(2, TensorMode::kIsp);
  l.weight_size = 2;
  check_parity(small_chunks("isp2 W=2", l));
}

}  // namespace
}  // namespace longtron::testing
