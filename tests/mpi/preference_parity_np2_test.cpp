// Preference training under data parallelism (dp 2, with and without ZeRO-1), MTP, MSP, FSP and 2D
// tensor parallelism against one process on the same global batch: rows of packed pairs, a reference model unlike the policy, the step
// loss as the mean over all pairs of the step (and orpo's NLL as a token mean over it), through
// train::train_step — the step-1 loss, gradients and three steps' losses (the parity contract).
#include <cstdio>

#include "data/preference_pairs.h"
#include "engine_parity.h"
#include "tp2d_cases.h"
#include "model/lora.h"
#include "packing/pair_pack.h"
#include "train/preference.h"

namespace longtron::testing {
namespace {

/// Twelve rows of random pairs (prompts 1–5 tokens, answers 1–6), four a step.
std::vector<MicroBatch> all_rows(int64_t vocab) {
  std::mt19937_64 rng(41);
  std::uniform_int_distribution<int> prompt(1, 5), answer(1, 6);
  std::uniform_int_distribution<int32_t> id(1, int32_t(vocab) - 1);
  const auto ids = [&](int n) {
    std::vector<int32_t> v(size_t(n), 0);
    for (auto& t : v) t = id(rng);
    return v;
  };
  std::vector<data::PairIds> pairs(60);
  for (auto& p : pairs) p = {ids(prompt(rng)), ids(answer(rng)), ids(answer(rng))};
  const data::PairSource src(std::move(pairs), "<pairs>");
  data::PackConfig pc;
  pc.seq_len = 12;
  pc.micro_bsz = 2;
  data::PairRows rows(src, data::pair_order(src, false, 0), pc);
  std::vector<MicroBatch> out;
  for (int64_t k = 0; k < 12; ++k) out.push_back(rows.row(k));
  return out;
}

/// tiny_model with adapters on every linear (rank 3): the reference is then the base.
model::ModelConfig lora_model() {
  model::ModelConfig c = tiny_model();
  c.lora.rank = 3;
  c.lora.alpha = 6.0;
  c.lora.targets = {"all-linear"};
  return c;
}

/// B drawn away from 0 (as every layout holds it), so the policy is not its base at step 1.
void set_b(parallel::ParallelEngine& engine) {
  model::Params<float> full(engine.train_full_layout());
  engine.gather_train_full(full, engine.train_params());
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal(0.0, 0.1);
  for (const model::LoraModule& m : engine.lora_modules())
    for (int64_t i = 0; i < full.layout().view(m.b_view).numel; ++i)
      full.ptr(m.b_view)[i] = float(normal(rng));
  engine.scatter_train_full(engine.train_params(), full);
}

RunResult run(const parallel::Grid& grid, train::PreferenceLoss loss,
              const std::vector<MicroBatch>& rows, bool lora = false) {
  const model::ModelConfig m = lora ? lora_model() : tiny_model();
  parallel::ParallelEngine engine(m, grid, 42, 24), reference(tiny_model(), grid, 7, 24);
  if (lora) set_b(engine);
  train::AdamW adam(engine.train_layout(), parity_optimizer(), grid.zero1);
  train::PreferenceStep step;
  step.config.loss_type = loss;
  step.config.beta = 0.5;
  step.reference = lora ? nullptr : &reference;  // under LoRA: the base, adapters off
  RunResult out;
  for (int s = 0; s < 3; ++s) {
    train::StepOptions options = parity_step_options();
    options.preference = &step;
    if (s == 0)
      options.on_gradients = [&out](parallel::ParallelEngine& e) {
        model::Params<float> full(e.train_full_layout());
        e.gather_train_full(full, e.train_grads());
        out.step1_grads.assign(full.data(), full.data() + full.numel());
      };
    const std::vector<MicroBatch> global(rows.begin() + 4 * s, rows.begin() + 4 * s + 4);
    const train::StepResult r = train::train_step(engine, adam, dp_share(global, grid), options);
    EXPECT_FALSE(r.skipped);
    EXPECT_EQ(step.stats.pairs, [&] {
      double n = 0;
      for (const auto& b : global) n += double(b.pairs.size());
      return n;
    }());
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
  return out;
}

void check(const std::string& name, train::PreferenceLoss loss, const parallel::Layout& l,
           bool lora = false) {
  const std::vector<MicroBatch> rows = all_rows(tiny_model().vocab_size);
  // Rows differ in their pair counts, so a mean of per-rank means would differ from the step's.
  ASSERT_NE(rows[0].pairs.size(), rows[1].pairs.size());
  const RunResult ref =
      run(parallel::make_grid(comm::make_local_communicator(), parallel::Layout{}), loss, rows, lora);
  const RunResult got =
      run(parallel::make_grid(world(), l), loss, rows, lora);
  const model::ModelConfig m = lora ? lora_model() : tiny_model();
  parallel::ParallelEngine probe(m, parallel::make_grid(comm::make_local_communicator(),
                                                        parallel::Layout{}), 42, 24);
  const model::ParamTable& full = probe.train_full_layout();
  const ParityErrors e = parity_errors(full, got, ref);
  if (world()->rank() == 0)
    std::printf("[preference-parity] %-16s: step-1 loss %.6f rel err %.2e, max grad err %.2e, "
                "3-step loss max rel err %.2e\n", name.c_str(), ref.losses[0], e.loss1, e.grads,
                e.losses);
  expect_parity(e, name);
}

using parallel::TensorMode;
using train::PreferenceLoss;
const parallel::Layout kDp2 = layout(1, TensorMode::kMtp), kDp2Zero1 = layout(1, TensorMode::kMtp, -1);
TEST(PreferenceParityNp2, Dp2Sigmoid) { check("dp2 sigmoid", PreferenceLoss::kSigmoid, kDp2); }
TEST(PreferenceParityNp2, Dp2Zero1Sigmoid) {
  check("dp2 zero1 sigmoid", PreferenceLoss::kSigmoid, kDp2Zero1);
}
TEST(PreferenceParityNp2, Dp2Ipo) { check("dp2 ipo", PreferenceLoss::kIpo, kDp2); }
TEST(PreferenceParityNp2, Dp2Zero1Orpo) { check("dp2 zero1 orpo", PreferenceLoss::kOrpo, kDp2Zero1); }
// Tensor parallel: the vocabulary-parallel head takes the per-token factors over the whole row.
TEST(PreferenceParityNp2, Tp2Mtp) { check("tp2 mtp sigmoid", PreferenceLoss::kSigmoid, layout(2, TensorMode::kMtp)); }
TEST(PreferenceParityNp2, Tp2Msp) { check("tp2 msp orpo", PreferenceLoss::kOrpo, layout(2, TensorMode::kMsp)); }
TEST(PreferenceParityNp2, Tp2Fsp) { check("tp2 fsp ipo", PreferenceLoss::kIpo, layout(2, TensorMode::kFsp)); }
// [lora]: the reference is the base with the adapters off; adapter gradients compared.
TEST(PreferenceParityNp2, Dp2Zero1Lora) {
  check("dp2 zero1 lora sigmoid", PreferenceLoss::kSigmoid, kDp2Zero1, true);
}
TEST(PreferenceParityNp2, Tp2MtpLora) {
  check("tp2 mtp lora ipo", PreferenceLoss::kIpo, layout(2, TensorMode::kMtp), true);
}
TEST(PreferenceParityNp2, TwoD) { check("2d x1 y2 simpo", PreferenceLoss::kSimpo, layout_2d(1, 2)); }

}  // namespace
}  // namespace longtron::testing
