// Varlen causal attention forward, FlashAttention-2 style (Dao 2023, Algorithm 1) on the CPU.
// One work item = (segment, kv head, query block of 64 tokens). The q_per_kv query heads that
// share the kv head are stacked as the rows of one tile (GQA without copying K/V), so each K/V
// tile is packed once and used by all of them. An item visits only the key blocks holding a key
// visible to one of its queries (from the window's start, or the segment's first key, up to the
// diagonal), so no fully masked tile is computed: the work is ≈ Σ lᵢ²/2 · d per head without a
// window and ≈ Σ lᵢ · W · d with one. Memory per thread is a few tiles.
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
// rows; every later query block of the segment reuses them. O(N_k · Hkv · d) floats.
template <typename T>
void pack_key_block(T* kt_all, const T* k, const AttentionShape& s, const detail::AttnPlan& p,
                    const detail::AttnItem& it) {
  const detail::AttnSegment& g = p.segments[it.seg];
  const int64_t d = s.head_dim;
  const int64_t c0 = it.block * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
  const T* kb = k + (g.k_begin + c0) * s.kv_stride + it.kv_head * d;
  T* kt = kt_all + ((g.k_block0 + it.block) * s.num_kv_heads + it.kv_head) * d * kAttnBlock;
  for (int64_t c = 0; c < bj; ++c)
    for (int64_t x = 0; x < d; ++x) kt[x * bj + c] = kb[c * s.kv_stride + x];
}

// Online-softmax update of one score row whose visible keys are [lo, hi) of the tile's bj (the
// rest are masked, p = 0). Returns the factor exp(m_old − m_new) by which the row's output
// accumulator must be scaled (1 when the row sees nothing here, which leaves m and l as they are).
template <typename T>
T softmax_row_update(T* srow, int64_t bj, int64_t lo, int64_t hi, T scale, T& m, T& l) {
  if (lo >= hi) {
    std::fill(srow, srow + bj, T(0));
    return T(1);
  }
  T row_max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : row_max)
  for (int64_t c = lo; c < hi; ++c) row_max = srow[c] > row_max ? srow[c] : row_max;
  const T m_new = std::max(m, row_max * scale);
  const T alpha = detail::fast_exp(m - m_new);  // m = −inf on the first visible block → 0
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = lo; c < hi; ++c) {
    const T p = detail::fast_exp(srow[c] * scale - m_new);
    srow[c] = p;
    sum += p;
  }
  for (int64_t c = 0; c < lo; ++c) srow[c] = T(0);
  for (int64_t c = hi; c < bj; ++c) srow[c] = T(0);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

template <typename T>
void forward_item(T* out, T* lse, const T* q, const T* kt_all, const T* v,
                  const AttentionShape& s, const detail::AttnPlan& p, const detail::AttnItem& it,
                  ForwardScratch<T>& w) {
  const detail::AttnSegment& g = p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, N = s.num_tokens;
  const int64_t r0 = it.block * kAttnBlock, q0 = g.q_begin + r0;
  const int64_t bi = std::min(kAttnBlock, g.q_len - r0), M = G * bi;
  const T scale = static_cast<T>(s.scale);
  // Pack the query tile: row h·bi + r holds query head g·G + h at token q0 + r.
  for (int64_t h = 0; h < G; ++h)
    for (int64_t r = 0; r < bi; ++r)
      std::memcpy(&w.q[(h * bi + r) * d], q + (q0 + r) * s.q_stride + (it.kv_head * G + h) * d,
                  sizeof(T) * d);
  std::fill(w.o.begin(), w.o.begin() + M * d, T(0));
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<T>::infinity());
  std::fill(w.l.begin(), w.l.end(), T(0));
  for (int64_t j = it.first; j < it.last; ++j) {
    const int64_t c0 = j * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
    const T* kt = kt_all + ((g.k_block0 + j) * s.num_kv_heads + it.kv_head) * d * kAttnBlock;
    detail::tile_gemm<T>(M, bj, d, w.q.data(), d, 1, kt, bj, w.s.data(), bj, false);
    for (int64_t row = 0; row < M; ++row) {
      const int64_t r = r0 + row % bi;
      const int64_t lo = std::clamp<int64_t>(p.key_lo(g, r) - c0, 0, bj);
      const int64_t hi = std::clamp<int64_t>(p.key_hi(g, r) - c0, 0, bj);
      const T alpha = softmax_row_update(&w.s[row * bj], bj, lo, hi, scale, w.m[row], w.l[row]);
      if (alpha != T(1)) {
        T* orow = &w.o[row * d];
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) orow[x] *= alpha;
      }
    }
    detail::tile_gemm<T>(M, d, bj, w.s.data(), bj, 1,
                         v + (g.k_begin + c0) * s.kv_stride + it.kv_head * d, s.kv_stride,
                         w.o.data(), d, true);
  }
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = it.kv_head * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = h * bi + r;
      // A row that saw no key (not possible for valid shapes, kept safe) gives 0 and lse −inf.
      const T inv = w.l[row] > T(0) ? T(1) / w.l[row] : T(0);
      T* orow = out + (q0 + r) * s.num_heads * d + head * d;
      for (int64_t x = 0; x < d; ++x) orow[x] = w.o[row * d + x] * inv;
      lse[head * N + q0 + r] = w.l[row] > T(0) ? w.m[row] + std::log(w.l[row])
                                               : -std::numeric_limits<T>::infinity();
    }
  }
}

}  // namespace

template <typename T>
void varlen_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const AttentionShape& s) {
  const detail::AttnPlan p = detail::plan_attention(s, false);
  const int64_t rows = (s.num_heads / s.num_kv_heads) * kAttnBlock;
  const int64_t n_items = static_cast<int64_t>(p.items.size());
  const int64_t n_keys = static_cast<int64_t>(p.k_side.size());
  T* kt_all = detail::workspace<T>(0, p.k_blocks * s.num_kv_heads * s.head_dim * kAttnBlock);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_keys; ++i) pack_key_block(kt_all, k, s, p, p.k_side[i]);
    ForwardScratch<T> scratch(rows, s.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i)
      forward_item(out, lse, q, kt_all, v, s, p, p.items[i], scratch);
  }
}

template void varlen_attention_forward<float>(float*, float*, const float*, const float*,
                                              const float*, const AttentionShape&);
template void varlen_attention_forward<double>(double*, double*, const double*, const double*,
                                               const double*, const AttentionShape&);

}  // namespace longtron::ops
