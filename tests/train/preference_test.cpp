// Preference losses (train/preference.h): TRL's formulas at golden values, their derivatives
// against central differences, and the whole model: the step loss and gradients of packed pairs
// against an independent double-precision computation of TRL's loss on each sequence alone (with a
// reference model different from the policy), the gradients also against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "bf16_here.h"
#include "data/preference_pairs.h"
#include "model/decoder.h"
#include "model/model_testing.h"
#include "model/lora.h"
#include "modes/engine.h"
#include "ops/fd_check.h"
#include "packing/pair_pack.h"
#include "parallel/layout.h"
#include "train/preference.h"
#include "train/step.h"

namespace longtron::train {
namespace {

PreferenceConfig config_of(PreferenceLoss loss, double eps = 0.0) {
  PreferenceConfig c;
  c.loss_type = loss;
  c.label_smoothing = eps;
  return c;
}

// ---- golden values (Python's math module on TRL's formulas, β = 0.1) -------------------------

TEST(PreferenceLoss, GoldenValues) {
  // π_c, π_r, ρ_c, ρ_r = −12.5, −14, −13, −13.25: logits = 1.25, h = β·logits = 0.125.
  const double pc = -12.5, pr = -14, rc = -13, rr = -13.25;
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kSigmoid), pc, pr, rc, rr).loss,
              0.6325990353171691, 1e-14);
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kSigmoid, 0.2), pc, pr, rc, rr).loss,
              0.6575990353171691, 1e-14);  // cDPO
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kRobust, 0.2), pc, pr, rc, rr).loss,
              0.5909323686505025, 1e-14);
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kHinge), pc, pr, rc, rr).loss, 0.875, 1e-14);
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kIpo), pc, pr, rc, rr).loss, 14.0625, 1e-12);
  // Average log-probs −1.2 and −2.3 (reference-free: ρ ignored).
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kSimpo), -1.2, -2.3, 5, 7).loss,
              0.9070403966954269, 1e-14);  // γ = 0.5
  EXPECT_NEAR(pair_terms(config_of(PreferenceLoss::kOrpo), -1.2, -2.3, 5, 7).loss,
              0.022994627972307252, 1e-14);
  const PairTerms t = pair_terms(config_of(PreferenceLoss::kSigmoid), pc, pr, rc, rr);
  EXPECT_NEAR(t.reward_chosen, 0.1 * (pc - rc), 1e-15);
  EXPECT_NEAR(t.reward_rejected, 0.1 * (pr - rr), 1e-15);
}

TEST(PreferenceLoss, DerivativesMatchFiniteDifferences) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> sum(-30, -5), avg(-3, -0.05);
  for (const auto& name : kPreferenceLossNames) {
    const bool smoothed = name.value == PreferenceLoss::kSigmoid ||
                          name.value == PreferenceLoss::kRobust ||
                          name.value == PreferenceLoss::kSimpo;
    const PreferenceConfig c = config_of(name.value, smoothed ? 0.15 : 0.0);
    for (int trial = 0; trial < 20; ++trial) {
      const bool a = averages_logps(name.value);
      const double pc = a ? avg(rng) : sum(rng), pr = a ? avg(rng) : sum(rng);
      const double rc = sum(rng), rr = sum(rng);
      const PairTerms t = pair_terms(c, pc, pr, rc, rr);
      const double h = 1e-6;
      const double fc = (pair_terms(c, pc + h, pr, rc, rr).loss -
                         pair_terms(c, pc - h, pr, rc, rr).loss) / (2 * h);
      const double fr = (pair_terms(c, pc, pr + h, rc, rr).loss -
                         pair_terms(c, pc, pr - h, rc, rr).loss) / (2 * h);
      if (name.value == PreferenceLoss::kHinge &&
          std::abs(0.1 * ((pc - pr) - (rc - rr)) - 1) < 1e-3)
        continue;  // the kink
      EXPECT_NEAR(t.d_chosen, fc, 1e-7 * (1 + std::abs(fc))) << name.name << " trial " << trial;
      EXPECT_NEAR(t.d_rejected, fr, 1e-7 * (1 + std::abs(fr))) << name.name << " trial " << trial;
    }
  }
}

TEST(PreferenceLoss, ConfigErrorsNameTheKey) {
  PreferenceConfig c;
  c.beta = 0;
  EXPECT_THROW(
      {
        try {
          check_preference_config(c);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("preference.beta"), std::string::npos);
          throw;
        }
      },
      Error);
  c = config_of(PreferenceLoss::kHinge, 0.1);
  EXPECT_THROW(check_preference_config(c), Error);  // label_smoothing has no meaning for hinge
}

// ---- the whole model -------------------------------------------------------------------------

