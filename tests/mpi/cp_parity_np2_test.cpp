// 2D-Attention through the engine on 2 ranks against one process (see cp_parity.h): hp1 x cp2
// for every balance, on random rows and on the edge rows (one document, length-1 documents,
// documents longer than a rank's share), and a Mistral model whose sliding window (3) is shorter
// than its documents, for every balance.
#include "cp_parity.h"

namespace longtron::testing {
namespace {

TEST(CpParityNp2, Cp2EveryBalance) {
  for (const char* b : kBalances) check_isp_parity({std::string("cp2 ") + b, seq2d(2, 2, 1, b)});
}

TEST(CpParityNp2, Cp2TiedEveryBalance) {
  for (const char* b : kBalances) {
    IspCase c{std::string("cp2 tied ") + b, seq2d(2, 2, 1, b)};
    c.model = tied_model();
    check_isp_parity(c);
  }
}

TEST(CpParityNp2, Cp2EdgeRows) {
  for (const char* b : kBalances) {
    IspCase c{std::string("cp2 edge rows ") + b, seq2d(2, 2, 1, b)};
    c.row = edge_rows(c.model.vocab_size);
    check_isp_parity(c);
  }
}

TEST(CpParityNp2, Cp2MistralWindowEveryBalance) {
  IspCase full{"no window", seq2d(2, 2, 1, "zigzag")};
  full.model = windowed_model();
  const RunResult windowed = isp_reference(full);
  full.model.sliding_window = 0;
  EXPECT_NE(isp_reference(full).losses[0], windowed.losses[0])
      << "the window changes nothing: the parity below would not see it ignored";
  for (const char* b : kBalances)
    for (bool edge : {false, true}) {
      IspCase c{std::string("cp2 window 3 ") + (edge ? "edge rows " : "") + b,
                seq2d(2, 2, 1, b)};
      c.model = windowed_model();
      if (edge) c.row = edge_rows(c.model.vocab_size);
      check_isp_parity(c);
    }
}

}  // namespace
}  // namespace longtron::testing
