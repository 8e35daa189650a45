// The DPO family's losses on packed pairs (see preference.h; TRL's dpo_trainer.py `dpo_loss`,
// orpo_trainer.py `odds_ratio_loss`, cpo_trainer.py `cpo_loss`).
#include "train/preference.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace longtron::train {

namespace {

/// log σ(x), without overflow for either sign.
double log_sigmoid(double x) { return -(std::max(-x, 0.0) + std::log1p(std::exp(-std::abs(x)))); }
/// σ(x), without overflow for either sign.
double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

/// The sigmoid-shaped losses of h (sigmoid/cDPO, robust, simpo) and dℓ/dh.
void smoothed_logistic(double h, double eps, bool robust, double* loss, double* d) {
  if (robust) {
    *loss = (-(1 - eps) * log_sigmoid(h) + eps * log_sigmoid(-h)) / (1 - 2 * eps);
    *d = (-(1 - eps) * sigmoid(-h) - eps * sigmoid(h)) / (1 - 2 * eps);
  } else {
    *loss = -(1 - eps) * log_sigmoid(h) - eps * log_sigmoid(-h);
    *d = -(1 - eps) * sigmoid(-h) + eps * sigmoid(h);
  }
}

/// scale[t] += f for t in [begin, end).
void spread(std::vector<double>& scale, int32_t begin, int32_t end, double f) {
  for (int32_t t = begin; t < end; ++t) scale[static_cast<size_t>(t)] += f;
}

}  // namespace

bool uses_reference(PreferenceLoss loss) {
  return loss != PreferenceLoss::kOrpo && loss != PreferenceLoss::kSimpo;
}

bool averages_logps(PreferenceLoss loss) {
  return loss == PreferenceLoss::kIpo || loss == PreferenceLoss::kOrpo ||
         loss == PreferenceLoss::kSimpo;
}

void check_preference_config(const PreferenceConfig& c) {
  check(std::isfinite(c.beta) && c.beta > 0, "preference.beta must be > 0, got {}", c.beta);
  check(c.label_smoothing >= 0 && c.label_smoothing < 0.5,
        "preference.label_smoothing must be in [0, 0.5), got {}", c.label_smoothing);
  check(c.label_smoothing == 0 || c.loss_type == PreferenceLoss::kSigmoid ||
            c.loss_type == PreferenceLoss::kRobust || c.loss_type == PreferenceLoss::kSimpo,
        "preference.label_smoothing = {} applies to loss_type sigmoid, robust and simpo, not {}",
        c.label_smoothing, enum_name(kPreferenceLossNames, c.loss_type));
  check(std::isfinite(c.simpo_gamma), "preference.simpo_gamma must be finite");
  check(c.max_length >= 0, "preference.max_length must be >= 0 (0: no truncation), got {}",
        c.max_length);
}

PairTerms pair_terms(const PreferenceConfig& c, double pc, double pr, double rc, double rr) {
  const double beta = c.beta, eps = c.label_smoothing;
  PairTerms t;
  double dh = 0;  // dℓ/dh, h's derivative in π_c being β (−β in π_r) unless said otherwise
  switch (c.loss_type) {
    case PreferenceLoss::kSigmoid:
    case PreferenceLoss::kRobust: {
      const double h = beta * ((pc - pr) - (rc - rr));
      smoothed_logistic(h, eps, c.loss_type == PreferenceLoss::kRobust, &t.loss, &dh);
      break;
    }
    case PreferenceLoss::kHinge: {
      const double h = beta * ((pc - pr) - (rc - rr));
      t.loss = std::max(0.0, 1 - h);
      dh = h < 1 ? -1.0 : 0.0;
      break;
    }
    case PreferenceLoss::kIpo: {  // (logits − 1/(2β))², logits unscaled by β
      const double logits = (pc - pr) - (rc - rr);
      t.loss = std::pow(logits - 1 / (2 * beta), 2);
      dh = 2 * (logits - 1 / (2 * beta)) / beta;
      break;
    }
    case PreferenceLoss::kSimpo: {  // β·(π_c − π_r − γ/β)
      const double h = beta * (pc - pr) - c.simpo_gamma;
      smoothed_logistic(h, eps, false, &t.loss, &dh);
      break;
    }
    case PreferenceLoss::kOrpo: {
      // log odds(p) = log p − log(1 − p) on average log-probs π = log p < 0.
      const double x = (pc - pr) - (std::log1p(-std::exp(pc)) - std::log1p(-std::exp(pr)));
      t.loss = -beta * log_sigmoid(x);
      const double dx = -beta * sigmoid(-x);
      t.d_chosen = dx / (1 - std::exp(pc));
      t.d_rejected = -dx / (1 - std::exp(pr));
      t.reward_chosen = beta * pc;
      t.reward_rejected = beta * pr;
      return t;
    }
  }
  t.d_chosen = beta * dh;
  t.d_rejected = -beta * dh;
  const bool free = !uses_reference(c.loss_type);
  t.reward_chosen = beta * (pc - (free ? 0.0 : rc));
  t.reward_rejected = beta * (pr - (free ? 0.0 : rr));
  return t;
}

