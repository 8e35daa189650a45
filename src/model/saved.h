// The dtype policy of the decoder's one block path: how a tensor is saved for backward and read
// back. Under float32 a saved tensor is the buffer its op wrote; under mixed precision (a
// bfloat16 compute type) it is rounded into a bf16 slot and widened back where read, as
// torch.autocast keeps its bf16 linears' outputs. llm.c's single forward over one activation
// table is the model: the block's code is the same, only these helpers look at the dtype.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "ops/compute_context.h"
#include "ops/ops.h"

namespace longtron::model {

/// One tensor saved for backward: kept as computed in `f` (float layout), or rounded to bf16
/// in `b` (bf16 layout, a float model only). Exactly one is set once the workspace is bound.
template <typename T>
struct Saved {
  T* f = nullptr;
  uint16_t* b = nullptr;

  /// Where the op producing the tensor writes it: its own buffer, or (bf16) `stage`, a
  /// temporary that save() then rounds from.
  T* out(T* stage) const { return f ? f : stage; }

  /// Keeps v (written at out()) for backward, n elements: nothing for `f`, rounded into `b`.
  void save(const T* v, int64_t n) const {
    if (f) return;
    if constexpr (std::is_same_v<T, float>) ops::round_to_bf16(v, n, b);
    else (void)v, (void)n, check(false, "internal: a bf16 save in a double model");
  }

  /// save(v, n), then load(n, wide), in one pass over v.
  const T* save_load(const T* v, int64_t n, T* wide) const {
    if (f) return f;
    if constexpr (std::is_same_v<T, float>) ops::round_to_bf16_widened(v, n, b, wide);
    else (void)v, (void)n, check(false, "internal: a bf16 save in a double model");
    return wide;
  }

  /// The saved values as T, n elements: `f` itself, or `b` widened into `wide` (returned).
  const T* load(int64_t n, T* wide) const {
    if (f) return f;
    if constexpr (std::is_same_v<T, float>) ops::widen_bf16(b, n, wide);
    else (void)n, check(false, "internal: a bf16 load in a double model");
    return wide;
  }
};

/// Shares the bits of a tensor saved in bf16 with the GEMMs that read v (the values it was saved
/// from, or their widening) while the result lives, so they do not round v again (the same
/// bits). Shares nothing for a tensor kept as computed.
template <typename T>
ops::SharedRoundings::Sharing share_saved(const ops::ComputeContext& cc, const Saved<T>& s,
                                           const T* v, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (s.b != nullptr) return cc.shared().share(v, n, s.b);
  }
  (void)cc, (void)s, (void)v, (void)n;
  return {};
}

/// v ← v rounded to bf16, its bits kept in b (n elements): a value read by later ops exactly as
/// it is stored. A float model only.
template <typename T>
void keep_rounded(T* v, int64_t n, uint16_t* b) {
  if constexpr (std::is_same_v<T, float>) {
    ops::round_to_bf16_widened(v, n, b, v);
  } else {
    (void)v, (void)n, (void)b;
    check(false, "internal: bf16 rounding in a double model");
  }
}

/// g = silu(a) ⊙ b over the FFN's a and b as saved (the bf16 kernel reads the bf16 bits). With
/// g16, a and b saved in bf16 also write g's bits there (and g = nullptr writes only them):
/// returns whether they were written.
template <typename T>
bool swiglu_saved(T* g, const Saved<T>& a, const Saved<T>& b, int64_t n, uint16_t* g16 = nullptr) {
  if (a.f) return ops::swiglu_forward(g, a.f, b.f, n), false;
  if constexpr (std::is_same_v<T, float>) ops::swiglu_forward_bf16(g, a.b, b.b, n, g16);
  else check(false, "internal: a bf16 SwiGLU in a double model");
  return g16 != nullptr;
}

/// a.save(va, n), b.save(vb, n), then swiglu_saved(g, a, b, n, g16), in one pass over va and vb
/// where a and b are saved in bf16. Returns whether g16 was written.
template <typename T>
bool swiglu_saving(T* g, const T* va, const T* vb, const Saved<T>& a, const Saved<T>& b,
                   int64_t n, uint16_t* g16 = nullptr) {
  if (a.f) {  // kept as computed: nothing to save
    check(va == a.f && vb == b.f, "internal: SwiGLU's inputs are not the kept a and b");
    return swiglu_saved(g, a, b, n, g16);
  }
  if constexpr (std::is_same_v<T, float>)
    ops::swiglu_forward_saving_bf16(g, va, vb, a.b, b.b, n, g16);
  else check(false, "internal: a bf16 SwiGLU in a double model");
  return g16 != nullptr;
}

/// da, db (overwritten) from dg over a and b as saved; db may alias dg (both kernels write db[i]
/// last). With `into_saves`, a and b saved in bf16 are overwritten by the bits of da and db
/// (their last reader: the saves are spent): returns whether they were.
template <typename T>
bool swiglu_backward_saved(T* da, T* db, const T* dg, const Saved<T>& a, const Saved<T>& b,
                           int64_t n, bool into_saves = false) {
  if (a.f) return ops::swiglu_backward(da, db, dg, a.f, b.f, n), false;
  if constexpr (std::is_same_v<T, float>)
    ops::swiglu_backward_bf16(da, db, dg, a.b, b.b, n, into_saves ? a.b : nullptr,
                              into_saves ? b.b : nullptr);
  else check(false, "internal: a bf16 SwiGLU in a double model");
  return into_saves;
}

}  // namespace longtron::model
