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
#include <type_traits>
#include <vector>

#include "ops/attention_bf16.h"
#include "ops/attention_f32_blocks.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/fast_math.h"
#include "ops/ops.h"
#include "ops/compute_context.h"
#include "ops/tile_gemm.h"

namespace longtron::ops {
namespace {

using detail::kAttnBlock;

// Per-thread tiles of one item, kept in the thread's workspace between calls.
template <typename T>
struct ForwardScratch {
  detail::ScratchTile<T> q, s, o, m, l, alpha, sum;
  std::vector<detail::RowGroup> groups;  // ≤ 4 per query head (64 keys = 4 × 16)
  ForwardScratch(int64_t rows, int64_t d) : groups(4 * (rows / kAttnBlock)) {
    const auto t = detail::scratch_tiles<T, 7>(
        {rows * d, rows * kAttnBlock, rows * d, rows, rows, rows, rows});
    q = t[0], s = t[1], o = t[2], m = t[3], l = t[4], alpha = t[5], sum = t[6];
  }
};

// Kᵀ tiles [d, bj] and V tiles [bj, d] of every (key block, kv head), packed once per call so
// the score GEMM reads rows and the PV GEMM reads contiguous rows (a strided V, rows a packed qkv
// row apart, costs the PV product ~25%); every later query block of the segment reuses them.
// 2 · O(N_k · Hkv · d) values.
template <typename T>
void pack_key_block(T* kt_all, T* v_all, const T* k, const T* v, const AttentionShape& s,
                    const detail::AttnPlan& p, const detail::AttnItem& it) {
  const detail::AttnSegment& g = p.segments[it.seg];
  const int64_t d = s.head_dim;
  const int64_t c0 = it.block * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
  const T* kb = k + (g.k_begin + c0) * s.kv_stride + it.kv_head * d;
  const int64_t index = (g.k_block0 + it.block) * s.num_kv_heads + it.kv_head;
  T* kt = kt_all + index * d * kAttnBlock;
  for (int64_t c = 0; c < bj; ++c)
    for (int64_t x = 0; x < d; ++x) kt[x * bj + c] = kb[c * s.kv_stride + x];
  const T* vb = v + (g.k_begin + c0) * s.kv_stride + it.kv_head * d;
  T* vt = v_all + index * d * kAttnBlock;
  for (int64_t c = 0; c < bj; ++c) std::memcpy(vt + c * d, vb + c * s.kv_stride, sizeof(T) * d);
}

#if defined(__AVX512F__)
// forward_item for float with head_dim a multiple of 16 on AVX-512 register blocks
// (attention_f32_blocks.h): S never stored, the softmax on the S blocks in registers, the
// rescale of O folded into the PV product's store.
void forward_item_f32(float* out, float* lse, const float* q, const float* kt_all,
                      const float* v_all, const AttentionShape& s, const detail::AttnPlan& p,
                      const detail::AttnItem& it, ForwardScratch<float>& w) {
  const detail::AttnSegment& g = p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, N = s.num_tokens;
  const int64_t r0 = it.block * kAttnBlock, q0 = g.q_begin + r0;
  const int64_t bi = std::min(kAttnBlock, g.q_len - r0), M = G * bi;
  const float scale2 = static_cast<float>(s.scale) * detail::kF32Log2e;
  std::vector<detail::RowGroup>& groups = w.groups;
  for (int64_t h = 0; h < G; ++h)
    for (int64_t r = 0; r < bi; ++r)
      std::memcpy(&w.q[(h * bi + r) * d], q + (q0 + r) * s.q_stride + (it.kv_head * G + h) * d,
                  sizeof(float) * d);
  if (it.first == it.last) std::fill(w.o.begin(), w.o.begin() + M * d, 0.0f);
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.end(), 0.0f);
  detail::RescaleAdd rescale{w.o.data(), d, w.alpha.data(), true};
  for (int64_t j = it.first; j < it.last; ++j) {
    const int64_t c0 = j * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
    const int64_t index = (g.k_block0 + j) * s.num_kv_heads + it.kv_head;
    const float* kt = kt_all + index * d * kAttnBlock;  // [d, bj]: rows readable to 64 columns
    const float* vt = v_all + index * d * kAttnBlock;   // [bj, d]
    detail::F32OnlineSoftmax softmax(p, g, r0, bi, c0, bj, scale2, w.m.data(), w.alpha.data(),
                                     w.sum.data(), w.s.data());
    detail::f32_row_range_to(0, M, bj, d, w.q.data(), d, kt, bj, softmax);
    detail::finish_online_softmax_f32(M, w.m.data(), w.alpha.data(), w.sum.data(), w.l.data());
    rescale.first = j == it.first;
    // The causal edge: each row group's PV product stops at the last 16 keys it sees.
    const bool full = p.key_hi(g, r0) >= c0 + bj;
    const int64_t n_groups =
        full ? 1 : detail::edge_row_groups(groups.data(), p, g, r0, bi, G, c0, bj);
    if (full) groups[0] = {0, M, (bj + 15) / 16};
    for (int64_t k = 0; k < n_groups; ++k)
      detail::f32_row_range_to(groups[k].i0, groups[k].i1, d, std::min(16 * groups[k].nv, bj),
                               w.s.data(), kAttnBlock, vt, d, rescale);
  }
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = it.kv_head * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = h * bi + r;
      const float inv = w.l[row] > 0.0f ? 1.0f / w.l[row] : 0.0f;
      float* orow = out + (q0 + r) * s.num_heads * d + head * d;
      for (int64_t x = 0; x < d; ++x) orow[x] = w.o[row * d + x] * inv;
      lse[head * N + q0 + r] = w.l[row] > 0.0f ? w.m[row] * detail::kF32Ln2 + std::log(w.l[row])
                                               : -std::numeric_limits<float>::infinity();
    }
  }
}
#endif

