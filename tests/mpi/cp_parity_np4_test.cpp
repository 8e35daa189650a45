// 2D-Attention through the engine on 4 ranks against one process (see cp_parity.h): hp1 x cp4
// with 1 kv head, hp2 x cp2 (W = 4 with overlap, both placements; recomputation with 1 kv head
// repeated), cp4 with window_size 2 interleaved, dp2 x (hp1 x cp2) with ZeRO-1, every balance,
// edge rows and unpacked rows whose shards are all padding; a Mistral model with a window (3)
// shorter than its documents under hp2 x cp2 and cp4 for every balance.
#include "cp_parity.h"

namespace longtron::testing {
namespace {

TEST(CpParityNp4, Cp4OneKvHead) {
  for (const char* b : kBalances) {
    IspCase c{std::string("cp4 1 kv head ") + b, seq2d(4, 4, 1, b)};
    c.model = tiny_model(1);
    check_isp_parity(c);
  }
}

TEST(CpParityNp4, Hp2Cp2OverlapBothPlacements) {
  for (const char* b : kBalances)
    for (bool head_first : {true, false}) {
      IspCase c{std::string("hp2xcp2 W4 overlap ") + b + (head_first ? "" : " ctx-first"),
                seq2d(4, 4, 2, b, head_first)};
      c.layout.weight_overlap = true;
      check_isp_parity(c);
    }
}

TEST(CpParityNp4, RecomputationRepeatedKvAndWindow) {
  IspCase r{"hp2xcp2 checkpoint 1 kv head", seq2d(4, 4, 2, "document")};
  r.model = tiny_model(1);  // head_size 2 > 1 kv head: repeated inside the head group
  r.model.checkpoint = true;
  check_isp_parity(r);
  // window_size 2 with interleaved context ranks (context first): accepted, no effect on results.
  IspCase w{"cp4 window 2 interleaved", seq2d(4, 4, 1, "zigzag", /*head_first=*/false)};
  w.layout.seq2d_window = 2;
  w.layout.seq2d_interleaved = true;
  check_isp_parity(w);
}

TEST(CpParityNp4, Hp2Cp2Tied) {
  IspCase c{"hp2xcp2 W4 tied zigzag", seq2d(4, 4, 2, "zigzag")};
  c.model = tied_model();
  check_isp_parity(c);
}

TEST(CpParityNp4, Dp2Cp2Zero1) {
  IspCase c{"dp2 x cp2 zero1", seq2d(2, 2, 1, "document")};
  c.layout.zero1_size = -1;
  check_isp_parity(c);
}

TEST(CpParityNp4, EdgeRowsAndPaddingShards) {
  for (const char* b : kBalances) {
    IspCase c{std::string("hp2xcp2 edge rows ") + b, seq2d(4, 4, 2, b)};
    c.row = edge_rows(c.model.vocab_size);
    check_isp_parity(c);
  }
  // 2 documents of <= 4 tokens in a 16-token row: under contiguous, context ranks 2 and 3 hold
  // only padding.
  IspCase u{"cp4 unpacked, shards all pad", seq2d(4, 4, 1, "contiguous")};
  u.row = unpacked_rows(8, 2, 4, u.model.vocab_size);
  check_isp_parity(u);
}

TEST(CpParityNp4, MistralWindowEveryBalance) {
  for (const char* b : kBalances) {
    IspCase c{std::string("hp2xcp2 window 3 edge rows ") + b, seq2d(4, 4, 2, b)};
    c.model = windowed_model();
    c.row = edge_rows(c.model.vocab_size);
    check_isp_parity(c);
    IspCase q{std::string("cp4 window 3 1 kv head ") + b, seq2d(4, 4, 1, b)};
    q.model = windowed_model(1);
    check_isp_parity(q);
  }
}

}  // namespace
}  // namespace longtron::testing
