// Varlen causal attention forward, FlashAttention-2 style (Dao 2023, Algorithm 1) on the CPU.
// One work item = (segment, kv head, query block of 64 tokens). The q_per_kv query heads that
// share the kv head are stacked as the rows of one tile (GQA without copying K/V), so each K/V
// tile is packed once and used by all of them. Key blocks run from the first of the segment up to
// the diagonal block; blocks past the diagonal and other segments are never visited, so no
// masked tile is computed and the work is Σ lᵢ²/2 · d per head. Memory per thread is a few tiles.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/attention_plan.h"
#include "ops/fast_math.h"
#include "ops/ops.h"
#include "ops/tile_gemm.h"

namespace longtron::ops {
namespace {

using detail::kAttnBlock;

template <typename T>
struct ForwardScratch {
  std::vector<T> q, s, o, m, l;
  ForwardScratch(int64_t rows, int64_t d)
      : q(rows * d), s(rows * kAttnBlock), o(rows * d), m(rows), l(rows) {}
};

// Kᵀ tiles [d, bj] of every (key block, kv head), packed once per call so the score GEMM reads
// rows; every later query block of the segment reuses them. O(N · Hkv · d) floats.
template <typename T>
void pack_key_block(T* kt_all, const T* k, const AttentionShape& s, const detail::AttnItem& it) {
  const int64_t d = s.head_dim;
  const int64_t k0 = it.seg_begin + it.block * kAttnBlock;
  const int64_t bj = std::min(kAttnBlock, it.seg_end - k0);
  const T* kb = k + k0 * s.kv_stride + it.kv_head * d;
  T* kt = kt_all + (it.block_id * s.num_kv_heads + it.kv_head) * d * kAttnBlock;
  for (int64_t c = 0; c < bj; ++c)
    for (int64_t x = 0; x < d; ++x) kt[x * bj + c] = kb[c * s.kv_stride + x];
}

// Online-softmax update of one score row of `valid` visible keys (the rest are masked, p = 0).
// Returns the factor exp(m_old − m_new) by which the row's output accumulator must be scaled.
template <typename T>
T softmax_row_update(T* srow, int64_t bj, int64_t valid, T scale, T& m, T& l) {
  T row_max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : row_max)
  for (int64_t c = 0; c < valid; ++c) row_max = srow[c] > row_max ? srow[c] : row_max;
  const T m_new = std::max(m, row_max * scale);
  const T alpha = detail::fast_exp(m - m_new);  // m = −inf on the first block → 0
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < valid; ++c) {
    const T p = detail::fast_exp(srow[c] * scale - m_new);
    srow[c] = p;
    sum += p;
  }
  for (int64_t c = valid; c < bj; ++c) srow[c] = T(0);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

template <typename T>
void forward_item(T* out, T* lse, const T* q, const T* kt_all, const T* v,
                  const AttentionShape& s, const detail::AttnItem& it, ForwardScratch<T>& w) {
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, N = s.num_tokens;
  const int64_t q0 = it.seg_begin + it.block * kAttnBlock;
  const int64_t bi = std::min(kAttnBlock, it.seg_end - q0), M = G * bi;
  const T scale = static_cast<T>(s.scale);
  // Pack the query tile: row h·bi + r holds query head g·G + h at token q0 + r.
  for (int64_t h = 0; h < G; ++h)
    for (int64_t r = 0; r < bi; ++r)
      std::memcpy(&w.q[(h * bi + r) * d], q + (q0 + r) * s.q_stride + (it.kv_head * G + h) * d,
                  sizeof(T) * d);
  std::fill(w.o.begin(), w.o.begin() + M * d, T(0));
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<T>::infinity());
  std::fill(w.l.begin(), w.l.end(), T(0));
  for (int64_t j = 0; j <= it.block; ++j) {
    const int64_t k0 = it.seg_begin + j * kAttnBlock;
    const int64_t bj = std::min(kAttnBlock, it.seg_end - k0);
    const T* kt =
        kt_all + ((it.block_id - it.block + j) * s.num_kv_heads + it.kv_head) * d * kAttnBlock;
    detail::tile_gemm<T>(M, bj, d, w.q.data(), d, 1, kt, bj, w.s.data(), bj, false);
    for (int64_t row = 0; row < M; ++row) {
      const int64_t r = row % bi;
      const int64_t valid = j < it.block ? bj : std::min(bj, q0 + r - k0 + 1);
      const T alpha = softmax_row_update(&w.s[row * bj], bj, valid, scale, w.m[row], w.l[row]);
      if (alpha != T(1)) {
        T* orow = &w.o[row * d];
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) orow[x] *= alpha;
      }
    }
    detail::tile_gemm<T>(M, d, bj, w.s.data(), bj, 1, v + k0 * s.kv_stride + it.kv_head * d,
                         s.kv_stride, w.o.data(), d, true);
  }
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = it.kv_head * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = h * bi + r;
      const T inv = T(1) / w.l[row];
      T* orow = out + (q0 + r) * s.num_heads * d + head * d;
      for (int64_t x = 0; x < d; ++x) orow[x] = w.o[row * d + x] * inv;
      lse[head * N + q0 + r] = w.m[row] + std::log(w.l[row]);
    }
  }
}

}  // namespace

template <typename T>
void varlen_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const AttentionShape& s) {
  detail::validate_attention_shape(s);
  int64_t total_blocks = 0;
  const std::vector<detail::AttnItem> items = detail::attention_items(s, false, &total_blocks);
  const int64_t rows = (s.num_heads / s.num_kv_heads) * kAttnBlock;
  const int64_t n_items = static_cast<int64_t>(items.size());
  T* kt_all = detail::workspace<T>(0, total_blocks * s.num_kv_heads * s.head_dim * kAttnBlock);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_items; ++i) pack_key_block(kt_all, k, s, items[i]);
    ForwardScratch<T> scratch(rows, s.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i)
      forward_item(out, lse, q, kt_all, v, s, items[i], scratch);
  }
}

template void varlen_attention_forward<float>(float*, float*, const float*, const float*,
                                              const float*, const AttentionShape&);
template void varlen_attention_forward<double>(double*, double*, const double*, const double*,
                                               const double*, const AttentionShape&);

}  // namespace longtron::ops
