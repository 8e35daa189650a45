// Varlen attention called once per group of whole segments (ops/attention_groups.h).
#include "ops/attention_groups.h"

#include <algorithm>
#include <vector>

namespace longtron::ops {
namespace {

/// Token ranges [begin, end) of the groups: whole segments, at most `limit` queries each unless
/// one segment is longer. One group (the whole shape) when grouping does not apply.
std::vector<int64_t> group_bounds(const AttentionShape& s, int64_t limit) {
  std::vector<int64_t> b{0};
  if (limit <= 0 || s.cu_seqlens_k != nullptr || s.key_offsets != nullptr ||
      s.num_tokens <= limit) {
    b.push_back(s.num_tokens);
    return b;
  }
  for (int64_t i = 1; i <= s.num_segments; ++i) {
    const int64_t end = s.cu_seqlens[i];
    // Close the group before segment i − 1 when adding it would pass the limit.
    const int64_t prev = s.cu_seqlens[i - 1];
    if (end - b.back() > limit && prev > b.back()) b.push_back(prev);
  }
  if (b.back() != s.num_tokens) b.push_back(s.num_tokens);
  return b;
}

/// The shape of tokens [t0, t1) (whole segments of s), with its own cu_seqlens in `cu`.
AttentionShape sub_shape(const AttentionShape& s, int64_t t0, int64_t t1,
                         std::vector<int32_t>& cu) {
  cu.clear();
  for (int64_t i = 0; i <= s.num_segments; ++i) {
    const int64_t c = s.cu_seqlens[i];
    if (c < t0 || c > t1) continue;
    if (!cu.empty() && c == t0 && cu.back() == 0) continue;  // empty segments at the start
    cu.push_back(static_cast<int32_t>(c - t0));
  }
  AttentionShape g = s;
  g.num_tokens = t1 - t0;
  g.cu_seqlens = cu.data();
  g.num_segments = static_cast<int64_t>(cu.size()) - 1;
  return g;
}

}  // namespace

template <typename T>
void varlen_attention_forward_groups(const ComputeContext& cc, T* out, T* lse, const T* q,
                                     const T* k, const T* v,
                                     const AttentionShape& s, int64_t group_tokens) {
  const std::vector<int64_t> b = group_bounds(s, group_tokens);
  if (b.size() == 2) return varlen_attention_forward(cc, out, lse, q, k, v, s);
  std::vector<int32_t> cu;
  std::vector<T> lse_g;
  const int64_t N = s.num_tokens, Hq = s.num_heads, d = s.head_dim;
  for (size_t i = 0; i + 1 < b.size(); ++i) {
    const int64_t t0 = b[i], n = b[i + 1] - t0;
    const AttentionShape g = sub_shape(s, t0, b[i + 1], cu);
    lse_g.resize(static_cast<size_t>(Hq * n));
    varlen_attention_forward(cc, out + t0 * Hq * d, lse_g.data(), q + t0 * s.q_stride,
                             k + t0 * s.kv_stride, v + t0 * s.kv_stride, g);
    for (int64_t h = 0; h < Hq; ++h)
      std::copy(lse_g.begin() + h * n, lse_g.begin() + (h + 1) * n, lse + h * N + t0);
  }
}

template <typename T>
void varlen_attention_backward_groups(const ComputeContext& cc, T* dq, T* dk, T* dv,
                                      const T* dout, const T* q, const T* k,
                                      const T* v, const T* out, const T* lse,
                                      const AttentionShape& s, int64_t group_tokens) {
  const std::vector<int64_t> b = group_bounds(s, group_tokens);
  if (b.size() == 2) return varlen_attention_backward(cc, dq, dk, dv, dout, q, k, v, out, lse, s);
  std::vector<int32_t> cu;
  std::vector<T> lse_g;
  const int64_t N = s.num_tokens, Hq = s.num_heads, d = s.head_dim;
  for (size_t i = 0; i + 1 < b.size(); ++i) {
    const int64_t t0 = b[i], n = b[i + 1] - t0;
    const AttentionShape g = sub_shape(s, t0, b[i + 1], cu);
    lse_g.resize(static_cast<size_t>(Hq * n));
    for (int64_t h = 0; h < Hq; ++h)
      std::copy(lse + h * N + t0, lse + h * N + t0 + n, lse_g.begin() + h * n);
    const int64_t qo = t0 * s.q_stride, ko = t0 * s.kv_stride, oo = t0 * Hq * d;
    varlen_attention_backward(cc, dq + qo, dk + ko, dv + ko, dout + oo, q + qo, k + ko, v + ko,
                              out + oo, lse_g.data(), g);
  }
}

#define LONGTRON_INSTANTIATE(T)                                                               \
  template void varlen_attention_forward_groups<T>(const ComputeContext&, T*, T*, const T*,    \
                                                   const T*, const T*, const AttentionShape&,  \
                                                   int64_t);                                   \
  template void varlen_attention_backward_groups<T>(const ComputeContext&, T*, T*, T*,         \
                                                    const T*, const T*, const T*, const T*,    \
                                                    const T*, const T*, const AttentionShape&, \
                                                    int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
