// LayerNorm (Ba, Kiros & Hinton 2016) with explicit forward and backward, for models that use it
// and as the single-rank reference of the distributed LayerNorm (parallel/dist_norm.h;
// docs/tp2d.md). Same conventions as ops.h: (outputs, saved state, inputs, weights, sizes), input
// gradients overwritten, parameter gradients accumulated, nullptr skips a gradient.
#pragma once
#include <cstdint>

namespace longtron::ops {

/// out[N,H] = (x − μ)·rstd ⊙ weight[H] (+ bias[H] when bias != nullptr), per token:
/// μ = Σx/H, var = Σx²/H − μ² (sums accumulated in double, as docs/tp2d.md asks of the distributed
/// form), rstd = 1/sqrt(var + eps). mean[N] and rstd[N] are saved for backward.
template <typename T>
void layer_norm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                        int64_t N, int64_t H, T eps);

/// With x̂ = (x − μ)·rstd and g = dout ⊙ weight:
/// dx = rstd·(g − mean(g) − x̂·mean(g ⊙ x̂)) (overwritten); dweight += Σₙ dout ⊙ x̂;
/// dbias += Σₙ dout. Any gradient pointer may be nullptr.
template <typename T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                         const T* mean, const T* rstd, int64_t N, int64_t H);

/// The parameter gradients of a norm over x[N,H] with saved mean[N] and rstd[N]:
/// dweight[H] += Σₙ dout ⊙ (x − μ)·rstd, dbias[H] += Σₙ dout (either may be nullptr).
/// mean == nullptr means μ = 0 (RMSNorm). Sums in double; threads own blocks of features.
/// Shared by layer_norm_backward and the distributed norms (parallel/dist_norm.h).
template <typename T>
void norm_param_grads(T* dweight, T* dbias, const T* dout, const T* x, const T* mean,
                      const T* rstd, int64_t N, int64_t H);

}  // namespace longtron::ops
