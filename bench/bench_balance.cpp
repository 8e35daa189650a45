// data.balance figures (docs/balance.md): the modelled step imbalance (max over dp ranks of the
// step's cost ÷ the mean) for dp = 2, 4, 8 and rows of P = 2048, 8192, 32768 tokens, for each mode
// ("none", "rows", "documents"), on exponentially distributed document lengths. Deterministic: no
// timing, the same numbers on every machine. Rows and documents are shuffled as in training.
//   bench_balance [--mean-tokens M] [--micro-num N] [--window W] [--steps S] [--cost A,B]
//                 [--pack-tail pad|drop] [--data DIR]
// With --data the documents are a tokenized dataset's (e.g. the State of the Union demo corpus
// prepared by scripts/demo.sh), read in full: steps are then as many as one epoch holds.
// The cost defaults to attention work alone (A = 0 per token, B = 1 per causal pair), the part
// that differs between rows; a model's linear term (A > 0) only dilutes the imbalance.
#include <fmt/core.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "data/open.h"
#include "length_dataset.h"
#include "packing/loader.h"

using namespace longtron::data;
using longtron::bench::exponential;

namespace {

struct Figures {
  double mean = 0, max = 0;
  int64_t steps = 0;
};

Figures measure(BalanceMode mode, int64_t dp, int64_t P, int64_t micro_num, int64_t window,
                int64_t steps, double mean_tokens, RowCost cost, PackTail tail,
                const std::string& data) {
  DataConfig c;
  c.pack.seq_len = P;
  c.pack.micro_bsz = 1;
  c.pack.pack_tail = tail;
  c.micro_num = micro_num;
  c.shuffle = true;
  c.balance = {mode, window, cost};
  const int64_t G = dp * micro_num;
  const BatchLoader loader(
      data.empty() ? exponential(mean_tokens, steps * G * P, 1234) : open_dataset(data), c, dp);
  Figures f;
  const int64_t n = std::min(steps, loader.steps_per_epoch());
  f.steps = n;
  for (int64_t s = 0; s < n; ++s) {
    const double x = loader.plan(s).imbalance();
    f.mean += x / static_cast<double>(n);
    f.max = std::max(f.max, x);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  double mean_tokens = 4096;
  int64_t micro_num = 4, window = 8, steps = 64;
  RowCost cost{0.0, 1.0};
  PackTail tail = PackTail::kPad;
  std::string data;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--mean-tokens") mean_tokens = std::atof(v);
    else if (k == "--micro-num") micro_num = std::atoll(v);
    else if (k == "--window") window = std::atoll(v);
    else if (k == "--steps") steps = std::atoll(v);
    else if (k == "--data") data = v;
    else if (k == "--pack-tail") tail = parse_pack_tail(v);
    else if (k == "--cost") std::sscanf(v, "%lf,%lf", &cost.per_token, &cost.per_pair);
    else {
      fmt::print(stderr, "unknown option {}\n", k);
      return 2;
    }
  }
  if (!data.empty()) fmt::print("documents of {}; ", data);
  else fmt::print("exponential documents, mean {} tokens; ", mean_tokens);
  fmt::print("micro_num {}, window {}, at most {} steps; cost = {} "
             "x tokens + {} x causal pairs; pack_tail {}; imbalance = max rank cost / mean (mean over "
             "steps, max)\n\n",
             micro_num, window, steps, cost.per_token, cost.per_pair,
             tail == PackTail::kPad ? "pad" : "drop");
  fmt::print("| dp | P | steps | none | rows | documents |\n|---|---|---|---|---|---|\n");
  for (const int64_t dp : {2, 4, 8})
    for (const int64_t P : {2048, 8192, 32768}) {
      std::string cells;
      int64_t used = 0;
      try {
        for (const BalanceMode m : {BalanceMode::kNone, BalanceMode::kRows, BalanceMode::kDocuments}) {
          const Figures f = measure(m, dp, P, micro_num, window, steps, mean_tokens, cost, tail, data);
          cells += fmt::format(" {:.3f} (max {:.3f}) |", f.mean, f.max);
          used = f.steps;
        }
      } catch (const std::exception& e) {  // e.g. a corpus too small for one step of this size
        cells = " – | – | – |";
      }
      fmt::print("| {} | {} | {} |{}\n", dp, P, used, cells);
    }
  return 0;
}
