// The data-parallel gradient reduction overlapped with backward (modes/grad_buckets.h): the
// all-reduce, or ZeRO-1's reduce-scatter into the optimizer's slices when the layout has a zero1
// group. Shared by grad_overlap_np2_test.cpp and grad_overlap_np4_test.cpp: steps with the overlap
// on and off from the same start must give bitwise the same parameters, gradients, losses and
// norms, and the overlapped step must really start its buckets inside backward. Under LoRA the
// trainable table (the adapters) is compared.
#pragma once
#include <cstring>

#include "bf16_here.h"
#include "lora_parity.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace longtron::testing {

/// What `steps` train_steps of one engine left: every parameter and gradient, losses and norms.
struct OverlapRun {
  std::vector<float> params, grads;
  std::vector<double> losses, norms;
  bool overlapped = false;
  double in_backward = 0;
};

inline OverlapRun run_overlap(const ParityCase& c, bool overlap, bool bf16) {
  parallel::Grid grid = parallel::make_grid(world(), c.layout);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  engine.set_overlap_gradient_reduction(overlap);
  engine.set_compute_type(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32);
  if (engine.has_lora()) set_adapters(engine);
  // ZeRO-1 over the grid's zero1 group (one rank: no sharding): its gradients are reduce-scattered.
  train::AdamW adam(engine.train_layout(), parity_optimizer(), grid.zero1);
  OverlapRun out;
  for (int step = 0; step < c.steps; ++step) {
    const train::StepResult r = train::train_step(engine, adam, dp_share(global_rows(c, step), grid),
                                                  parity_step_options());
    EXPECT_FALSE(r.skipped);
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
    out.overlapped = engine.overlaps_gradient_reduction();
    out.in_backward += engine.reduction_times().in_backward;
  }
  const model::Params<float>& params = engine.train_params();
  const model::Params<float>& grads = engine.train_grads();
  out.params.assign(params.data(), params.data() + params.numel());
  out.grads.assign(grads.data(), grads.data() + grads.numel());
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Overlap on vs off: bitwise equal results; `expect_overlap` says whether the layout overlaps.
inline void check_overlap_bitwise(const ParityCase& c, bool bf16, bool expect_overlap) {
  if (bf16 && longtron::testing::bf16_gemm_refused_here()) return;  // the same on every rank
  const OverlapRun on = run_overlap(c, true, bf16), off = run_overlap(c, false, bf16);
  EXPECT_EQ(on.overlapped, expect_overlap) << c.name;
  EXPECT_FALSE(off.overlapped) << c.name;
  if (expect_overlap) {
    EXPECT_GT(on.in_backward, 0.0) << c.name;  // the hook ran
  }
  EXPECT_TRUE(same_bits(on.params, off.params)) << c.name;
  EXPECT_TRUE(same_bits(on.grads, off.grads)) << c.name;
  EXPECT_EQ(on.losses, off.losses) << c.name;
  EXPECT_EQ(on.norms, off.norms) << c.name;
}

}  // namespace longtron::testing