std::vector<double> pair_logps(const data::MicroBatch& row, const std::vector<double>& token_losses,
                               bool average) {
  check(token_losses.size() == row.input_ids.size(), "pair_logps: {} token losses for {} tokens",
        token_losses.size(), row.input_ids.size());
  std::vector<double> out;
  out.reserve(2 * row.pairs.size());
  const auto logp = [&](int32_t answer, int32_t end) {
    double s = 0;
    for (int32_t t = answer; t < end - 1; ++t) s -= token_losses[static_cast<size_t>(t)];
    return average ? s / double(end - 1 - answer) : s;
  };
  for (const data::PairInRow& p : row.pairs) {
    out.push_back(logp(p.chosen_answer, p.chosen_end));
    out.push_back(logp(p.rejected_answer, p.rejected_end));
  }
  return out;
}

double PreferenceStats::step_loss() const {
  return (pairs > 0 ? loss / pairs : 0.0) + (nll_tokens > 0 ? nll / nll_tokens : 0.0);
}

void set_preference_metrics(const PreferenceStats& s, TrainRow& row) {
  row.preference = true;
  const double n = s.pairs > 0 ? s.pairs : 1.0;
  row.rewards_chosen = s.rewards_chosen / n;
  row.rewards_rejected = s.rewards_rejected / n;
  row.reward_accuracy = s.accuracy / n;
  row.reward_margin = s.margin / n;
  row.logps_chosen = s.logps_chosen / n;
  row.logps_rejected = s.logps_rejected / n;
}

PreferenceTotals preference_totals(const std::vector<data::MicroBatch>& rows) {
  PreferenceTotals t;
  for (const data::MicroBatch& row : rows) {
    check(!row.pairs.empty(), "preference training: a row without pairs (the data holds no "
          "preference pairs?)");
    t.pairs += double(row.pairs.size());
    for (const data::PairInRow& q : row.pairs) t.nll_tokens += q.chosen_end - 1 - q.chosen_begin;
  }
  return t;
}

void preference_token_factors(const PreferenceConfig& c, const data::MicroBatch& row,
                              const std::vector<double>& tl, const std::vector<double>* reference,
                              const PreferenceTotals& totals, std::vector<double>& scale,
                              PreferenceStats& stats) {
  const bool average = averages_logps(c.loss_type), orpo = c.loss_type == PreferenceLoss::kOrpo;
  const std::vector<double> logps = pair_logps(row, tl, average);
  scale.assign(tl.size(), 0.0);
  for (size_t p = 0; p < row.pairs.size(); ++p) {
    const data::PairInRow& q = row.pairs[p];
    const double pc = logps[2 * p], pr = logps[2 * p + 1];
    const double rc = reference ? (*reference)[2 * p] : 0.0;
    const double rr = reference ? (*reference)[2 * p + 1] : 0.0;
    const PairTerms t = pair_terms(c, pc, pr, rc, rr);
    // π = −Σ token loss (÷ n): ∂L/∂(token loss) = −(∂ℓ/∂π) / pairs (÷ n).
    const double nc = average ? double(q.chosen_end - 1 - q.chosen_answer) : 1.0;
    const double nr = average ? double(q.rejected_end - 1 - q.rejected_answer) : 1.0;
    spread(scale, q.chosen_answer, q.chosen_end - 1, -t.d_chosen / totals.pairs / nc);
    spread(scale, q.rejected_answer, q.rejected_end - 1, -t.d_rejected / totals.pairs / nr);
    if (orpo) {  // the NLL token mean over the step's chosen sequences
      spread(scale, q.chosen_begin, q.chosen_end - 1, 1.0 / totals.nll_tokens);
      for (int32_t k = q.chosen_begin; k < q.chosen_end - 1; ++k) stats.nll += tl[size_t(k)];
      stats.nll_tokens += q.chosen_end - 1 - q.chosen_begin;
    }
    stats.loss += t.loss;
    stats.pairs += 1;
    stats.rewards_chosen += t.reward_chosen;
    stats.rewards_rejected += t.reward_rejected;
    stats.accuracy += t.reward_chosen > t.reward_rejected ? 1.0 : 0.0;
    stats.margin += t.reward_chosen - t.reward_rejected;
    stats.logps_chosen += pc;
    stats.logps_rejected += pr;
  }
}