void randomize(model::Params<double>& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.3);
  for (const auto& v : p.layout().views()) {
    double* x = p.data() + v.offset;
    for (int64_t i = 0; i < v.numel; ++i) x[i] = v.is_norm ? 1.0 + 0.2 * normal(rng) : normal(rng);
  }
}

/// Seven pairs with prompts of 1–4 tokens and answers of 1–5 (ids in [1, 32)).
data::PairSource random_pairs() {
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int> prompt(1, 4), answer(1, 5);
  std::vector<data::PairIds> pairs(7);
  for (auto& p : pairs) {
    p.prompt = testing::random_document(rng, prompt(rng), 32);
    p.chosen = testing::random_document(rng, answer(rng), 32);
    p.rejected = testing::random_document(rng, answer(rng), 32);
  }
  return data::PairSource(std::move(pairs), "<pairs>");
}

/// log σ(x) as torch.nn.functional.logsigmoid computes it.
double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); }

/// TRL's loss of one pair, written out again from dpo_trainer.py / orpo_trainer.py /
/// cpo_trainer.py (independent of pair_terms).
double trl_pair_loss(const PreferenceConfig& c, double pc, double pr, double rc, double rr) {
  const double b = c.beta, e = c.label_smoothing;
  const double logits = (pc - pr) - (rc - rr);
  switch (c.loss_type) {
    case PreferenceLoss::kSigmoid:
      return -logsigmoid(b * logits) * (1 - e) - logsigmoid(-b * logits) * e;
    case PreferenceLoss::kRobust:
      return (-logsigmoid(b * logits) * (1 - e) + logsigmoid(-b * logits) * e) / (1 - 2 * e);
    case PreferenceLoss::kHinge: return std::max(0.0, 1 - b * logits);
    case PreferenceLoss::kIpo: return std::pow(logits - 1 / (2 * b), 2);
    case PreferenceLoss::kSimpo: {
      const double l = (pc - pr) - c.simpo_gamma / b;
      return -logsigmoid(b * l) * (1 - e) - logsigmoid(-b * l) * e;
    }
    case PreferenceLoss::kOrpo: {
      const double log_odds = (pc - pr) - (std::log1p(-std::exp(pc)) - std::log1p(-std::exp(pr)));
      return -b * logsigmoid(log_odds);
    }
  }
  return 0;
}

/// The sequence prompt + answer alone in a row; returns its per-token losses.
std::vector<double> alone(model::Decoder<double>& m, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& answer) {
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), answer.begin(), answer.end());
  data::MicroBatch b;
  testing::append_document(b, seq);
  std::vector<double> tl;
  m.forward_loss(b, &tl);
  return tl;
}

/// TRL's step loss over all pairs, each sequence run alone (no packing), in double.
double trl_step_loss(const PreferenceConfig& c, model::Decoder<double>& policy,
                     model::Decoder<double>& reference, const data::PairSource& pairs) {
  const bool avg = c.loss_type == PreferenceLoss::kIpo || c.loss_type == PreferenceLoss::kSimpo ||
                   c.loss_type == PreferenceLoss::kOrpo;
  const auto logp = [&](model::Decoder<double>& m, const data::PairIds& p, bool chosen) {
    const auto& answer = chosen ? p.chosen : p.rejected;
    const std::vector<double> tl = alone(m, p.prompt, answer);
    double s = 0;  // the targets of positions prompt−1 … end−2 are the answer's tokens
    for (size_t t = p.prompt.size() - 1; t + 1 < tl.size(); ++t) s -= tl[t];
    return avg ? s / double(answer.size()) : s;
  };
  double loss = 0, nll = 0, nll_tokens = 0;
  for (size_t i = 0; i < pairs.num_pairs(); ++i) {
    const data::PairIds& p = pairs.pair(i);
    loss += trl_pair_loss(c, logp(policy, p, true), logp(policy, p, false),
                          logp(reference, p, true), logp(reference, p, false));
    const std::vector<double> tl = alone(policy, p.prompt, p.chosen);
    for (size_t t = 0; t + 1 < tl.size(); ++t) nll += tl[t];
    nll_tokens += double(tl.size() - 1);
  }
  loss /= double(pairs.num_pairs());
  return c.loss_type == PreferenceLoss::kOrpo ? loss + nll / nll_tokens : loss;
}

struct PairModel {
  model::ModelConfig config = testing::tiny_config();
  model::ParamTable layout{config};
  model::Params<double> policy{layout}, reference{layout}, grads{layout};
  data::PairSource pairs = random_pairs();
  std::vector<data::MicroBatch> rows;

