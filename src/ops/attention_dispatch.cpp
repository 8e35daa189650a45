// The public varlen attention entry points (ops/ops.h): bf16 attention where the compute context
// asks for it and it runs here, else the fp32/double kernels of the instruction set this CPU and
// LONGTRON_CPU_FEATURES_MASK allow (ops/attention_kernels.h).
#include <type_traits>

#include "ops/attention_add_dq.h"
#include "ops/attention_bf16.h"
#include "ops/attention_kernels.h"
#include "ops/compute_context.h"
#include "ops/cpu_features.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {
bool avx512() { return kernel_isa() == KernelIsa::kAvx512; }

template <typename T>
void backward(const ComputeContext& cc, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
              const T* v, const T* out, const T* lse, const AttentionShape& s, bool add_dq) {
  if constexpr (std::is_same_v<T, float>) {
    if (attention_bf16_runs(cc)) {
      detail::varlen_attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, add_dq);
      return;
    }
  }
  (avx512() ? detail::avx512::attention_backward<T> : detail::avx2::attention_backward<T>)(
      dq, dk, dv, dout, q, k, v, out, lse, s, add_dq);
}
}  // namespace

bool attention_bf16_runs(const ComputeContext& cc) { return cc.bf16() && attention_bf16_runs(); }

template <typename T>
void varlen_attention_forward(const ComputeContext& cc, T* out, T* lse, const T* q, const T* k,
                              const T* v, const AttentionShape& s) {
  if constexpr (std::is_same_v<T, float>) {
    if (attention_bf16_runs(cc)) {
      detail::varlen_attention_forward_bf16(out, lse, q, k, v, s);
      return;
    }
  }
  (avx512() ? detail::avx512::attention_forward<T> : detail::avx2::attention_forward<T>)(
      out, lse, q, k, v, s);
}

template <typename T>
void varlen_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const AttentionShape& s) {
  varlen_attention_forward(ComputeContext::fp32(), out, lse, q, k, v, s);
}

template <typename T>
void varlen_attention_backward(const ComputeContext& cc, T* dq, T* dk, T* dv, const T* dout,
                               const T* q, const T* k, const T* v, const T* out, const T* lse,
                               const AttentionShape& s) {
  backward(cc, dq, dk, dv, dout, q, k, v, out, lse, s, false);
}

template <typename T>
void varlen_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                               const T* v, const T* out, const T* lse, const AttentionShape& s) {
  backward(ComputeContext::fp32(), dq, dk, dv, dout, q, k, v, out, lse, s, false);
}

template <typename T>
void varlen_attention_backward_add_dq(const ComputeContext& cc, T* dq, T* dk, T* dv,
                                      const T* dout, const T* q, const T* k, const T* v,
                                      const T* out, const T* lse, const AttentionShape& s) {
  backward(cc, dq, dk, dv, dout, q, k, v, out, lse, s, true);
}

#define LONGTRON_INSTANTIATE(T)                                                                 \
  template void varlen_attention_forward<T>(const ComputeContext&, T*, T*, const T*, const T*,  \
                                            const T*, const AttentionShape&);                  \
  template void varlen_attention_forward<T>(T*, T*, const T*, const T*, const T*,              \
                                            const AttentionShape&);                            \
  template void varlen_attention_backward<T>(const ComputeContext&, T*, T*, T*, const T*,       \
                                             const T*, const T*, const T*, const T*, const T*,  \
                                             const AttentionShape&);                            \
  template void varlen_attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, \
                                             const T*, const T*, const AttentionShape&);        \
  template void varlen_attention_backward_add_dq<T>(const ComputeContext&, T*, T*, T*,          \
                                                    const T*, const T*, const T*, const T*,     \
                                                    const T*, const T*, const AttentionShape&);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
