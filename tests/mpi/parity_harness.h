// The parity harness shared by the MPI parity tests (engine_parity.h, isp_parity.h, tp2d_cases.h):
// a one-process reference run and the same steps through a ParallelEngine on the same global batch,
// the contract's error measures, and the layout-error probe. The global batch of each step comes
// from a StepRows function, so each suite keeps its own row generator.
// Contract (docs/parallel.md): step-1 loss and gradient norm within 1e-5 relative, every parameter's
// gradient within 1e-4 relative (max-norm over the tensor), the losses of every step within 1e-4.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "comm/process_grid.h"
#include "core/error.h"
#include "model/internlm2.h"
#include "mpi_test_main.h"
#include "parallel/engine.h"
#include "train/optimizer.h"

namespace longtron::testing {

using data::MicroBatch;

/// Every row of the global batch of step `step` (all dp ranks' rows, dp-major).
using StepRows = std::function<std::vector<MicroBatch>(int step)>;

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

inline int64_t count_labels(const std::vector<MicroBatch>& rows) {
  int64_t n = 0;
  for (const auto& r : rows)
    for (int32_t y : r.labels) n += (y != data::kIgnoreIndex);
  return n;
}

/// One process, dense ops, every row of the global batch, `steps` AdamW steps with clipping.
inline RunResult reference_run(const model::ModelConfig& m, int steps, const StepRows& step_rows) {
  model::ParamLayout layout(m);
  model::Params<float> params(layout), grads(layout);
  model::init_params(params, 42);
  model::InternLM2<float> net(layout, params);
  train::AdamW adam(layout, parity_optimizer());
  RunResult out;
  for (int step = 0; step < steps; ++step) {
    const auto rows = step_rows(step);
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

/// This dp rank's rows of the global batch: micro_num = rows / dp consecutive rows.
inline std::vector<MicroBatch> dp_share(const std::vector<MicroBatch>& all,
                                        const comm::ProcessGrid& grid) {
  const int micro_num = int(all.size()) / grid.dp;
  return std::vector<MicroBatch>(all.begin() + grid.data->rank() * micro_num,
                                 all.begin() + (grid.data->rank() + 1) * micro_num);
}

/// One step's gradients on this rank's rows (scaled by 1 / the global label count), finished by
/// the engine's reductions. Returns this rank's loss (not yet reduced over DATA).
inline model::LossSum engine_gradients(parallel::ParallelEngine& engine,
                                       const std::vector<MicroBatch>& mine) {
  engine.zero_grads();
  const int64_t count = engine.global_label_count(mine);
  model::LossSum loss;
  for (const auto& r : mine) {
    const model::LossSum l = engine.forward_backward(r, 1.0 / double(count));
    loss.sum += l.sum, loss.count += l.count;
  }
  EXPECT_TRUE(std::isfinite(loss.sum));
  engine.finish_gradients();
  return loss;
}

/// Steps [first_step, last_step) of the layout under test: each dp rank its own rows, the engine's
/// reductions, clipping, AdamW (with ZeRO-1 over grid.zero1 when `adam` was built so). Appends to
/// `out`; the step-1 gradients are recorded when first_step is 0.
inline void engine_steps(parallel::ParallelEngine& engine, train::AdamW& adam,
                         const StepRows& step_rows, int first_step, int last_step, RunResult& out) {
  for (int step = first_step; step < last_step; ++step) {
    model::LossSum loss = engine_gradients(engine, dp_share(step_rows(step), engine.grid()));
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

/// The contract's errors of a run against the reference (relative; `worst` names the tensor).
struct ParityErrors {
  double loss1 = 0, norm1 = 0, grads = 0, losses = 0;
  std::string worst;
};

inline ParityErrors parity_errors(const model::ParamLayout& full, const RunResult& got,
                                  const RunResult& ref) {
  ParityErrors e;
  e.grads = max_grad_error(full, got.step1_grads, ref.step1_grads, &e.worst);
  for (size_t s = 0; s < ref.losses.size(); ++s)
    e.losses = std::max(e.losses, rel(got.losses[s], ref.losses[s]));
  e.loss1 = rel(got.losses[0], ref.losses[0]);
  e.norm1 = rel(got.norms[0], ref.norms[0]);
  return e;
}

/// Asserts the contract (on every rank).
inline void expect_parity(const ParityErrors& e, const std::string& name) {
  EXPECT_LT(e.loss1, 1e-5) << name;
  EXPECT_LT(e.norm1, 1e-5) << name;
  EXPECT_LT(e.grads, 1e-4) << name << " worst tensor " << e.worst;
  EXPECT_LT(e.losses, 1e-4) << name;
}

/// The engine's error message for a layout (empty when it builds). Layout errors come from the
/// constructor, before any parameter is allocated, on every rank.
inline std::string engine_error(const model::ModelConfig& m, const comm::Layout& l, int64_t P) {
  try {
    comm::ProcessGrid grid = comm::make_process_grid(world(), l);
    parallel::ParallelEngine engine(m, grid, 1, P);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace longtron::testing
