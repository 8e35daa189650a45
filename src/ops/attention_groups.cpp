// Varlen attention called once per group of whole segments (ops/attention_groups.h).
#include "ops/attention_groups.h"

#include <algorithm>
#include <vector>

#include "ops/attention_bf16.h"

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

/// Segment indexes [b[j], b[j + 1]) of the groups of a shape with key segments: whole segments,
/// at most `limit` queries each unless one segment is longer.
std::vector<int64_t> key_group_bounds(const AttentionShape& s, int64_t limit) {
  std::vector<int64_t> b{0};
  for (int64_t i = 1; i <= s.num_segments; ++i) {
    const int64_t start = s.cu_seqlens[b.back()];
    if (s.cu_seqlens[i] - start > limit && s.cu_seqlens[i - 1] > start) b.push_back(i - 1);
  }
  b.push_back(s.num_segments);
  return b;
}

/// The group of segments [i0, i1) of a shape with key segments; its rebased offsets in cu, cu_k.
AttentionGroup key_group(const AttentionShape& s, int64_t i0, int64_t i1,
                         std::vector<int32_t>& cu, std::vector<int32_t>& cu_k) {
  AttentionGroup g{s.cu_seqlens[i0], s.cu_seqlens[i1] - s.cu_seqlens[i0], s.cu_seqlens_k[i0], s};
  cu.clear(), cu_k.clear();
  for (int64_t i = i0; i <= i1; ++i) {
    cu.push_back(static_cast<int32_t>(s.cu_seqlens[i] - g.t0));
    cu_k.push_back(static_cast<int32_t>(s.cu_seqlens_k[i] - g.k0));
  }
  g.shape.num_tokens = g.n;
  g.shape.cu_seqlens = cu.data();
  g.shape.num_segments = i1 - i0;
  g.shape.cu_seqlens_k = cu_k.data();
  g.shape.num_kv_tokens = cu_k.back();
  if (s.key_offsets != nullptr) g.shape.key_offsets = s.key_offsets + i0;
  return g;
}

/// Calls f(t0, t1, shape) for each group [t0, t1) of `s`, in order (the whole shape itself when
/// it is one group).
template <typename F>
void for_each_group(const AttentionShape& s, int64_t group_tokens, F&& f) {
  const std::vector<int64_t> b = group_bounds(s, group_tokens);
  if (b.size() == 2) return f(int64_t{0}, s.num_tokens, s);
  std::vector<int32_t> cu;
  for (size_t i = 0; i + 1 < b.size(); ++i) f(b[i], b[i + 1], sub_shape(s, b[i], b[i + 1], cu));
}

/// for_each_group, giving f(t0, n, shape, out_g) a float buffer for the group's attention output
/// [n, Hq·d], for the bf16-output forms to round from or widen into.
template <typename F>
void for_each_group_out(const AttentionShape& s, int64_t group_tokens, F&& f) {
  std::vector<float> out_g;
  for_each_group(s, group_tokens, [&](int64_t t0, int64_t t1, const AttentionShape& g) {
    out_g.resize(static_cast<size_t>((t1 - t0) * s.num_heads * s.head_dim));
    f(t0, t1 - t0, g, out_g.data());
  });
}

}  // namespace

void for_each_attention_group(const AttentionShape& s, int64_t group_tokens,
                              const std::function<void(const AttentionGroup&)>& f) {
  if (s.cu_seqlens_k == nullptr || group_tokens <= 0 || s.num_tokens <= group_tokens) {
    if (s.cu_seqlens_k != nullptr) return f(AttentionGroup{0, s.num_tokens, 0, s});
    return for_each_group(s, group_tokens, [&](int64_t t0, int64_t t1, const AttentionShape& g) {
      f(AttentionGroup{t0, t1 - t0, t0, g});
    });
  }
  const std::vector<int64_t> b = key_group_bounds(s, group_tokens);
  std::vector<int32_t> cu, cu_k;
  for (size_t j = 0; j + 1 < b.size(); ++j) f(key_group(s, b[j], b[j + 1], cu, cu_k));
}

