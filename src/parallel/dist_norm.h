// Distributed normalisation over a hidden dimension split across a group (MindSpeed's RMSNorm2D /
// LayerNorm2D for 2D tensor parallel; MindSpeed
// mindspeed/core/tensor_parallel/tp_2d; with the corrected variance of docs/tp2d.md).
//
// Each rank holds x[N, H_local] = its slice of the hidden features of the same N tokens (under 2D
// TP: N = the rank's sequence shard P/x, H_local = H/y, the group = the y group) and the matching
// weight/bias slice [H_local]. Per-token statistics are local partial sums all-reduced (SUM, in
// double) over the group, so every rank normalises with the statistics of the full hidden vector.
//
// Parameter gradients (dweight, dbias) are this rank's partial sums over its N tokens for its
// H_local features: under 2D TP the ranks of an x group hold different tokens of the same weight
// slice, so the caller SUMS these over x (the engine's plan does: sum_gradient(norm, X)).
//
// Collectives per call (group of size > 1; a group of one calls the single-rank op in ops/):
//   RMSNorm   forward 1 all-reduce of N doubles (Σx²), backward 1 (Σ g·w·x);
//   LayerNorm forward 1 all-reduce of 2N doubles (Σx and Σx² packed; MindSpeed's two all-reduces in
//             one call, same bytes), backward 1 of 2N (Σg and Σg·x̂).
// Every function is collective over `group` and throws Error unless H_local · group.size() == H.
#pragma once
#include <cstdint>

#include "comm/communicator.h"

namespace longtron::parallel {

/// out[N, H_local] = x · rstd ⊙ weight, rstd[N] = 1/sqrt(Σ_group Σ x² / H + eps) (saved).
template <typename T>
void dist_rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N,
                           int64_t H_local, int64_t H, T eps, comm::Communicator& group);

/// dx[N, H_local] = rstd·(g − x̂·Σ_group(g·x̂)/H) with g = dout ⊙ weight, x̂ = x·rstd (overwritten;
/// skipped when nullptr); dweight[H_local] += Σₙ dout ⊙ x̂ (local partial; skipped when nullptr).
template <typename T>
void dist_rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight,
                            const T* rstd, int64_t N, int64_t H_local, int64_t H,
                            comm::Communicator& group);

/// out[N, H_local] = (x − μ)·rstd ⊙ weight (+ bias): with e = Σ_group Σ x and s = Σ_group Σ x²
/// (double), μ = e/H, var = s/H − μ², rstd = 1/sqrt(var + eps). mean[N], rstd[N] saved.
/// The input is never modified (MindSpeed centres its input in place; longtron does not).
template <typename T>
void dist_layer_norm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                             int64_t N, int64_t H_local, int64_t H, T eps,
                             comm::Communicator& group);

/// dx = rstd·(g − Σ_group g/H − x̂·Σ_group(g·x̂)/H) (overwritten); dweight += Σₙ dout ⊙ x̂,
/// dbias += Σₙ dout (local partials). Any gradient pointer may be nullptr.
template <typename T>
void dist_layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x,
                              const T* weight, const T* mean, const T* rstd, int64_t N,
                              int64_t H_local, int64_t H, comm::Communicator& group);

}  // namespace longtron::parallel
