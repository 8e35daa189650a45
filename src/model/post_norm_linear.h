// A linear followed by an RMSNorm of its output: Gemma 3's post_attention_layernorm on the
// attention's output projection and post_feedforward_layernorm on the MLP's down projection
// (Transformers' Gemma3DecoderLayer: h = x + post_attention_layernorm(o_proj(attn)), y = h +
// post_feedforward_layernorm(down_proj(…))), as one LinearOp, so that the block that adds the
// linear's output into the residual stream needs no new step and no new saved tensor.
#pragma once
#include <cstdint>
#include <memory>

#include "core/grow_buffer.h"
#include "model/layers.h"

namespace longtron::model {

/// y = norm(linear(x)). forward keeps nothing; backward recomputes linear(x) and the norm's
/// rstd (one more GEMM of the linear's size) before the norm's and the linear's backward. The
/// norm acts on the linear's output as this rank holds it (whole rows: the row-parallel
/// linears of tensor and sequence parallel reduce before it; a layout that splits the features
/// passes a norm that reduces its sum of squares, as 2D's). bf16 output bits are not offered
/// (forward_out16 false): the norm reads the fp32 output.
template <typename T>
class PostNormLinear final : public LinearOp<T> {
 public:
  PostNormLinear(std::unique_ptr<LinearOp<T>> linear, std::unique_ptr<NormOp<T>> norm)
      : linear_(std::move(linear)), norm_(std::move(norm)) {}
  int64_t in() const override { return linear_->in(); }
  int64_t out() const override { return linear_->out(); }
  /// y[N, out] (overwritten).
  void forward(T* y, const T* x, int64_t N, const Params<T>& params) override;
  /// dx[N, in] (overwritten, or added when accumulate_dx), the linear's and the norm's weight
  /// gradients accumulated into grads (skipped when grads is nullptr).
  void backward(T* dx, const T* dy, const T* x, int64_t N, const Params<T>& params,
                Params<T>* grads, bool accumulate_dx) override;
  /// As the wrapped linear: x is read by it alone.
  bool reads_shared_input_bits_only(const ops::ComputeContext& cc) const override {
    return linear_->reads_shared_input_bits_only(cc);
  }

 private:
  std::unique_ptr<LinearOp<T>> linear_;
  std::unique_ptr<NormOp<T>> norm_;
  GrowBuffer<T> z_, dz_, rstd_;  // the linear's output, its gradient, the norm's rstd
};

}  // namespace longtron::model