template <typename T>
void varlen_attention_forward_groups(const ComputeContext& cc, T* out, T* lse, const T* q,
                                     const T* k, const T* v,
                                     const AttentionShape& s, int64_t group_tokens) {
  GroupLse<T> lg(s);
  const int64_t Hq = s.num_heads, d = s.head_dim;
  for_each_group(s, group_tokens, [&](int64_t t0, int64_t t1, const AttentionShape& g) {
    const int64_t n = t1 - t0;
    varlen_attention_forward(cc, out + t0 * Hq * d, lg.out(lse, n), q + t0 * s.q_stride,
                             k + t0 * s.kv_stride, v + t0 * s.kv_stride, g);
    lg.store(lse, t0, n);
  });
}

template <typename T>
void varlen_attention_backward_groups(const ComputeContext& cc, T* dq, T* dk, T* dv,
                                      const T* dout, const T* q, const T* k,
                                      const T* v, const T* out, const T* lse,
                                      const AttentionShape& s, int64_t group_tokens) {
  GroupLse<T> lg(s);
  const int64_t Hq = s.num_heads, d = s.head_dim;
  for_each_group(s, group_tokens, [&](int64_t t0, int64_t t1, const AttentionShape& g) {
    const int64_t n = t1 - t0;
    const int64_t qo = t0 * s.q_stride, ko = t0 * s.kv_stride, oo = t0 * Hq * d;
    varlen_attention_backward(cc, dq + qo, dk + ko, dv + ko, dout + oo, q + qo, k + ko, v + ko,
                              out + oo, lg.in(lse, t0, n), g);
  });
}

void varlen_attention_forward_groups_bf16_out(const ComputeContext& cc, uint16_t* out16,
                                              float* lse, const float* q,
                                              const float* k, const float* v,
                                              const AttentionShape& s, int64_t group_tokens) {
  GroupLse<float> lg(s);
  const int64_t od = s.num_heads * s.head_dim;  // output features
  if (attention_bf16_runs(cc)) {  // the bf16 kernel stores the rounded rows itself
    for_each_group(s, group_tokens, [&](int64_t t0, int64_t t1, const AttentionShape& g) {
      detail::varlen_attention_forward_bf16_out16(out16 + t0 * od, lg.out(lse, t1 - t0),
                                                  q + t0 * s.q_stride, k + t0 * s.kv_stride,
                                                  v + t0 * s.kv_stride, g);
      lg.store(lse, t0, t1 - t0);
    });
    return;
  }
  for_each_group_out(s, group_tokens, [&](int64_t t0, int64_t n, const AttentionShape& g,
                                          float* out_g) {
    varlen_attention_forward(cc, out_g, lg.out(lse, n), q + t0 * s.q_stride,
                             k + t0 * s.kv_stride, v + t0 * s.kv_stride, g);
    lg.store(lse, t0, n);
    round_to_bf16(out_g, n * od, out16 + t0 * od);
  });
}

void varlen_attention_backward_groups_bf16_out(const ComputeContext& cc, float* dq, float* dk,
                                               float* dv, const float* dout,
                                               const float* q, const float* k, const float* v,
                                               const uint16_t* out16, const float* lse,
                                               const AttentionShape& s, int64_t group_tokens) {
  GroupLse<float> lg(s);
  const int64_t od = s.num_heads * s.head_dim;  // output features
  if (attention_bf16_runs(cc)) {  // the bf16 kernel reads the rows' bits itself
    for_each_group(s, group_tokens, [&](int64_t t0, int64_t t1, const AttentionShape& g) {
      const int64_t qo = t0 * s.q_stride, ko = t0 * s.kv_stride;
      detail::varlen_attention_backward_bf16_out16(dq + qo, dk + ko, dv + ko, dout + t0 * od,
                                                   q + qo, k + ko, v + ko, out16 + t0 * od,
                                                   lg.in(lse, t0, t1 - t0), g);
    });
    return;
  }
  for_each_group_out(s, group_tokens, [&](int64_t t0, int64_t n, const AttentionShape& g,
                                          float* out_g) {
    widen_bf16(out16 + t0 * od, n * od, out_g);
    const int64_t qo = t0 * s.q_stride, ko = t0 * s.kv_stride;
    varlen_attention_backward(cc, dq + qo, dk + ko, dv + ko, dout + t0 * od, q + qo, k + ko,
                              v + ko, out_g, lg.in(lse, t0, n), g);
  });
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
