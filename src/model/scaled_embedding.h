// A token embedding times a constant: Gemma 3's Gemma3TextScaledWordEmbedding (Transformers'
// modeling_gemma3.py), table[ids] · embed_scale with embed_scale = √hidden_size cast to the
// weights' dtype.
#pragma once
#include <cstdint>
#include <memory>

#include "core/grow_buffer.h"
#include "model/layers.h"

namespace longtron::model {

/// x = inner(ids) · scale; backward hands scale · dx to the inner embedding's backward. `scale`
/// as the caller rounds it: for Gemma 3, static_cast<float>(√hidden_size) (Transformers multiplies
/// by embed_scale.to(weight.dtype), float32 weights here), also in a double model.
template <typename T>
class ScaledEmbedding final : public EmbeddingOp<T> {
 public:
  ScaledEmbedding(std::unique_ptr<EmbeddingOp<T>> inner, int64_t H, double scale)
      : inner_(std::move(inner)), H_(H), scale_(static_cast<T>(scale)) {}
  /// x[N, H] (overwritten).
  void forward(T* x, const int32_t* ids, int64_t N, const Params<T>& params) override;
  /// dtable[ids] += scale · dx (skipped when grads is nullptr).
  void backward(const T* dx, const int32_t* ids, int64_t N, Params<T>* grads) override;

 private:
  std::unique_ptr<EmbeddingOp<T>> inner_;
  int64_t H_;
  T scale_;
  GrowBuffer<T> dx_;  // scale · dx
};

}  // namespace longtron::model