template <typename T>
void forward_item(T* out, T* lse, const T* q, const T* kt_all, const T* v_all,
                  const AttentionShape& s, const detail::AttnPlan& p, const detail::AttnItem& it,
                  ForwardScratch<T>& w) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (s.head_dim % 16 == 0) {
      forward_item_f32(out, lse, q, kt_all, v_all, s, p, it, w);
      return;
    }
  }
#endif
  const detail::AttnSegment& g = p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, N = s.num_tokens;
  const int64_t r0 = it.block * kAttnBlock, q0 = g.q_begin + r0;
  const int64_t bi = std::min(kAttnBlock, g.q_len - r0), M = G * bi;
  const T scale = static_cast<T>(s.scale);
  std::vector<detail::RowGroup>& groups = w.groups;
  // Pack the query tile: row h·bi + r holds query head g·G + h at token q0 + r.
  for (int64_t h = 0; h < G; ++h)
    for (int64_t r = 0; r < bi; ++r)
      std::memcpy(&w.q[(h * bi + r) * d], q + (q0 + r) * s.q_stride + (it.kv_head * G + h) * d,
                  sizeof(T) * d);
  // The first key block writes O (no zero fill); an item without one leaves zeros.
  if (it.first == it.last) std::fill(w.o.begin(), w.o.begin() + M * d, T(0));
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<T>::infinity());
  std::fill(w.l.begin(), w.l.end(), T(0));
  for (int64_t j = it.first; j < it.last; ++j) {
    const int64_t c0 = j * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
    const int64_t index = (g.k_block0 + j) * s.num_kv_heads + it.kv_head;
    const T* kt = kt_all + index * d * kAttnBlock;
    const T* vt = v_all + index * d * kAttnBlock;
    const bool first = j == it.first;
    // Where a row does not see every key of the block (the causal edge), its PV product stops
    // at the last 16 keys it sees: rows in groups (detail::edge_row_groups), the same values. (The
    // S product stays whole: stopping it too needs narrower register blocks, which ran slower.)
    const bool full = p.key_hi(g, r0) >= c0 + bj;
    const int64_t n_groups =
        full ? 1 : detail::edge_row_groups(groups.data(), p, g, r0, bi, G, c0, bj);
    if (full) groups[0] = {0, M, (bj + 15) / 16};
    detail::tile_gemm<T>(M, bj, d, w.q.data(), d, 1, kt, bj, w.s.data(), bj, false);
    for (int64_t row = 0; row < M; ++row) {
      const int64_t r = r0 + row % bi;
      const int64_t lo = std::clamp<int64_t>(p.key_lo(g, r) - c0, 0, bj);
      const int64_t hi = std::clamp<int64_t>(p.key_hi(g, r) - c0, 0, bj);
      const T alpha = detail::softmax_row_update(&w.s[row * bj], bj, lo, hi, scale, w.m[row], w.l[row]);
      if (alpha != T(1) && !first) {
        T* orow = &w.o[row * d];
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) orow[x] *= alpha;
      }
    }
    for (int64_t k = 0; k < n_groups; ++k) {
      const detail::RowGroup& rg = groups[k];
      detail::tile_gemm<T>(rg.i1 - rg.i0, d, std::min(16 * rg.nv, bj), &w.s[rg.i0 * bj], bj, 1,
                           vt, d, &w.o[rg.i0 * d], d, !first);
    }
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
void varlen_attention_forward(const ComputeContext& cc, T* out, T* lse, const T* q, const T* k,
                              const T* v, const AttentionShape& s) {
  if constexpr (std::is_same_v<T, float>) {
    if (cc.bf16() && attention_bf16_runs()) {
      detail::varlen_attention_forward_bf16(out, lse, q, k, v, s);
      return;
    }
  }
  const detail::AttnPlan p = detail::plan_attention(s, false);
  const int64_t rows = (s.num_heads / s.num_kv_heads) * kAttnBlock;
  const int64_t n_items = static_cast<int64_t>(p.items.size());
  const int64_t n_keys = static_cast<int64_t>(p.k_side.size());
  const size_t tiles = static_cast<size_t>(p.k_blocks * s.num_kv_heads * s.head_dim * kAttnBlock);
  T* kt_all = detail::workspace<T>(detail::Arena::kKeys, 2 * tiles);
  T* v_all = kt_all + tiles;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_keys; ++i) pack_key_block(kt_all, v_all, k, v, s, p, p.k_side[i]);
    ForwardScratch<T> scratch(rows, s.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i)
      forward_item(out, lse, q, kt_all, v_all, s, p, p.items[i], scratch);
  }
}

template <typename T>
void varlen_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const AttentionShape& s) {
  varlen_attention_forward(ComputeContext::fp32(), out, lse, q, k, v, s);
}

#define LONGTRON_INSTANTIATE(T)                                                               \
  template void varlen_attention_forward<T>(const ComputeContext&, T*, T*, const T*, const T*, \
                                            const T*, const AttentionShape&);                 \
  template void varlen_attention_forward<T>(T*, T*, const T*, const T*, const T*,             \
                                            const AttentionShape&);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
