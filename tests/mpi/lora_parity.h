// LoRA parity of a parallel layout with one process (docs/lora.md): the same base (drawn from one
// seed), the same adapters (A as drawn, B set non-zero so that A has a gradient), dropout on; the
// step-1 loss, gradient norm and every adapter gradient, and the losses of every step through
// train::train_step (AdamW over the adapters only, ZeRO-1 where the layout has it), within the
// parity contract. Shared by lora_parity_np<N>_test.cpp.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine_parity.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "packing/context_split.h"

namespace longtron::testing {

/// tiny_model of family `type` with adapters: rank 3, dropout 0.2, every linear.
inline model::ModelConfig lora_model(const std::string& type, int kv_heads = 2) {
  model::ModelConfig c = tiny_model(kv_heads);
  c.type = type;
  c.lora.rank = 3;
  c.lora.alpha = 6.0;
  c.lora.dropout = 0.2;
  c.lora.seed = 5;
  c.lora.targets = {"all-linear"};
  return c;
}

/// The adapters' start: A as the engine drew it, B from a normal of std 0.05 (seed 17).
inline void set_adapters(parallel::ParallelEngine& engine) {
  model::Params<float> full(engine.train_full_layout());
  engine.gather_train_full(full, engine.train_params());
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal(0.0, 0.05);
  for (const model::LoraModule& m : engine.lora_modules()) {
    float* B = full.ptr(m.b_view);
    for (int64_t i = 0; i < full.layout().view(m.b_view).numel; ++i) B[i] = float(normal(rng));
  }
  engine.scatter_train_full(engine.train_params(), full);
}

/// `steps` steps of the case on `grid`; step-1 adapter gradients gathered (full, table order).
inline RunResult lora_run(const ParityCase& c, const parallel::Grid& grid, bool zero1,
                          ops::ComputeType type = ops::ComputeType::kFloat32) {
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  engine.set_compute_type(type);
  set_adapters(engine);
  train::AdamW adam(engine.train_layout(), parity_optimizer(), zero1 ? grid.zero1 : nullptr);
  RunResult out;
  for (int step = 0; step < c.steps; ++step) {
    train::StepOptions options = parity_step_options();
    if (step == 0)
      options.on_gradients = [&out](parallel::ParallelEngine& e) {
        model::Params<float> full(e.train_full_layout());
        e.gather_train_full(full, e.train_grads());
        out.step1_grads.assign(full.data(), full.data() + full.numel());
      };
    const train::StepResult r =
        train::train_step(engine, adam, dp_share(global_rows(c, step), grid), options);
    EXPECT_FALSE(r.skipped) << "step " << step;
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
  return out;
}

/// The case under its layout against one process; `bf16` runs both under the bf16 compute type
/// (then the bf16 bounds: step-1 loss 1e-3, gradient norm 1e-2).
inline void check_lora_parity(const ParityCase& c, bool bf16 = false) {
  const ops::ComputeType type = bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32;
  const RunResult ref = lora_run(
      c, parallel::make_grid(comm::make_local_communicator(), parallel::Layout{}), false, type);
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  const RunResult got = lora_run(c, grid, true, type);
  parallel::ParallelEngine probe(c.model, parallel::make_grid(comm::make_local_communicator(),
                                                              parallel::Layout{}), 42, c.P);
  const ParityErrors e = parity_errors(probe.train_full_layout(), got, ref);
  if (world()->rank() == 0)
    std::printf("[lora parity] %-26s dp %d tp %d zero1 %d: step-1 loss %.6f rel err %.2e, grad "
                "norm %.6f rel err %.2e, max adapter grad err %.2e (%s), %d-step loss max rel err "
                "%.2e\n",
                c.name.c_str(), grid.dp, grid.tp, grid.zero1->size(), ref.losses[0], e.loss1,
                ref.norms[0], e.norm1, e.grads, e.worst.c_str(), c.steps, e.losses);
  if (!bf16) {
    expect_parity(e, c.name);
  } else {
    EXPECT_LT(e.loss1, 1e-3) << c.name;
    EXPECT_LT(e.norm1, 1e-2) << c.name;
  }
}

/// ISP over T ranks with weight parallel W; with `context` > 1, 2D-Attention (head size T /
/// context, zigzag balance).
inline parallel::Layout lora_isp(int T, int W, int context = 1) {
  parallel::Layout l;
  l.tensor_size = T;
  l.tensor_mode = parallel::TensorMode::kIsp;
  l.weight_size = W;
  if (context > 1) {
    l.seq2d = true;
    l.seq2d_head = T / context;
    l.seq2d_context = context;
    l.seq2d_balance = data::parse_context_balance("zigzag");
  }
  return l;
}

/// 2D tensor parallel x × y (modes/tp2d_ops.h), ZeRO-1 over the data-parallel rest.
inline parallel::Layout lora_2d(int x, int y) {
  parallel::Layout l;
  l.tensor_2d_x = x;
  l.tensor_2d_y = y;
  l.zero1_size = -1;
  return l;
}

/// Save after `split` steps in layout `a` (the adapters and their AdamW moments gathered to full
/// tensors, as a checkpoint holds them), resume in layout `b` from those tensors, and compare
/// every loss with one process (the parity contract's 1e-4 on losses).
inline void check_lora_resume(const ParityCase& c, const parallel::Layout& a,
                              const parallel::Layout& b, int split) {
  const RunResult ref =
      lora_run(c, parallel::make_grid(comm::make_local_communicator(), parallel::Layout{}), false);
  std::vector<double> losses;
  auto steps = [&](parallel::ParallelEngine& engine, train::AdamW& adam,
                   const parallel::Grid& grid, int from, int to) {
    for (int step = from; step < to; ++step)
      losses.push_back(train::train_step(engine, adam, dp_share(global_rows(c, step), grid),
                                         parity_step_options()).loss);
  };
  parallel::ParallelEngine probe(c.model, parallel::make_grid(comm::make_local_communicator(),
                                                              parallel::Layout{}), 42, c.P);
  model::Params<float> params(probe.train_full_layout()), m(probe.train_full_layout()),
      v(probe.train_full_layout());
  int64_t adam_step = 0;
  {
    parallel::Grid grid = parallel::make_grid(world(), a);
    parallel::ParallelEngine engine(c.model, grid, 42, c.P);
    set_adapters(engine);
    train::AdamW adam(engine.train_layout(), parity_optimizer(), grid.zero1);
    steps(engine, adam, grid, 0, split);
    model::Params<float> lm(engine.train_layout()), lv(engine.train_layout());
    adam.gather_state(lm, lv);
    engine.gather_train_full(params, engine.train_params());
    engine.gather_train_full(m, lm);
    engine.gather_train_full(v, lv);
    adam_step = adam.step();
  }
  parallel::Grid grid = parallel::make_grid(world(), b);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);  // the same base (seed 42)
  train::AdamW adam(engine.train_layout(), parity_optimizer(), grid.zero1);
  engine.scatter_train_full(engine.train_params(), params);
  {
    model::Params<float> lm(engine.train_layout()), lv(engine.train_layout());
    engine.scatter_train_full(lm, m);
    engine.scatter_train_full(lv, v);
    adam.load_state(lm, lv);
  }
  adam.set_step(adam_step);
  steps(engine, adam, grid, split, c.steps);
  double err = 0;
  for (int s = 0; s < c.steps; ++s)
    err = std::max(err, rel(losses[size_t(s)], ref.losses[size_t(s)]));
  if (world()->rank() == 0)
    std::printf("[lora resume] %s: %d steps in one layout, %d in the other: loss max rel err %.2e\n",
                c.name.c_str(), split, c.steps - split, err);
  EXPECT_LT(err, 1e-4) << c.name;
}

inline ParityCase lora_case(const std::string& name, parallel::Layout l, const std::string& type,
                            int kv_heads = 2) {
  ParityCase c{name, std::move(l)};
  c.model = lora_model(type, kv_heads);
  c.steps = 3;
  return c;
}

}  // namespace longtron::testing
