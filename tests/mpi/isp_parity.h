// ISP parity with one process (docs/parallel.md contract; harness in parity_harness.h): step-1 loss and
// gradient norm within 1e-5 relative, every parameter's gradient within 1e-4 (max-norm), 5 steps
// of losses within 1e-4. Rows come from a generator so that the data path can be the real one:
// packed rows (random documents), unpacked rows (build_unpack: one document per segment + a pad
// segment) and rows whose second half is all padding (some sequence shard has no valid label).
#pragma once
#include <functional>
#include <memory>

#include "data/memory_source.h"
#include "engine_parity.h"
#include "packing/pack.h"

namespace longtron::testing {

/// Row `i` of step `step` of the global batch.
using RowFn = std::function<MicroBatch(int step, int i)>;

struct IspCase {
  IspCase(std::string n, parallel::Layout l) : name(std::move(n)), layout(l) {}
  std::string name;
  parallel::Layout layout;
  model::ModelConfig model = tiny_model();
  int64_t P = 16;
  int rows = 4;
  int steps = 5;
  RowFn row;  ///< nullptr = random_row(P)
};

inline parallel::Layout isp(int T, int W, bool overlap = false) {
  parallel::Layout l;
  l.tensor_size = T;
  l.tensor_mode = parallel::TensorMode::kIsp;
  l.weight_size = W;
  l.weight_overlap = overlap;
  return l;
}

inline std::vector<MicroBatch> rows_of_step(const IspCase& c, int step) {
  std::vector<MicroBatch> rows;
  for (int i = 0; i < c.rows; ++i)
    rows.push_back(c.row ? c.row(step, i)
                         : random_row(c.P, c.model.vocab_size, unsigned(1000 * step + i + 7)));
  return rows;
}

/// Documents of random lengths in [1, max_len], ids in [1, vocab).
inline std::vector<std::vector<int32_t>> random_documents(int n, int max_len, int64_t vocab,
                                                          unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(size_t(std::uniform_int_distribution<int>(1, max_len)(gen)));
    for (auto& t : d) t = std::uniform_int_distribution<int32_t>(1, int32_t(vocab) - 1)(gen);
  }
  return docs;
}

/// Unpacked mode (data.use_packed_dataset = false): micro_bsz documents of at most seq_len tokens
/// per row, each its own segment, then one pad segment (build_unpack, docs/data.md).
/// With max_len ≤ seq_len / 2 the pad covers at least the second half of the row.
inline RowFn unpacked_rows(int64_t seq_len, int64_t micro_bsz, int max_len, int64_t vocab) {
  return [=](int step, int i) {
    data::MemorySource src(random_documents(int(micro_bsz), max_len, vocab,
                                            unsigned(77 + 100 * step + i)));
    data::PackConfig pc;
    pc.seq_len = seq_len;
    pc.micro_bsz = micro_bsz;
    pc.use_packed_dataset = false;
    std::vector<int64_t> order(static_cast<size_t>(micro_bsz), 0);
    for (int64_t k = 0; k < micro_bsz; ++k) order[size_t(k)] = k;
    auto rows = data::build_unpack(src, order, pc);
    MicroBatch b;
    rows->row_into(0, b);
    return b;
  };
}

/// One process, dense ops, every row of every step.
inline RunResult isp_reference(const IspCase& c) {
  return reference_run(c.model, c.steps, [&c](int step) { return rows_of_step(c, step); });
}

/// The layout under test through the engine: each dp rank its rows, the engine's reductions,
/// AdamW with ZeRO-1 over grid.zero1 (WEIGHT_DATA sub-groups under ISP).
inline RunResult isp_run(const IspCase& c, parallel::ParallelEngine& engine) {
  train::AdamW adam(engine.local_layout(), parity_optimizer(), engine.grid().zero1);
  RunResult out;
  engine_steps(engine, adam, [&c](int step) { return rows_of_step(c, step); }, 0, c.steps, out);
  return out;
}

/// Checks the contract on every rank and prints the measured errors on rank 0.
inline RunResult check_isp_parity(const IspCase& c) {
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const RunResult ref = isp_reference(c);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  EXPECT_EQ(engine.mode(), "isp");
  const RunResult got = isp_run(c, engine);
  const ParityErrors e = parity_errors(engine.full_layout(), got, ref);
  if (world()->rank() == 0)
    std::printf("[isp-parity] %-30s T %d W %d dp %d zero1 %d overlap %d ckpt %d: step-1 loss %.6f "
                "rel err %.2e, grad norm %.6f rel err %.2e, max grad err %.2e (%s), 5-step loss "
                "max rel err %.2e\n",
                c.name.c_str(), grid.tp, c.layout.weight_size, grid.dp, grid.zero1->size(),
                int(c.layout.weight_overlap), int(c.model.checkpoint), ref.losses[0], e.loss1,
                ref.norms[0], e.norm1, e.grads, e.worst.c_str(), e.losses);
  expect_parity(e, c.name);
  return got;
}

/// Overlap on and off must give bitwise identical runs (the gathers are exact copies).
inline void check_overlap_identical(IspCase c) {
  c.layout.weight_overlap = false;
  const RunResult off = check_isp_parity(c);
  c.layout.weight_overlap = true;
  c.name += " overlap";
  const RunResult on = check_isp_parity(c);
  EXPECT_EQ(off.losses, on.losses) << c.name;
  EXPECT_EQ(off.step1_grads, on.step1_grads) << c.name;
}

}  // namespace longtron::testing
