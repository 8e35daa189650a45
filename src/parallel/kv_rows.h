// The packed K/V rows that context-parallel attention moves between ranks (all-gather and ring
// forms, cp_attention.h and cp_ring.h): one row per token, [K | V] of kv = num_kv_heads × head_dim
// floats each, so a token's keys and values travel in one message.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace longtron::parallel {

/// dst ← M rows [k_i | v_i] (2·kv floats each) from K and V rows `stride` floats apart.
inline void interleave_kv(std::vector<float>& dst, const float* k, const float* v, int64_t M,
                          int64_t kv, int64_t stride) {
  dst.resize(static_cast<size_t>(M * 2 * kv));
  for (int64_t i = 0; i < M; ++i) {
    std::copy(k + i * stride, k + i * stride + kv, dst.data() + i * 2 * kv);
    std::copy(v + i * stride, v + i * stride + kv, dst.data() + i * 2 * kv + kv);
  }
}

/// The inverse of interleave_kv: M rows [dk_i | dv_i] of `src` into dk and dv rows `stride` apart.
inline void split_kv(float* dk, float* dv, const float* src, int64_t M, int64_t kv, int64_t stride) {
  for (int64_t i = 0; i < M; ++i) {
    const float* g = src + i * 2 * kv;
    std::copy(g, g + kv, dk + i * stride);
    std::copy(g + kv, g + 2 * kv, dv + i * stride);
  }
}

/// dst row rows[j] += src row j (rows of `width` floats): the gradients of a gathered key buffer
/// summed back into the rows they were gathered from (a row may appear several times).
inline void add_rows(float* dst, const float* src, std::span<const int32_t> rows, int64_t width) {
  for (size_t j = 0; j < rows.size(); ++j) {
    const float* g = src + static_cast<int64_t>(j) * width;
    float* d = dst + int64_t(rows[j]) * width;
    for (int64_t e = 0; e < width; ++e) d[e] += g[e];
  }
}

}  // namespace longtron::parallel
