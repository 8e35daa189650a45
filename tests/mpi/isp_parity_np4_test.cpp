// ISP through the engine on 4 ranks against one process (see isp_parity.h): T=4 (4 kv heads and
// 2 kv heads repeated), W != T both ways, dp2 x isp2 with ZeRO-1, overlap, recomputation,
// unpacked rows and shards that are all padding.
#include "isp_parity.h"

namespace longtron::testing {
namespace {

IspCase with_kv(IspCase c, int kv) {
  c.model = tiny_model(kv);
  return c;
}

TEST(IspParityNp4, T4) { check_isp_parity(with_kv({"isp4 4 kv heads", isp(4, 4)}, 4)); }

TEST(IspParityNp4, T4KvRepeated) {
  check_isp_parity(with_kv({"isp4 2 kv heads (repeated)", isp(4, 4)}, 2));
}

TEST(IspParityNp4, T4Weight2) { check_isp_parity(with_kv({"isp4 W=2 (W < T)", isp(4, 2)}, 4)); }

TEST(IspParityNp4, T4Weight2Tied) {
  IspCase c = with_kv({"isp4 W=2 tied", isp(4, 2)}, 4);
  c.model.tie_word_embeddings = true;
  check_isp_parity(c);
}

TEST(IspParityNp4, T2Weight4) { check_isp_parity({"dp2 isp2 W=4 (W > T)", isp(2, 4)}); }

TEST(IspParityNp4, Dp2Isp2Zero1) {
  IspCase c{"dp2 isp2 zero1", isp(2, 2)};
  c.layout.zero1_size = -1;
  check_isp_parity(c);
}

TEST(IspParityNp4, OverlapAndCheckpoint) {
  IspCase c = with_kv({"isp4 2 kv heads checkpoint", isp(4, 4)}, 2);
  c.model.checkpoint = true;
  check_overlap_identical(c);
}

TEST(IspParityNp4, UnpackedWithPaddingShards) {
  // 2 documents of <= 4 tokens in a 16-token row: ranks 2 and 3 hold only padding.
  IspCase c = with_kv({"isp4 unpacked, 2 shards all pad", isp(4, 4)}, 2);
  c.row = unpacked_rows(8, 2, 4, c.model.vocab_size);
  check_isp_parity(c);
}

}  // namespace
}  // namespace longtron::testing
