// AdamW over flat float buffers: the fused update, its exact finiteness check and the bound
// that usually makes the check unnecessary (ops.h includes this header).
#pragma once
#include <cstdint>
#include <span>

namespace longtron::ops {

/// The hyper-parameters of one AdamW update; step is 1-based (bias correction). The update
/// reads each gradient as grad[i] · grad_scale (the float product: a global-norm clip's factor,
/// applied as it is read instead of in a pass of its own over the gradients; 1 reads it as is).
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  float grad_scale = 1.0f;
};
/// Elements [begin, end) of the buffers an update walks, with (decay) or without weight decay.
struct AdamWRange {
  int64_t begin, end;
  bool decay;
};
/// What an update wrote: the largest |m| and v, the smallest v, and whether every parameter and
/// moment it wrote is finite (the input of adamw_bounds_imply_finite for the next update).
struct AdamWStats {
  float max_abs_m = 0, max_v = 0, min_v = 0;
  bool finite = true;
};

/// One AdamW update (Loshchilov & Hutter 2019, PyTorch's formulation) of the elements of `ranges`
/// with decoupled weight decay (args.weight_decay on the ranges marked decay, none on the others),
/// in one vectorised pass under one parallel region: m, v and param updated in place; when param16
/// is not nullptr, param16[i] receives the bf16 rounding of the new param[i] (float_to_bf16,
/// core/bf16.h) in the same pass: the refresh of a bf16 weight copy without reading the weights
/// again (ops/compute_context.h). Returns the bounds of what it wrote. Elementwise, so the result
/// does not depend on the number of threads. Throws Error when args.step < 1.
AdamWStats adamw_update(float* param, float* m, float* v, const float* grad,
                        std::span<const AdamWRange> ranges, const AdamWArgs& args,
                        uint16_t* param16 = nullptr);
/// adamw_update over one range [0, n) with weight decay.
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  uint16_t* param16 = nullptr);
/// Whether adamw_update with the same arguments would leave every parameter and moment finite.
/// Reads only (the same arithmetic, nothing stored): a step that would make the model non-finite
/// is refused before anything changes.
bool adamw_update_is_finite(const float* param, const float* m, const float* v, const float* grad,
                            std::span<const AdamWRange> ranges, const AdamWArgs& args);
bool adamw_update_is_finite(const float* param, const float* m, const float* v, const float* grad,
                            int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step);
/// A sufficient condition for adamw_update_is_finite without reading the buffers: true when the
/// state `last` (what the previous update wrote, and nothing else wrote since) and gradients of
/// magnitude at most grad_max_abs as read (after grad_scale; e.g. their clipped L2 norm) cannot
/// produce a non-finite value under `args` — every intermediate stays far below FLT_MAX and the
/// step below half an ulp of FLT_MAX.
/// False means "not proven": the caller checks exactly. Never true when the exact check is false
/// for such a state (tests/ops/adamw_test.cpp).
bool adamw_bounds_imply_finite(const AdamWStats& last, double grad_max_abs, const AdamWArgs& args);

}  // namespace longtron::ops
