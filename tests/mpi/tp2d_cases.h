// 2D tensor parallel (modes/tp2d_ops.h) parity cases shared by tp2d_np2_test.cpp and
// tp2d_np4_test.cpp: the engine_parity.h contract against one process, plus comparisons of the overlap
// options with "none" and of x2×y1 with MSP (bit-identical).
#pragma once
#include <cstring>
#include <string>

#include "core/error.h"
#include "engine_parity.h"

namespace longtron::testing {

inline parallel::Layout layout_2d(int x, int y, const std::string& overlap = "none", int zero1 = 1) {
  parallel::Layout l;
  l.tensor_2d_x = x;
  l.tensor_2d_y = y;
  l.tensor_2d_overlap = overlap;
  l.zero1_size = zero1;
  return l;
}

/// Step-1 loss and full gradients of a layout (one forward/backward per row of its dp share).
struct StepOne {
  double loss = 0;
  std::vector<float> grads;
};

inline StepOne step_one(const ParityCase& c, const parallel::Layout& l) {
  parallel::Grid grid = parallel::make_grid(world(), l);
  parallel::ParallelEngine engine(c.model, grid, 42, c.P);
  const train::StepResult step = engine_gradients(engine, dp_share(global_rows(c, 0), grid));
  model::Params<float> full(engine.full_layout());
  engine.gather_full(full, engine.grads());
  return {step.loss, std::vector<float>(full.data(), full.data() + full.numel())};
}

/// Max |a − b| over the full step-1 gradients and |loss a − loss b|, printed; both must be <= tol
/// (0 = bit-identical).
inline void compare_layouts(const ParityCase& c, const parallel::Layout& a, const std::string& a_name,
                            const parallel::Layout& b, const std::string& b_name, double tol) {
  const StepOne ra = step_one(c, a), rb = step_one(c, b);
  double diff = 0;
  for (size_t i = 0; i < ra.grads.size(); ++i)
    diff = std::max(diff, double(std::abs(ra.grads[i] - rb.grads[i])));
  const double ldiff = std::abs(ra.loss - rb.loss);
  double both[2] = {diff, ldiff};
  world()->all_reduce(both, 2, comm::ReduceOp::kMax);
  if (world()->rank() == 0)
    std::printf("[tp2d] %s vs %s: step-1 loss |diff| %.3e, gradient max |diff| %.3e\n",
                a_name.c_str(), b_name.c_str(), both[1], both[0]);
  EXPECT_LE(both[0], tol) << a_name << " vs " << b_name;
  EXPECT_LE(both[1], tol) << a_name << " vs " << b_name;
}

}  // namespace longtron::testing
