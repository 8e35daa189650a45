// Parity of a parallel layout with one process on the same global batch (SPEC §3), shared by the
// engine_*_np<N>_test.cpp files. Every rank also computes the one-process reference itself (dense
// ops over the full tensors, all dp × micro_num rows), so the comparison needs no file.
// Contract: step-1 loss and gradient norm within 1e-5 relative, every parameter's gradient within
// 1e-4 relative (max-norm over the tensor), 5 steps of losses within 1e-4 relative.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "comm/process_grid.h"
#include "model/internlm2.h"
#include "mpi_test_main.h"
#include "parallel/engine.h"
#include "train/optimizer.h"

namespace longtron::testing {

using data::MicroBatch;

/// A tiny InternLM2: vocab 101 (divisible by neither 2 nor 4: uneven vocabulary shards), FFN 85
/// (uneven FFN shards), biases on, 2 layers. kv_heads 2 (GQA) or 4 (tp4).
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
  comm::Layout layout;
  model::ModelConfig model = tiny_model();
  int64_t P = 16;        ///< tokens per row
  int rows = 4;          ///< rows of the global batch per step (micro_num = rows / dp)
  int steps = 5;
};

/// What one run (reference or layout) measured.
struct RunResult {
  std::vector<double> losses, norms;
  std::vector<float> step1_grads;  ///< full tensors, full layout order
};

inline train::OptimizerConfig parity_optimizer() {
  train::OptimizerConfig o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.clip_grad_norm = 0.5;  // below the tiny model's norms, so clipping is exercised
  return o;
}

inline std::vector<MicroBatch> global_rows(const ParityCase& c, int step) {
  std::vector<MicroBatch> rows;
  for (int i = 0; i < c.rows; ++i)
    rows.push_back(random_row(c.P, c.model.vocab_size, unsigned(1000 * step + i + 7)));
  return rows;
}

inline int64_t count_labels(const std::vector<MicroBatch>& rows) {
  int64_t n = 0;
  for (const auto& r : rows)
    for (int32_t y : r.labels) n += (y != data::kIgnoreIndex);
  return n;
}

/// One process, dense ops, every row of the global batch.
inline RunResult run_reference(const ParityCase& c) {
  model::ParamLayout layout(c.model);
  model::Params<float> params(layout), grads(layout);
  model::init_params(params, 42);
  model::InternLM2<float> net(layout, params);
  train::AdamW adam(layout, parity_optimizer());
  RunResult out;
  for (int step = 0; step < c.steps; ++step) {
    const auto rows = global_rows(c, step);
    const int64_t count = count_labels(rows);
    grads.zero();
    model::LossSum loss;
    for (const auto& r : rows) {
      const model::LossSum l = net.forward_backward(r, grads, 1.0 / double(count));
      loss.sum += l.sum, loss.count += l.count;
    }
    double sq = 0;
    for (int64_t i = 0; i < grads.numel(); ++i) sq += double(grads.data()[i]) * grads.data()[i];
    const double norm = std::sqrt(sq);
    if (step == 0) out.step1_grads.assign(grads.data(), grads.data() + grads.numel());
    const double clip = parity_optimizer().clip_grad_norm;
    if (norm > clip)
      for (int64_t i = 0; i < grads.numel(); ++i) grads.data()[i] *= float(clip / norm);
    adam.update(params, grads, parity_optimizer().lr);
    out.losses.push_back(loss.sum / double(loss.count));
    out.norms.push_back(norm);
  }
  return out;
}

/// The layout under test: each dp rank its own rows, the engine's reductions, AdamW with ZeRO-1
/// over grid.zero1. `steps` may be fewer than c.steps (checkpoint tests continue elsewhere).
inline void run_engine_steps(parallel::ParallelEngine& engine, train::AdamW& adam,
                             const ParityCase& c, int first_step, int last_step, RunResult& out) {
  const comm::ProcessGrid& grid = engine.grid();
  for (int step = first_step; step < last_step; ++step) {
    const auto all = global_rows(c, step);
    const int micro_num = c.rows / grid.dp;
    std::vector<MicroBatch> mine(all.begin() + grid.data->rank() * micro_num,
                                 all.begin() + (grid.data->rank() + 1) * micro_num);
    engine.zero_grads();
    const int64_t count = engine.global_label_count(mine);
    model::LossSum loss;
    for (const auto& r : mine) {
      const model::LossSum l = engine.forward_backward(r, 1.0 / double(count));
      loss.sum += l.sum, loss.count += l.count;
    }
    engine.finish_gradients();
    const double norm = engine.grad_norm();
    if (step == 0) {
      model::Params<float> full(engine.full_layout());
      engine.gather_full(full, engine.grads());
      out.step1_grads.assign(full.data(), full.data() + full.numel());
    }
    const double clip = parity_optimizer().clip_grad_norm;
    if (norm > clip) engine.scale_grads(float(clip / norm));
    adam.update(engine.params(), engine.grads(), parity_optimizer().lr);
    loss = engine.reduce_loss(loss);
    out.losses.push_back(loss.sum / double(loss.count));
    out.norms.push_back(norm);
  }
}

inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

/// Max over tensors of max|g − g_ref| / max|g_ref| (each tensor's max-norm).
inline double max_grad_error(const model::ParamLayout& layout, const std::vector<float>& g,
                             const std::vector<float>& ref, std::string* worst) {
  double worst_err = 0;
  for (const auto& v : layout.views()) {
    double diff = 0, scale = 0;
    for (int64_t i = v.offset; i < v.offset + v.numel; ++i) {
      diff = std::max(diff, double(std::abs(g[size_t(i)] - ref[size_t(i)])));
      scale = std::max(scale, double(std::abs(ref[size_t(i)])));
    }
    const double e = scale > 0 ? diff / scale : diff;
    if (e > worst_err) worst_err = e, *worst = v.name;
  }
  return worst_err;
}

/// Runs the case and checks the contract on every rank; prints the measured errors on rank 0.
inline void check_parity(const ParityCase& c) {
  comm::ProcessGrid grid = comm::make_process_grid(world(), c.layout);
  const RunResult ref = run_reference(c);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  RunResult got;
  run_engine_steps(engine, adam, c, 0, c.steps, got);

  std::string worst;
  const double gerr = max_grad_error(engine.full_layout(), got.step1_grads, ref.step1_grads, &worst);
  double lerr = 0;
  for (int s = 0; s < c.steps; ++s) lerr = std::max(lerr, rel(got.losses[size_t(s)], ref.losses[size_t(s)]));
  const double l1 = rel(got.losses[0], ref.losses[0]), n1 = rel(got.norms[0], ref.norms[0]);
  if (world()->rank() == 0)
    std::printf("[parity] %-22s mode %-5s dp %d tp %d zero1 %d: step-1 loss %.6f rel err %.2e, "
                "grad norm %.6f rel err %.2e, max grad err %.2e (%s), 5-step loss max rel err "
                "%.2e\n",
                c.name.c_str(), engine.mode().c_str(), grid.dp, grid.tp, grid.zero1->size(),
                ref.losses[0], l1, ref.norms[0], n1, gerr, worst.c_str(), lerr);
  EXPECT_LT(l1, 1e-5) << c.name;
  EXPECT_LT(n1, 1e-5) << c.name;
  EXPECT_LT(gerr, 1e-4) << c.name << " worst tensor " << worst;
  EXPECT_LT(lerr, 1e-4) << c.name;
}

/// Save after `split` steps in layout `a` (HF-named full tensors: params and AdamW moments,
/// gathered), resume in layout `b` from those full tensors, and compare every loss with one process.
inline void check_resume(const ParityCase& c, const comm::Layout& a, const comm::Layout& b,
                         int split) {
  const RunResult ref = run_reference(c);
  model::ParamLayout full_layout(c.model);
  model::Params<float> params(full_layout), m(full_layout), v(full_layout);
  int64_t adam_step = 0;
  RunResult got;
  {
    comm::ProcessGrid grid = comm::make_process_grid(world(), a);
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
    run_engine_steps(engine, adam, c, 0, split, got);
    adam.gather_state();
    engine.gather_full(params, engine.params());
    engine.gather_full(m, adam.exp_avg());
    engine.gather_full(v, adam.exp_avg_sq());
    adam_step = adam.step();
  }
  comm::ProcessGrid grid = comm::make_process_grid(world(), b);
  parallel::ParallelEngine engine(c.model, grid, /*seed (overwritten)=*/7, c.P);
  train::AdamW adam(engine.local_layout(), parity_optimizer(), grid.zero1);
  engine.scatter_full(engine.params(), params);
  engine.scatter_full(adam.exp_avg(), m);
  engine.scatter_full(adam.exp_avg_sq(), v);
  adam.set_step(adam_step);
  run_engine_steps(engine, adam, c, split, c.steps, got);
  double err = 0;
  for (int s = 0; s < c.steps; ++s) err = std::max(err, rel(got.losses[size_t(s)], ref.losses[size_t(s)]));
  if (world()->rank() == 0)
    std::printf("[resume] %s: %d steps in one layout, %d in the other: loss max rel err %.2e\n",
                c.name.c_str(), split, c.steps - split, err);
  EXPECT_LT(err, 1e-4) << c.name;
}

inline comm::Layout layout(int tp, comm::TensorMode mode, int zero1 = 1) {
  comm::Layout l;
  l.tensor_size = tp;
  l.tensor_mode = mode;
  l.zero1_size = zero1;
  return l;
}

}  // namespace longtron::testing
