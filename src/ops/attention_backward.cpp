// Varlen causal attention backward, FlashAttention-2 style (Dao 2023, Algorithm 2) on the CPU.
// One work item = (segment, kv head, key block of 128 tokens): the loop over query blocks runs
// inside it (key blocks outer, query blocks inner), so dK and dV of the tile are accumulated
// privately and written once, without atomics. It visits only the query blocks that see one of
// its keys (causal, bottom-right aligned, window), as the forward does. P is recomputed from the saved lse, and
// D = rowsum(dO ∘ O) replaces the softmax Jacobian. The query heads of the kv group are stacked
// as tile rows, so the GQA sum over them is part of the dK/dV GEMMs. dQ of a query block receives
// one tile from each key block, the CPU counterpart of FA2's atomic adds: accumulated into the
// shared tile in key-block order (attention_dq_order.h), so dQ does not depend on the number of
// threads. Extra memory:
// the packed q, dO and dq of the call, O(N · Hq · d), never O(N²).
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "ops/attention_add_dq.h"
#include "ops/attention_bf16.h"
#include "ops/attention_dq_order.h"
#include "ops/attention_f32_blocks.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/attention_transpose.h"
#include "ops/fast_math.h"
#include "ops/ops.h"
#include "ops/compute_context.h"
#include "ops/tile_gemm.h"

namespace longtron::ops {
namespace {

using detail::kAttnBlock;
constexpr int64_t kKeyBlock = detail::kAttnBackwardKeyBlock;

// Query-side rows packed once per call in tile order: the tile of (query block b, kv head g)
// starts at row (b·Hkv + g)·G·64 and holds row h·bi + r for query head g·G + h at token q0 + r.
// Every key block of the segment reads the same tile, so packing once (instead of per key block)
// removes the copies from the inner loop; dq is accumulated in the same layout and scattered into
// the caller's (possibly strided) dq at the end, which also makes it overwrite rather than add
// (varlen_attention_backward_add_dq adds it there instead).
template <typename T>
struct PackedQueries {
  int64_t tile_rows;  // G · 64
  T *q, *dout, *dq, *lse, *delta;
  // Per tile: whether a key block has written its dq yet. The first add writes instead of adding
  // (no zero fill of dq); read and set only on the tile's turn (DqOrder), so never concurrently.
  uint8_t* dq_written;
  int64_t row(int64_t block_id, int64_t num_kv_heads, int64_t g) const {
    return (block_id * num_kv_heads + g) * tile_rows;
  }
};

// Per-thread tiles of one item, kept in the thread's workspace between calls.
template <typename T>
struct BackwardScratch {
  detail::ScratchTile<T> kt, vt, kc, s, dp, dk, dv;
  BackwardScratch(int64_t rows, int64_t d) {
    const int64_t kd = d * kKeyBlock, rk = rows * kKeyBlock;
    const auto t = detail::scratch_tiles<T, 7>({kd, kd, kd, rk, rk, kd, kd});
    kt = t[0], vt = t[1], kc = t[2], s = t[3], dp = t[4], dk = t[5], dv = t[6];
  }
};

enum class Move { kPack, kStore, kAdd };

// Copies (kPack) the query block of `it` into PackedQueries with its lse and D, or scatters its
// accumulated dq back to the caller's layout, overwriting (kStore) or adding to (kAdd) it.
template <typename T>
void move_query_block(PackedQueries<T>& pq, T* dq, const T* q, const T* dout, const T* out,
                      const T* lse, const AttentionShape& s, const detail::AttnPlan& p,
                      const detail::AttnItem& it, Move move) {
  const detail::AttnSegment& sg = p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, g = it.kv_head;
  const int64_t q0 = sg.q_begin + it.block * kAttnBlock;
  const int64_t bi = std::min(kAttnBlock, sg.q_len - it.block * kAttnBlock);
  const int64_t tile = (sg.q_block0 + it.block) * s.num_kv_heads + g;
  const int64_t base = pq.row(sg.q_block0 + it.block, s.num_kv_heads, g);
  // A tile no key block added into (queries that see no key; not possible for valid shapes).
  if (move != Move::kPack && !pq.dq_written[tile]) std::fill_n(&pq.dq[base * d], G * bi * d, T(0));
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = g * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = base + h * bi + r, n = q0 + r;
      if (move == Move::kStore) {
        std::memcpy(dq + n * s.q_stride + head * d, &pq.dq[row * d], sizeof(T) * d);
        continue;
      }
      if (move == Move::kAdd) {
        T* dst = dq + n * s.q_stride + head * d;
        const T* src = &pq.dq[row * d];
        for (int64_t x = 0; x < d; ++x) dst[x] += src[x];
        continue;
      }
      const T* o = out + (n * s.num_heads + head) * d;
      const T* g_o = dout + (n * s.num_heads + head) * d;
      std::memcpy(&pq.q[row * d], q + n * s.q_stride + head * d, sizeof(T) * d);
      std::memcpy(&pq.dout[row * d], g_o, sizeof(T) * d);
      T delta = 0;  // D = rowsum(dO ∘ O)
#pragma omp simd reduction(+ : delta)
      for (int64_t x = 0; x < d; ++x) delta += o[x] * g_o[x];
      pq.delta[row] = delta;
      pq.lse[row] = lse[head * s.num_tokens + n];
    }
  }
}

