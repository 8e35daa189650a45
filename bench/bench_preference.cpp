// A DPO step against an SFT step on the same packed rows (docs/preference.md, "Speed"): the model
// of bench_step.cpp (InternLM2 shape, vocab 8192, hidden 384, 6 layers), two rows of P = 2048
// tokens of random pairs packed by PairRows (prompts and answers of exponential length, means 120
// and 150 tokens), one process. Times, interleaved over rounds (median):
//   sft     step_gradients with the token-weighted cross-entropy over every label of the rows;
//   dpo     step_gradients with loss_type sigmoid and a reference model (its forward included);
//   simpo   the same without a reference: what a step costs when the reference log-probs are
//           precomputed (the policy's forward, two head passes and backward).
// LONGTRON_BENCH_ROUNDS (default 5). Threads: OMP_NUM_THREADS if set, else all hardware threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "data/preference_pairs.h"
#include "modes/engine.h"
#include "ops/threads.h"
#include "packing/pair_pack.h"
#include "parallel/layout.h"
#include "train/preference.h"
#include "train/step.h"

namespace lt = longtron;

int main() {
  lt::model::ModelConfig c;
  c.vocab_size = 8192;
  c.hidden_size = 384;
  c.num_layers = 6;
  c.num_attention_heads = 6;
  c.num_kv_attention_heads = 2;
  const char* env = std::getenv("LONGTRON_BENCH_ROUNDS");
  const int rounds = env ? std::atoi(env) : 5;
  std::mt19937_64 rng(5);
  std::exponential_distribution<double> prompt(1.0 / 120), answer(1.0 / 150);
  std::uniform_int_distribution<int32_t> id(1, 8191);
  const auto ids = [&](double mean_draw) {
    std::vector<int32_t> v(size_t(std::clamp<double>(mean_draw, 1, 400)));
    for (auto& t : v) t = id(rng);
    return v;
  };
  std::vector<lt::data::PairIds> pairs(64);
  for (auto& p : pairs) p = {ids(prompt(rng)), ids(answer(rng)), ids(answer(rng))};
  const lt::data::PairSource src(std::move(pairs), "<bench>");
  lt::data::PackConfig pc;
  pc.seq_len = 1024;
  pc.micro_bsz = 2;
  lt::data::PairRows packed(src, lt::data::pair_order(src, false, 0), pc);
  std::vector<lt::data::MicroBatch> rows = {packed.row(0), packed.row(1)};
  int64_t tokens = 0, pairs_in = 0;
  for (const auto& r : rows) {
    tokens += lt::train::count_tokens(r);
    pairs_in += int64_t(r.pairs.size());
  }
  lt::parallel::Grid grid =
      lt::parallel::make_grid(lt::comm::make_local_communicator(), lt::parallel::Layout{});
  lt::parallel::ParallelEngine engine(c, grid, 1, 2048), reference(c, grid, 2, 2048);
  lt::train::PreferenceStep dpo, simpo;
  dpo.reference = &reference;
  simpo.config.loss_type = lt::train::PreferenceLoss::kSimpo;
  lt::train::StepOptions sft_o, dpo_o, simpo_o;
  dpo_o.preference = &dpo;
  simpo_o.preference = &simpo;
  const auto time = [&](const lt::train::StepOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    lt::train::step_gradients(engine, rows, o);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto* o : {&sft_o, &dpo_o, &simpo_o}) time(*o);  // warm-up
  std::vector<double> t[3];
  for (int r = 0; r < rounds; ++r) {
    t[0].push_back(time(sft_o));
    t[1].push_back(time(dpo_o));
    t[2].push_back(time(simpo_o));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double sft = median(t[0]), d = median(t[1]), s = median(t[2]);
  std::printf("rows 2 x 2048 positions, %lld tokens, %lld pairs, %d threads, %d rounds\n",
              (long long)tokens, (long long)pairs_in, lt::num_threads(), rounds);
  std::printf("sft   %.3f s\ndpo   %.3f s  (%.2f x sft; reference forward included)\n"
              "simpo %.3f s  (%.2f x sft; no reference, as with precomputed log-probs)\n",
              sft, d, d / sft, s, s / sft);
  return 0;
}