  PairModel() {
    randomize(policy, 11);
    randomize(reference, 23);  // a reference unlike the policy: the log-ratios are not 0
    data::PackConfig pack;
    pack.seq_len = 12;
    pack.micro_bsz = 2;
    data::PairRows packed(pairs, data::pair_order(pairs, true, 3), pack);
    for (int64_t k = 0; k < packed.num_rows(); ++k) rows.push_back(packed.row(k));
  }

  /// The step's gradient in double through the two-pass head (preference_token_factors).
  PreferenceStats double_gradients(const PreferenceConfig& c) {
    model::Decoder<double> m(layout, policy), r(layout, reference);
    grads.zero();
    const PreferenceTotals totals = preference_totals(rows);
    PreferenceStats stats;
    for (const data::MicroBatch& row : rows) {
      std::vector<double> tl;
      r.forward_loss(row, &tl);
      const std::vector<double> ref = pair_logps(row, tl, averages_logps(c.loss_type));
      m.set_token_weights([&](const std::vector<double>& losses, std::vector<double>& scale) {
        preference_token_factors(c, row, losses, &ref, totals, scale, stats);
      });
      m.forward_backward(row, grads, 1.0);
    }
    return stats;
  }
};

class PreferenceModel : public ::testing::TestWithParam<PreferenceLoss> {};

TEST_P(PreferenceModel, GradientsMatchFiniteDifferencesOfTrlsLoss) {
  PairModel pm;
  ASSERT_GE(pm.rows.size(), 2u);  // pairs spread over micro-batches
  const PreferenceConfig c =
      config_of(GetParam(), GetParam() == PreferenceLoss::kRobust ? 0.1 : 0.0);
  const PreferenceStats stats = pm.double_gradients(c);
  model::Decoder<double> policy(pm.layout, pm.policy), reference(pm.layout, pm.reference);
  const double loss = trl_step_loss(c, policy, reference, pm.pairs);
  EXPECT_NEAR(stats.step_loss(), loss, 1e-12 * std::abs(loss));
  EXPECT_EQ(stats.pairs, 7);
  std::mt19937_64 rng(3);
  for (const auto& v : pm.layout.views()) {
    std::uniform_int_distribution<int64_t> pick(0, v.numel - 1);
    std::vector<int64_t> indices;
    for (int k = 0; k < 4; ++k) indices.push_back(v.offset + pick(rng));
    testing::expect_fd_at(
        pm.policy.data(), pm.grads.data(), pm.layout.numel(), indices,
        [&] { return trl_step_loss(c, policy, reference, pm.pairs); },
        [](double fd) { return 1e-9 + 1e-6 * std::abs(fd); },
        [&](int64_t i) { return i < 0 ? v.name : v.name + " element " + std::to_string(i - v.offset); });
  }
}

TEST_P(PreferenceModel, EngineStepIsTrlsLossAndGradientInDouble) {
  PairModel pm;
  const PreferenceConfig c = config_of(GetParam(), GetParam() == PreferenceLoss::kSigmoid ? 0.1 : 0.0);
  pm.double_gradients(c);
  model::Decoder<double> policy(pm.layout, pm.policy), reference(pm.layout, pm.reference);
  const double loss = trl_step_loss(c, policy, reference, pm.pairs);
  // The float engine over the same weights, one process: its step.
  model::Params<float> wp(pm.layout), wr(pm.layout);
  for (int64_t i = 0; i < pm.layout.numel(); ++i)
    wp.data()[i] = float(pm.policy.data()[i]), wr.data()[i] = float(pm.reference.data()[i]);
  parallel::Grid grid = parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  parallel::ParallelEngine engine(pm.config, grid, wp), ref(pm.config, grid, wr);
  PreferenceStep step;
  step.config = c;
  step.reference = &ref;
  StepOptions o;
  o.preference = &step;
  const StepResult r = step_gradients(engine, pm.rows, o);
  EXPECT_NEAR(r.loss, loss, 2e-5 * std::abs(loss));
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < pm.layout.numel(); ++i) {
    const double g = pm.grads.data()[i];
    diff += std::pow(double(engine.grads().data()[i]) - g, 2);
    norm += g * g;
  }
  ASSERT_GT(norm, 0);
  EXPECT_LT(std::sqrt(diff / norm), 1e-4) << "gradient norm " << std::sqrt(norm);
  EXPECT_EQ(step.stats.pairs, 7);
}