// P = exp(scale·S − lse) (0 where masked) into w.s; dS = P ∘ (dP − D) · scale into w.dp. Row
// `row` is query r0 + row % bi of the segment; the tile's keys start at key c0.
template <typename T>
void probabilities_and_dscores(BackwardScratch<T>& w, const T* lse, const T* delta,
                               const detail::AttnPlan& p, const detail::AttnSegment& sg,
                               int64_t M, int64_t bi, int64_t bj, int64_t r0, int64_t c0,
                               T scale) {
  for (int64_t row = 0; row < M; ++row) {
    const int64_t r = r0 + row % bi;
    const int64_t lo = std::clamp<int64_t>(p.key_lo(sg, r) - c0, 0, bj);
    const int64_t hi = std::clamp<int64_t>(p.key_hi(sg, r) - c0, 0, bj);
    detail::dscores_row(&w.s[row * bj], &w.dp[row * bj], bj, lo, hi, lse[row], delta[row],
                        scale);
  }
}

template <typename T>
void backward_item(T* dk, T* dv, const T* k, const T* v, PackedQueries<T>& pq,
                   detail::DqOrder& order, const AttentionShape& s, const detail::AttnPlan& p,
                   const detail::AttnItem& it, BackwardScratch<T>& w) {
  const detail::AttnSegment& sg = p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, g = it.kv_head;
  const int64_t c0 = it.block * kKeyBlock, k0 = sg.k_begin + c0;
  const int64_t bj = std::min(kKeyBlock, sg.k_len - c0);
  const T scale = static_cast<T>(s.scale);
  const T* kb = k + k0 * s.kv_stride + g * d;
  const T* vb = v + k0 * s.kv_stride + g * d;
  // Kᵀ and Vᵀ tiles [d, bj] so the score GEMMs read rows, and K contiguous for dQ (see
  // attention.cpp's V).
  detail::transpose(w.kt.data(), bj, kb, s.kv_stride, bj, d);
  detail::transpose(w.vt.data(), bj, vb, s.kv_stride, bj, d);
  for (int64_t c = 0; c < bj; ++c) std::memcpy(&w.kc[c * d], kb + c * s.kv_stride, sizeof(T) * d);
  // Keys no query sees (before a window, or of a segment without queries) keep zero gradients.
  std::fill_n(w.dk.data(), bj * d, T(0));
  std::fill_n(w.dv.data(), bj * d, T(0));
  for (int64_t i = it.first; i < it.last; ++i) {
    const int64_t r0 = i * kAttnBlock;
    const int64_t bi = std::min(kAttnBlock, sg.q_len - r0), M = G * bi;
    // Only the keys [klo, khi) of the block are visible to this query block (on the diagonal
    // and at a window's edge the rest are masked for every row): the products skip the others.
    const int64_t klo = std::clamp<int64_t>(p.key_lo(sg, r0) - c0, 0, bj);
    const int64_t khi = std::clamp<int64_t>(p.key_hi(sg, r0 + bi - 1) - c0, 0, bj);
    const int64_t tile = detail::DqOrder::tile(p, s.num_kv_heads, it, i);
    if (klo >= khi) {  // nothing to add, but the turn still passes through this block
      order.wait(tile, it.block);
      order.pass(tile, it.block);
      continue;
    }
    const int64_t nb = khi - klo;
    const int64_t base = pq.row(sg.q_block0 + i, s.num_kv_heads, g);
    const T* qt = &pq.q[base * d];
    const T* dot = &pq.dout[base * d];
    T* sk = w.s.data() + klo;    // columns klo.. of P (rows of stride bj)
    T* dsk = w.dp.data() + klo;  // and of dS
    bool fused = false;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      // dP stored, then S on register blocks straight into P and dS (attention_f32_blocks.h).
      detail::tile_gemm<T>(M, nb, d, dot, d, 1, w.vt.data() + klo, bj, dsk, bj, false);
      detail::F32Dscores dscores{&p, &sg, r0, bi, c0, klo, nb, bj, scale, &pq.lse[base],
                                 &pq.delta[base], sk, dsk};
      detail::f32_row_range_to(0, M, nb, d, qt, d, w.kt.data() + klo, bj, dscores);
      fused = true;
    }
#endif
    if (!fused) {
      detail::tile_gemm<T>(M, nb, d, qt, d, 1, w.kt.data() + klo, bj, sk, bj, false);
      detail::tile_gemm<T>(M, nb, d, dot, d, 1, w.vt.data() + klo, bj, dsk, bj, false);
      probabilities_and_dscores(w, &pq.lse[base], &pq.delta[base], p, sg, M, bi, bj, r0, c0,
                                scale);
    }
    // dV += Pᵀ dO and dK += dSᵀ Q (the transposes are strides of A, nothing is copied).
    detail::tile_gemm<T>(nb, d, M, sk, 1, bj, dot, d, w.dv.data() + klo * d, d, true);
    detail::tile_gemm<T>(nb, d, M, dsk, 1, bj, qt, d, w.dk.data() + klo * d, d, true);
    // dQ += dS K, straight into the shared tile on this block's turn.
    const T* kc = w.kc.data() + klo * d;
    order.wait(tile, it.block);
    detail::tile_gemm<T>(M, d, nb, dsk, bj, 1, kc, d, &pq.dq[base * d], d, pq.dq_written[tile]);
    pq.dq_written[tile] = 1;
    order.pass(tile, it.block);
  }
  for (int64_t c = 0; c < bj; ++c) {
    std::memcpy(dk + (k0 + c) * s.kv_stride + g * d, &w.dk[c * d], sizeof(T) * d);
    std::memcpy(dv + (k0 + c) * s.kv_stride + g * d, &w.dv[c * d], sizeof(T) * d);
  }
}

