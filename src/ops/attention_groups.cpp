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

/// The lse of one group [t0, t0 + n) of a row whose lse is head-major [Hq, N]: the row's own
/// when the group is the whole row, else a [Hq, n] buffer that is copied from the row before a
/// backward reads it (in) or into the row after a forward wrote it (out, then store).
template <typename T>
class GroupLse {
 public:
  explicit GroupLse(const AttentionShape& s) : Hq_(s.num_heads), N_(s.num_tokens) {}
  /// Where a forward writes the group's lse; store() then puts it in the row.
  T* out(T* row, int64_t n) { return n == N_ ? row : sized(n); }
  void store(T* row, int64_t t0, int64_t n) const {
    if (n == N_) return;
    for (int64_t h = 0; h < Hq_; ++h)
      std::copy(buf_.data() + h * n, buf_.data() + (h + 1) * n, row + h * N_ + t0);
  }
  /// The group's lse as a backward reads it.
  const T* in(const T* row, int64_t t0, int64_t n) {
    if (n == N_) return row;
    T* const g = sized(n);
    for (int64_t h = 0; h < Hq_; ++h)
      std::copy(row + h * N_ + t0, row + h * N_ + t0 + n, g + h * n);
    return g;
  }

 private:
  T* sized(int64_t n) {
    buf_.resize(static_cast<size_t>(Hq_ * n));
    return buf_.data();
  }
  int64_t Hq_, N_;
  std::vector<T> buf_;
};

}  // namespace

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
