// The final logit soft-capping of Gemma 2 and Gemma 3 (Transformers' Gemma3ForCausalLM:
// logits = cap · tanh(logits / cap) when config.json sets final_logit_softcapping) as a
// cross-entropy over the capped logits of each chunk of a chunked head.
#pragma once
#include <cstdint>
#include <memory>

#include "core/grow_buffer.h"
#include "model/layers.h"

namespace longtron::model {

/// ChunkCrossEntropy of the capped logits c = cap · tanh(z / cap) of a chunk's logits z[rows, Vc],
/// by the wrapped cross-entropy `inner` (the whole vocabulary's, or a vocabulary shard's: the cap
/// acts element by element, so a shard caps its own columns). backward gives d/dz: the inner
/// gradient times 1 − (c / cap)². The capped logits are recomputed from z in each call (no state
/// between calls). The fused bf16 forward-backward is not offered (the caller then runs forward,
/// backward and the rounding). Error if cap <= 0.
template <typename T>
class SoftcapCrossEntropy final : public ChunkCrossEntropy<T> {
 public:
  /// `inner` over Vc vocabulary columns; cap: config.json's final_logit_softcapping.
  SoftcapCrossEntropy(ChunkCrossEntropy<T>& inner, int64_t Vc, double cap);
  double forward(T* lse, int64_t* count, const T* logits, const int32_t* labels,
                 int64_t rows) override;
  void token_losses(double* out, const T* logits, const T* lse, const int32_t* labels,
                    int64_t rows) override;
  void backward(T* dlogits, const T* logits, const T* lse, const int32_t* labels, int64_t rows,
                T scale) override;

 private:
  /// The capped logits of rows × Vc logits, in capped_.
  const T* cap_rows(const T* logits, int64_t rows);

  ChunkCrossEntropy<T>& inner_;
  int64_t Vc_;
  T cap_;
  GrowBuffer<T> capped_;
};

}  // namespace longtron::model
