// 2D-Attention through the engine on 4 ranks against one process (see cp_parity.h): hp1 x cp4
// with 1 kv head, hp2 x cp2 (W = 4 with overlap, both placements; recomputation with 1 kv head
// repeated), cp4 with window_size 2 (the double ring) in both placements for every balance, the
// all-gather form, dp2 x (hp1 x cp2) with ZeRO-1, every balance,
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
}

TEST(CpParityNp4, DoubleRingWindowSize2EveryBalanceBothPlacements) {
  // window_size 2: two inner rings of 2 context ranks and an outer ring between them; interleaved
  // (context first) takes context ranks {0, 2} and {1, 3} as the inner rings.
  for (const char* b : kBalances)
    for (bool interleaved : {false, true}) {
      IspCase w{std::string("cp4 window_size 2 ") + b + (interleaved ? " interleaved" : ""),
                seq2d(4, 4, 1, b, /*head_first=*/!interleaved)};
      w.layout.seq2d_window = 2;
      w.layout.seq2d_interleaved = interleaved;
      w.row = edge_rows(w.model.vocab_size);
      check_isp_parity(w);
    }
  IspCase m{"cp4 window_size 2 Mistral window 3", seq2d(4, 4, 1, "document")};
  m.layout.seq2d_window = 2;
  m.model = windowed_model();
  check_isp_parity(m);
}

TEST(CpParityNp4, AllGatherForm) {
  for (const char* b : kBalances) {
    IspCase c{std::string("cp4 all-gather form ") + b, seq2d(4, 4, 1, b)};
    c.layout.seq2d_ring = false;
    check_isp_parity(c);
  }
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