namespace {

/// Throws unless a reference-based loss has a reference: `reference`, or the base under LoRA.
void check_reference(const PreferenceConfig& c, const parallel::ParallelEngine& engine,
                     const parallel::ParallelEngine* reference) {
  check(!uses_reference(c.loss_type) || reference != nullptr || engine.has_lora(),
        "preference.loss_type = \"{}\" needs a reference model",
        enum_name(kPreferenceLossNames, c.loss_type));
}

/// The reference's token losses of `row`: `reference`'s forward, or (nullptr, LoRA) the policy's
/// with its adapters off.
void reference_forward(parallel::ParallelEngine& engine, parallel::ParallelEngine* reference,
                       const data::MicroBatch& row, std::vector<double>& token_losses) {
  if (reference) {
    reference->forward_loss(row, &token_losses);
    return;
  }
  engine.set_lora_adapters_off(true);
  try {
    engine.forward_loss(row, &token_losses);
  } catch (...) {
    engine.set_lora_adapters_off(false);
    throw;
  }
  engine.set_lora_adapters_off(false);
}

/// The data-parallel sum of stats.
PreferenceStats reduce_stats(const PreferenceStats& s, comm::Communicator& dp) {
  double v[10] = {s.loss,         s.nll,    s.pairs,        s.nll_tokens,   s.rewards_chosen,
                  s.rewards_rejected, s.accuracy, s.margin, s.logps_chosen, s.logps_rejected};
  if (dp.size() > 1) dp.all_reduce(v, 10);
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
}

}  // namespace

PreferenceStats preference_evaluate(parallel::ParallelEngine& engine,
                                    parallel::ParallelEngine* reference,
                                    const PreferenceConfig& c, const data::RowSource& rows) {
  const bool uses = uses_reference(c.loss_type), average = averages_logps(c.loss_type);
  check_reference(c, engine, reference);
  comm::Communicator& dp = *engine.grid().data;
  PreferenceStats stats;
  data::MicroBatch row;
  std::vector<double> tl, rl, unused;
  for (int64_t k = dp.rank(); k < rows.num_rows(); k += dp.size()) {
    rows.row_into(k, row);
    engine.forward_loss(row, &tl);
    std::vector<double> ref;
    if (uses) {
      reference_forward(engine, reference, row, rl);
      ref = pair_logps(row, rl, average);
    }
    // The factors are not needed; the totals only scale them.
    preference_token_factors(c, row, tl, uses ? &ref : nullptr, {1, 1}, unused, stats);
  }
  return reduce_stats(stats, dp);
}

void preference_gradients(parallel::ParallelEngine& engine,
                          const std::vector<data::MicroBatch>& rows, PreferenceStep& step) {
  const PreferenceConfig& c = step.config;
  const bool reference = uses_reference(c.loss_type);
  check_reference(c, engine, step.reference);
  comm::Communicator& dp = *engine.grid().data;
  // The step's totals first: every pair's factor divides by them.
  PreferenceTotals totals = preference_totals(rows);
  if (dp.size() > 1) {
    double t[2] = {totals.pairs, totals.nll_tokens};
    dp.all_reduce(t, 2);
    totals = {t[0], t[1]};
  }
  PreferenceStats stats;
  std::vector<double> reference_losses, reference_logps;
  model::Decoder<float>& model = engine.model();
  for (size_t i = 0; i < rows.size(); ++i) {
    const data::MicroBatch& row = rows[i];
    if (reference) {
      reference_forward(engine, step.reference, row, reference_losses);
      reference_logps = pair_logps(row, reference_losses, averages_logps(c.loss_type));
    }
    model.set_token_weights([&](const std::vector<double>& tl, std::vector<double>& scale) {
      preference_token_factors(c, row, tl, reference ? &reference_logps : nullptr, totals, scale,
                               stats);
    });
    try {
      engine.forward_backward(row, 1.0, i + 1 == rows.size());
    } catch (...) {
      model.set_token_weights({});
      throw;
    }
    model.set_token_weights({});
  }
  step.stats = reduce_stats(stats, dp);
}

}  // namespace longtron::train
