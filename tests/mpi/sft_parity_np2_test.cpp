// Supervised fine-tuning rows through every 2-rank layout against one process on the same global
// batch (the parity harness): conversations stored with negative no-loss ids, packed with
// split_documents = false, so most labels are -100 and one row's second half — the second
// sequence shard under ISP / FSP / 2D — carries no label at all.
#include "isp_parity.h"
#include "tp2d_cases.h"

namespace longtron::testing {
namespace {

// A conversation of stored ids: prompt turns negated (no loss), answers positive, ids in [1, vocab).
std::vector<int32_t> conversation(std::mt19937& gen, int64_t vocab, int turns) {
  std::vector<int32_t> c;
  auto id = [&] { return std::uniform_int_distribution<int32_t>(1, int32_t(vocab) - 1)(gen); };
  for (int t = 0; t < turns; ++t) {
    for (int n = std::uniform_int_distribution<int>(1, 3)(gen); n > 0; --n) c.push_back(-id());
    for (int n = std::uniform_int_distribution<int>(1, 3)(gen); n > 0; --n) c.push_back(id());
  }
  return c;
}

// Row i of step `step`: row 0 of each step is an 8-token conversation then an 8-token prompt with
// no answer (positions 8..15 carry no label); the others pack random conversations.
MicroBatch sft_row(int step, int i, int64_t vocab) {
  std::mt19937 gen(unsigned(31 + 100 * step + i));
  std::vector<std::vector<int32_t>> docs;
  if (i == 0) {
    docs.push_back({-5, -6, -7, 8, 9, 10, 11, 12});
    std::vector<int32_t> prompt_only;
    for (int n = 0; n < 8; ++n) prompt_only.push_back(-std::uniform_int_distribution<int32_t>(1, 100)(gen));
    docs.push_back(prompt_only);
  } else {
    for (int d = 0; d < 3; ++d) docs.push_back(conversation(gen, vocab, 1 + d % 2));
  }
  data::MemorySource src(docs);
  data::PackConfig pc;
  pc.seq_len = 8;
  pc.micro_bsz = 2;
  pc.split_documents = false;
  std::vector<int64_t> order(docs.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = int64_t(d);
  return data::build_pack(src, order, pc)->row(0);
}

void check_sft_parity(const std::string& name, const parallel::Layout& l) {
  const model::ModelConfig m = tiny_model();
  const StepRows rows = [&](int step) {
    std::vector<MicroBatch> out;
    for (int i = 0; i < 4; ++i) out.push_back(sft_row(step, i, m.vocab_size));
    return out;
  };
  // The premise: row 0's second half carries no label, and every row has some -100.
  const MicroBatch r0 = rows(0)[0];
  for (size_t j = 8; j < 16; ++j) ASSERT_EQ(r0.labels[j], data::kIgnoreIndex);
  parallel::Grid grid = parallel::make_grid(world(), l);
  const RunResult ref = reference_run(m, 4, rows);
  parallel::ParallelEngine engine(m, grid, 42, 16);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  RunResult got;
  engine_steps(engine, adam, rows, 0, 4, got);
  const ParityErrors e = parity_errors(engine.full_layout(), got, ref);
  if (world()->rank() == 0)
    std::printf("[sft-parity] %-12s mode %-4s: step-1 loss %.6f rel err %.2e, max grad err %.2e "
                "(%s), 4-step loss max rel err %.2e\n",
                name.c_str(), engine.mode().c_str(), ref.losses[0], e.loss1, e.grads,
                e.worst.c_str(), e.losses);
  expect_parity(e, name);
}

using parallel::TensorMode;

TEST(SftParityNp2, Dp2) { check_sft_parity("dp2", layout(1, TensorMode::kMtp)); }
TEST(SftParityNp2, Dp2Zero1) { check_sft_parity("dp2 zero1", layout(1, TensorMode::kMtp, -1)); }
TEST(SftParityNp2, Tp2Mtp) { check_sft_parity("tp2 mtp", layout(2, TensorMode::kMtp)); }
TEST(SftParityNp2, Tp2Msp) { check_sft_parity("tp2 msp", layout(2, TensorMode::kMsp)); }
TEST(SftParityNp2, Tp2Fsp) { check_sft_parity("tp2 fsp", layout(2, TensorMode::kFsp)); }
TEST(SftParityNp2, Isp2) { check_sft_parity("isp2", isp(2, 2)); }
TEST(SftParityNp2, Isp2W1) { check_sft_parity("isp2 W=1", isp(2, 1)); }
TEST(SftParityNp2, TwoD) { check_sft_parity("2d x1 y2", layout_2d(1, 2)); }

}  // namespace
}  // namespace longtron::testing
