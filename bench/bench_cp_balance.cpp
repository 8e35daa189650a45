// Context-parallel balance figures (docs/isp.md, "2D-Attention"): for C = 2, 4, 8 context ranks
// and rows of P tokens, max ÷ mean of the causal attention work Σ(offset + 1) of each rank's
// queries — the "cp_imbalance" that `longtron inspect --cp-size C --cp-balance B --json` prints per
// row — for "contiguous", "zigzag" and "document", as the mean and max over rows. Deterministic:
// no timing, the same numbers on every machine. Rows are packed and shuffled as in training.
//   bench_cp_balance [--data DIR] [--mean-share S] [--rows N] [--pack-tail pad|drop]
// Without --data the documents have exponential lengths of mean P/S (default S = 8, at least 1
// token); with --data they are a tokenized dataset's (e.g. the State of the Union demo corpus
// prepared by scripts/demo.sh) and the rows are every row of one epoch (at most N).
#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>

#include "data/open.h"
#include "length_dataset.h"
#include "packing/context_split.h"
#include "packing/loader.h"
#include "packing/sequence_split.h"

using namespace longtron::data;
using longtron::bench::exponential;

namespace {

/// The cu_seqlens of the rows of one epoch (at most `rows`), shuffled as in training.
std::vector<std::vector<int32_t>> rows_of(int64_t P, int64_t rows, double mean_share,
                                          PackTail tail, const std::string& data) {
  DataConfig c;
  c.pack.seq_len = P;
  c.pack.micro_bsz = 1;
  c.pack.pack_tail = tail;
  c.micro_num = 1;
  c.shuffle = true;
  const BatchLoader loader(
      data.empty() ? exponential(double(P) / mean_share, (rows + 1) * P, 1234) : open_dataset(data),
      c, 1);
  std::vector<std::vector<int32_t>> out;
  for (int64_t s = 0; s < std::min(rows, loader.steps_per_epoch()); ++s)
    for (const MicroBatch& m : loader.micro_batches(loader.plan(s), 0)) out.push_back(m.cu_seqlens);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double mean_share = 8;
  int64_t rows = 64;
  PackTail tail = PackTail::kPad;
  std::string data;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--mean-share") mean_share = std::atof(v);
    else if (k == "--rows") rows = std::atoll(v);
    else if (k == "--data") data = v;
    else if (k == "--pack-tail") tail = parse_pack_tail(v);
    else {
      fmt::print(stderr, "unknown option {}\n", k);
      return 2;
    }
  }
  if (!data.empty()) fmt::print("documents of {}; ", data);
  else fmt::print("exponential documents, mean P/{}; ", mean_share);
  fmt::print("at most {} rows; pack_tail {}; cp_imbalance = max rank work / mean, "
             "mean over rows (max)\n\n",
             rows, tail == PackTail::kPad ? "pad" : "drop");
  fmt::print("| C | P | rows | contiguous | zigzag | document |\n|---|---|---|---|---|---|\n");
  for (const int64_t P : {8192, 32768}) {
    std::vector<std::vector<int32_t>> cus;
    try {
      cus = rows_of(P, rows, mean_share, tail, data);
    } catch (const std::exception& e) {  // a corpus too small for one row of this size
      fmt::print("| – | {} | 0 | – | – | – |\n", P);
      continue;
    }
    for (const int64_t C : {2, 4, 8}) {
      std::string cells;
      for (const ContextBalance b :
           {ContextBalance::kContiguous, ContextBalance::kZigzag, ContextBalance::kDocument}) {
        double mean = 0, max = 0;
        for (const auto& cu : cus) {
          const double x = context_imbalance(cu, context_assignment(cu, C, b));
          mean += x / double(cus.size());
          max = std::max(max, x);
        }
        cells += fmt::format(" {:.3f} ({:.3f}) |", mean, max);
      }
      fmt::print("| {} | {} | {} |{}\n", C, P, cus.size(), cells);
    }
  }
  return 0;
}