// Under bf16 compute the head's backward scales each row before rounding its gradient (the fused
// cross-entropy step is skipped): the step stays within the bf16 bounds of the fp32 step.
TEST(PreferenceBf16, StepWithinTheBf16BoundsOfFp32) {
  testing::Bf16Here here;
  if (!here.runs()) GTEST_SKIP() << "no bf16 on this CPU";
  PairModel pm;
  model::Params<float> wp(pm.layout), wr(pm.layout);
  for (int64_t i = 0; i < pm.layout.numel(); ++i)
    wp.data()[i] = float(pm.policy.data()[i]), wr.data()[i] = float(pm.reference.data()[i]);
  parallel::Grid grid = parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  double loss[2], norm[2];
  std::vector<float> grads[2];
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    parallel::ParallelEngine engine(pm.config, grid, wp), ref(pm.config, grid, wr);
    const auto type = bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32;
    engine.set_compute_type(type);
    ref.set_compute_type(type);
    PreferenceStep step;
    step.config = config_of(PreferenceLoss::kSigmoid);
    step.reference = &ref;
    StepOptions o;
    o.preference = &step;
    loss[bf16] = step_gradients(engine, pm.rows, o).loss;
    norm[bf16] = engine.grad_norm();
    grads[bf16].assign(engine.grads().data(), engine.grads().data() + pm.layout.numel());
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-3 * std::abs(loss[0]));
  EXPECT_NEAR(norm[1], norm[0], 1e-2 * norm[0]);
  double cos = 0, a = 0, b = 0;
  for (size_t i = 0; i < grads[0].size(); ++i)
    cos += double(grads[0][i]) * grads[1][i], a += double(grads[0][i]) * grads[0][i],
        b += double(grads[1][i]) * grads[1][i];
  EXPECT_GT(cos / std::sqrt(a * b), 0.999);
}

// Under [lora] the reference is the frozen base: the policy with its adapters switched off.
TEST(PreferenceLora, TheReferenceIsTheBaseWithAdaptersOff) {
  PairModel pm;
  model::Params<float> w(pm.layout);
  for (int64_t i = 0; i < pm.layout.numel(); ++i) w.data()[i] = float(pm.policy.data()[i]);
  model::ModelConfig lc = pm.config;
  lc.lora.rank = 2;
  lc.lora.alpha = 4.0;
  lc.lora.targets = {"all-linear"};
  parallel::Grid grid = parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  parallel::ParallelEngine lora(lc, grid, w), base(pm.config, grid, w);
  {  // B away from 0, so that the adapters change the log-probs
    model::Params<float> full(lora.train_full_layout());
    lora.gather_train_full(full, lora.train_params());
    std::mt19937_64 rng(9);
    std::normal_distribution<double> normal(0.0, 0.2);
    for (const model::LoraModule& m : lora.lora_modules())
      for (int64_t i = 0; i < full.layout().view(m.b_view).numel; ++i)
        full.ptr(m.b_view)[i] = float(normal(rng));
    lora.scatter_train_full(lora.train_params(), full);
  }
  // Expected: β(π − ρ) with π from the LoRA model and ρ from the base alone.
  double want_chosen = 0, want_rejected = 0;
  for (const data::MicroBatch& row : pm.rows) {
    std::vector<double> tp, tr;
    lora.forward_loss(row, &tp);
    base.forward_loss(row, &tr);
    const std::vector<double> p = pair_logps(row, tp, false), r = pair_logps(row, tr, false);
    for (size_t i = 0; i < p.size(); i += 2) {
      want_chosen += 0.1 * (p[i] - r[i]);
      want_rejected += 0.1 * (p[i + 1] - r[i + 1]);
    }
  }
  ASSERT_GT(std::abs(want_chosen), 1e-3);  // the adapters matter
  PreferenceStep step;  // no reference model: the base
  StepOptions o;
  o.preference = &step;
  step_gradients(lora, pm.rows, o);
  EXPECT_NEAR(step.stats.rewards_chosen, want_chosen, 1e-5 * std::abs(want_chosen));
  EXPECT_NEAR(step.stats.rewards_rejected, want_rejected, 1e-5 * std::abs(want_rejected));
  // The adapters are on again afterwards.
  std::vector<double> again;
  lora.forward_loss(pm.rows[0], &again);
  std::vector<double> before;
  lora.set_lora_adapters_off(true);
  lora.forward_loss(pm.rows[0], &before);
  lora.set_lora_adapters_off(false);
  EXPECT_NE(pair_logps(pm.rows[0], again, false), pair_logps(pm.rows[0], before, false));
  // A reference-based loss without LoRA and without a reference is refused.
  parallel::ParallelEngine dense(pm.config, grid, w);
  EXPECT_THROW(step_gradients(dense, pm.rows, o), Error);
}

INSTANTIATE_TEST_SUITE_P(AllLosses, PreferenceModel,
                         ::testing::Values(PreferenceLoss::kSigmoid, PreferenceLoss::kIpo,
                                           PreferenceLoss::kHinge, PreferenceLoss::kRobust,
                                           PreferenceLoss::kOrpo, PreferenceLoss::kSimpo),
                         [](const auto& info) {
                           return std::string(enum_name(kPreferenceLossNames, info.param));
                         });

}  // namespace
}  // namespace longtron::train
