// The parity harness shared by the MPI parity tests (engine_parity.h, isp_parity.h, tp2d_cases.h):
// a one-process reference run and the same steps under a layout, both through train::train_step (the
// trainer's own step) on the same global batch,
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

#include "core/error.h"
#include "model/decoder.h"
#include "modes/engine.h"
#include "mpi_test_main.h"
#include "parallel/layout.h"
#include "train/optimizer.h"
#include "train/step.h"

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

/// The step options of every parity run: the trainer's defaults (token-weighted loss) with
/// parity_optimizer()'s learning rate and clipping.
inline train::StepOptions parity_step_options() {
  train::StepOptions o;
  o.lr = parity_optimizer().lr;
  o.clip_grad_norm = parity_optimizer().clip_grad_norm;
  return o;
}

/// This dp rank's rows of the global batch: micro_num = rows / dp consecutive rows.
inline std::vector<MicroBatch> dp_share(const std::vector<MicroBatch>& all,
                                        const parallel::Grid& grid) {
  const int micro_num = int(all.size()) / grid.dp;
  return std::vector<MicroBatch>(all.begin() + grid.data->rank() * micro_num,
                                 all.begin() + (grid.data->rank() + 1) * micro_num);
}

/// One step's gradients on this rank's rows (the gradient half of train_step: scaled by 1 / the
/// global label count, finished by the engine's reductions). r.loss is the step loss over the
/// data-parallel group.
inline train::StepResult engine_gradients(parallel::ParallelEngine& engine,
                                          const std::vector<MicroBatch>& mine) {
  const train::StepResult r = train::step_gradients(engine, mine, parity_step_options());
  EXPECT_TRUE(std::isfinite(r.loss));
  return r;
}

/// Steps [first_step, last_step) of `engine` through train::train_step, the trainer's step: each
/// dp rank its own rows, the engine's reductions, clipping, AdamW (with ZeRO-1 over grid.zero1
/// when `adam` was built so). Appends to `out`; the step-1 gradients (full tensors, before
/// clipping) are recorded when first_step is 0.
inline void engine_steps(parallel::ParallelEngine& engine, train::AdamW& adam,
                         const StepRows& step_rows, int first_step, int last_step, RunResult& out) {
  for (int step = first_step; step < last_step; ++step) {
    train::StepOptions options = parity_step_options();
    if (step == 0)
      options.on_gradients = [&out](parallel::ParallelEngine& e) {
        model::Params<float> full(e.full_layout());
        e.gather_full(full, e.grads());
        out.step1_grads.assign(full.data(), full.data() + full.numel());
      };
    const train::StepResult r =
        train::train_step(engine, adam, dp_share(step_rows(step), engine.grid()), options);
    EXPECT_FALSE(r.skipped) << "step " << step;
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
}

/// One process (a dense engine on a one-rank communicator), every row of the global batch, `steps`
/// AdamW steps with clipping: exactly what `longtron train` runs as one process, in `type`.
inline RunResult reference_run(const model::ModelConfig& m, int steps, const StepRows& step_rows,
                               ops::ComputeType type = ops::ComputeType::kFloat32) {
  parallel::Grid grid = parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  parallel::ParallelEngine engine(m, grid, 42);
  engine.set_compute_type(type);
  train::AdamW adam(engine.local_layout(), parity_optimizer());
  RunResult out;
  engine_steps(engine, adam, step_rows, 0, steps, out);
  return out;
}

inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

/// Max over tensors of max|g − g_ref| / max|g_ref| (each tensor's max-norm).
inline double max_grad_error(const model::ParamTable& layout, const std::vector<float>& g,
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

inline ParityErrors parity_errors(const model::ParamTable& full, const RunResult& got,
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
inline std::string engine_error(const model::ModelConfig& m, const parallel::Layout& l, int64_t P) {
  try {
    parallel::Grid grid = parallel::make_grid(world(), l);
    parallel::ParallelEngine engine(m, grid, 1, P);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace longtron::testing
