// Parity of a parallel layout with one process on the same global batch (docs/parallel.md), shared
// by the engine_*_np<N>_test.cpp files: the tiny model, random packed rows and the cases, on the
// harness of parity_harness.h. Every rank also computes the one-process reference itself (dense ops
// over the full tensors, all dp × micro_num rows), so the comparison needs no file.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "parity_harness.h"

namespace longtron::testing {

/// A tiny InternLM2: vocab 101 (divisible by neither 2 nor 4: uneven vocabulary shards), FFN 85
/// (uneven FFN shards), biases on (q/k/v, o and Llama's gate/up/down), 2 layers. kv_heads 2 (GQA)
/// or 4 (tp4).
inline model::ModelConfig tiny_model(int kv_heads = 2) {
  model::ModelConfig c;
  c.vocab_size = 101;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = kv_heads;
  c.multiple_of = 1;  // ffn = int(32 · 8/3) = 85
  c.qkv_bias = true;
  c.o_bias = true;
  c.mlp_bias = true;
  return c;
}

/// tiny_model with tie_word_embeddings: one [101, 32] table for the embedding and the head (101
/// rows: uneven vocabulary shards of the tied table too).
inline model::ModelConfig tied_model(int kv_heads = 2) {
  model::ModelConfig c = tiny_model(kv_heads);
  c.tie_word_embeddings = true;
  return c;
}

/// A packed row of P tokens: documents of random lengths, RoPE indexes per document, labels of
/// the next token with -100 at each document end and on a few random tokens.
inline MicroBatch random_row(int64_t P, int64_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  MicroBatch b;
  b.cu_seqlens.push_back(0);
  while (b.cu_seqlens.back() < P) {
    int32_t len = std::uniform_int_distribution<int32_t>(1, int32_t(P) / 2)(gen);
    len = std::min<int32_t>(len, int32_t(P) - b.cu_seqlens.back());
    b.cu_seqlens.push_back(b.cu_seqlens.back() + len);
  }
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s) {
    const int32_t len = b.cu_seqlens[s] - b.cu_seqlens[s - 1];
    b.max_seqlen = std::max(b.max_seqlen, len);
    for (int32_t i = 0; i < len; ++i) {
      b.input_ids.push_back(std::uniform_int_distribution<int32_t>(0, int32_t(vocab) - 1)(gen));
      b.indexes.push_back(i);
    }
  }
  b.labels.assign(size_t(P), data::kIgnoreIndex);
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s)
    for (int32_t n = b.cu_seqlens[s - 1]; n + 1 < b.cu_seqlens[s]; ++n)
      if (gen() % 8 != 0) b.labels[size_t(n)] = b.input_ids[size_t(n) + 1];
  return b;
}

struct ParityCase {
  std::string name;
  parallel::Layout layout;
  model::ModelConfig model = tiny_model();
  int64_t P = 16;        ///< tokens per row
  int rows = 4;          ///< rows of the global batch per step (micro_num = rows / dp)
  int steps = 5;
};

inline std::vector<MicroBatch> global_rows(const ParityCase& c, int step) {
  std::vector<MicroBatch> rows;
  for (int i = 0; i < c.rows; ++i)
    rows.push_back(random_row(c.P, c.model.vocab_size, unsigned(1000 * step + i + 7)));
  return rows;
}

/// One process, dense ops, every row of the global batch, in `type`.
inline RunResult run_reference(const ParityCase& c,
                               ops::ComputeType type = ops::ComputeType::kFloat32) {
  return reference_run(c.model, c.steps, [&c](int step) { return global_rows(c, step); }, type);
}

/// The layout under test: each dp rank its own rows, the engine's reductions, AdamW with ZeRO-1
/// over grid.zero1. `steps` may be fewer than c.steps (checkpoint tests continue elsewhere).
inline void run_engine_steps(parallel::ParallelEngine& engine, train::AdamW& adam,
                             const ParityCase& c, int first_step, int last_step, RunResult& out) {
  engine_steps(engine, adam, [&c](int step) { return global_rows(c, step); }, first_step,
               last_step, out);
}

/// Runs the case and checks the contract on every rank; prints the measured errors on rank 0.
inline void check_parity(const ParityCase& c) {
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const RunResult ref = run_reference(c);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  RunResult got;
  run_engine_steps(engine, adam, c, 0, c.steps, got);

  const ParityErrors e = parity_errors(engine.full_layout(), got, ref);
  if (world()->rank() == 0)
    std::printf("[parity] %-22s mode %-5s dp %d tp %d zero1 %d: step-1 loss %.6f rel err %.2e, "
                "grad norm %.6f rel err %.2e, max grad err %.2e (%s), 5-step loss max rel err "
                "%.2e\n",
                c.name.c_str(), engine.mode().c_str(), grid.dp, grid.tp, grid.zero1->size(),
                ref.losses[0], e.loss1, ref.norms[0], e.norm1, e.grads, e.worst.c_str(), e.losses);
  expect_parity(e, c.name);
}

/// Save after `split` steps in layout `a` (HF-named full tensors: params and AdamW moments,
/// gathered), resume in layout `b` from those full tensors, and compare every loss with one process.
inline void check_resume(const ParityCase& c, const parallel::Layout& a, const parallel::Layout& b,
                         int split) {
  const RunResult ref = run_reference(c);
  model::ParamTable full_layout(c.model);
  model::Params<float> params(full_layout), m(full_layout), v(full_layout);
  int64_t adam_step = 0;
  RunResult got;
  {
    parallel::Grid grid = parallel::make_grid(world(), a);
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
    run_engine_steps(engine, adam, c, 0, split, got);
    model::Params<float> local_m(engine.local_layout()), local_v(engine.local_layout());
    adam.gather_state(local_m, local_v);
    engine.gather_full(params, engine.params());
    engine.gather_full(m, local_m);
    engine.gather_full(v, local_v);
    adam_step = adam.step();
  }
  parallel::Grid grid = parallel::make_grid(world(), b);
  parallel::ParallelEngine engine(c.model, grid, /*seed (overwritten)=*/7, c.P);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  engine.scatter_full(engine.params(), params);
  {
    model::Params<float> local_m(engine.local_layout()), local_v(engine.local_layout());
    engine.scatter_full(local_m, m);
    engine.scatter_full(local_v, v);
    adam.load_state(local_m, local_v);
  }
  adam.set_step(adam_step);
  run_engine_steps(engine, adam, c, split, c.steps, got);
  double err = 0;
  for (int s = 0; s < c.steps; ++s) err = std::max(err, rel(got.losses[size_t(s)], ref.losses[size_t(s)]));
  if (world()->rank() == 0)
    std::printf("[resume] %s: %d steps in one layout, %d in the other: loss max rel err %.2e\n",
                c.name.c_str(), split, c.steps - split, err);
  EXPECT_LT(err, 1e-4) << c.name;
}

inline parallel::Layout layout(int tp, parallel::TensorMode mode, int zero1 = 1) {
  parallel::Layout l;
  l.tensor_size = tp;
  l.tensor_mode = mode;
  l.zero1_size = zero1;
  return l;
}

}  // namespace longtron::testing