template <typename T>
void backward(const ComputeContext& cc, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
              const T* v, const T* out, const T* lse, const AttentionShape& s, bool add_dq) {
  if constexpr (std::is_same_v<T, float>) {
    if (cc.bf16() && attention_bf16_runs()) {
      detail::varlen_attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, add_dq);
      return;
    }
  }
  const detail::AttnPlan p = detail::plan_attention(s, true, kKeyBlock);
  const int64_t n_queries = static_cast<int64_t>(p.q_side.size());
  const int64_t tile_rows = (s.num_heads / s.num_kv_heads) * kAttnBlock;
  const int64_t rows = p.q_blocks * s.num_kv_heads * tile_rows;  // ≤ (N + 64·segments)·Hq
  const size_t values = static_cast<size_t>(rows * s.head_dim);
  T* buffer =
      detail::workspace<T>(detail::Arena::kQueries, 3 * values + 2 * static_cast<size_t>(rows));
  const int64_t tiles = p.q_blocks * s.num_kv_heads;
  uint8_t* written =
      detail::workspace<uint8_t>(detail::Arena::kDqWritten, static_cast<size_t>(tiles));
  std::fill_n(written, tiles, uint8_t(0));
  PackedQueries<T> pq{tile_rows,           buffer,
                      buffer + values,     buffer + 2 * values,
                      buffer + 3 * values, buffer + 3 * values + rows,
                      written};
  detail::DqOrder order(p, s.num_kv_heads);
  detail::ChainClaim items(p);  // chains in block order (what DqOrder needs), largest first
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_queries; ++i)
      move_query_block(pq, dq, q, dout, out, lse, s, p, p.q_side[i], Move::kPack);
    BackwardScratch<T> scratch(tile_rows, s.head_dim);
    int64_t chain = -1;
    for (int64_t i = items.claim(chain); i >= 0; i = items.claim(chain))
      backward_item(dk, dv, k, v, pq, order, s, p, p.items[i], scratch);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_queries; ++i)
      move_query_block(pq, dq, q, dout, out, lse, s, p, p.q_side[i],
                       add_dq ? Move::kAdd : Move::kStore);
  }
}

}  // namespace

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
