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
// the packed q, dO and dq of the call, O(N · Hq · d), never O(N²). The loops are those of
// attention_skeleton.h, shared with the bf16 kernel; this file holds the fp32/double tile math.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/attention_dq_order.h"
#include "ops/attention_f32_blocks.h"
#include "ops/attention_kernels.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/attention_skeleton.h"
#include "ops/attention_transpose.h"
#include "ops/compute_context.h"
#include "ops/fast_math.h"
#include "ops/kernel_isa.h"
#include "ops/ops.h"
#include "ops/tile_gemm.h"

// Compiled once per instruction set (ops/kernel_isa.h): attention_backward_avx512.cpp includes
// this file.
LONGTRON_ISA_TARGET_BEGIN
namespace longtron::ops::detail::LONGTRON_ISA {
namespace {

using detail::kAttnBlock;
constexpr int64_t kKeyBlock = detail::kAttnBackwardKeyBlock;

// The call. Query-side rows are packed once per call in tile order (BackwardCall): every key
// block of the segment reads the same tile, so packing once (instead of per key block) removes
// the copies from the inner loop; dq is accumulated in the same layout and moved into the
// caller's (possibly strided) dq after the segment's last key block (ChainTiles), which also
// makes it overwrite rather than add (varlen_attention_backward_add_dq adds it there instead).
template <typename T>
struct Call : detail::BackwardCall<T, T> {
  T *dk, *dv;
  const T *q, *k, *v, *dout, *out, *lse_in;
  T *pq, *pdout, *lse, *delta;  // packed q and dO [rows, d]; lse and D [rows]
  void pack_row(int64_t row, int64_t n, int64_t head) {
    const AttentionShape& s = this->s;
    const int64_t d = s.head_dim;
    const T* o = out + (n * s.num_heads + head) * d;
    const T* g_o = dout + (n * s.num_heads + head) * d;
    std::memcpy(&pq[row * d], q + n * s.q_stride + head * d, sizeof(T) * d);
    std::memcpy(&pdout[row * d], g_o, sizeof(T) * d);
    T sum = 0;  // D = rowsum(dO ∘ O)
#pragma omp simd reduction(+ : sum)
    for (int64_t x = 0; x < d; ++x) sum += o[x] * g_o[x];
    delta[row] = sum;
    lse[row] = lse_in[head * s.num_tokens + n];
  }
  void pack_tile(int64_t, int64_t, int64_t) {}
};

// The tile math of one thread, its tiles kept in the thread's workspace between calls. For
// float on AVX-512 or AVX2, S goes from the register blocks straight into P and dS
// (attention_f32_blocks.h).
template <typename T>
class BackwardTile {
 public:
  explicit BackwardTile(Call<T>& c) : c_(c), d_(c.s.head_dim) {
    const int64_t kd = d_ * kKeyBlock, rk = c.tile_rows * kKeyBlock;
    const auto t = detail::scratch_tiles<T, 7>({kd, kd, kd, rk, rk, kd, kd});
    kt_ = t[0], vt_ = t[1], kc_ = t[2], s_ = t[3], dp_ = t[4], dk_ = t[5], dv_ = t[6];
  }
  // Kᵀ and Vᵀ tiles [d, bj] so the score GEMMs read rows, and K contiguous for dQ (see
  // attention.cpp's V).
  void begin(const detail::AttnSegment&, const detail::AttnItem& it, int64_t, int64_t k0,
             int64_t bj) {
    const AttentionShape& s = c_.s;
    const int64_t d = d_;
    const T* kb = c_.k + k0 * s.kv_stride + it.kv_head * d;
    const T* vb = c_.v + k0 * s.kv_stride + it.kv_head * d;
    detail::transpose(kt_.data(), bj, kb, s.kv_stride, bj, d);
    detail::transpose(vt_.data(), bj, vb, s.kv_stride, bj, d);
    for (int64_t c = 0; c < bj; ++c) std::memcpy(&kc_[c * d], kb + c * s.kv_stride, sizeof(T) * d);
    // Keys no query sees (before a window, or of a segment without queries) keep zero gradients.
    std::fill_n(dk_.data(), bj * d, T(0));
    std::fill_n(dv_.data(), bj * d, T(0));
  }
  // Only the keys [lo, hi) of the block are visible to the query block (on the diagonal and at
  // a window's edge the rest are masked for every row): the products skip the others.
  static std::pair<int64_t, int64_t> key_range(const detail::AttnPlan& p,
                                               const detail::AttnSegment& sg, int64_t r0,
                                               int64_t bi, int64_t c0, int64_t bj) {
    return {std::clamp<int64_t>(p.key_lo(sg, r0) - c0, 0, bj),
            std::clamp<int64_t>(p.key_hi(sg, r0 + bi - 1) - c0, 0, bj)};
  }
  void products(const detail::BackwardBlock& b) {
    const int64_t d = d_, bj = b.bj, klo = b.lo, nb = b.hi - b.lo, M = b.M;
    const T* qt = &c_.pq[b.base * d];
    const T* dot = &c_.pdout[b.base * d];
    T* sk = s_.data() + klo;    // columns klo.. of P (rows of stride bj)
    T* dsk = dp_.data() + klo;  // and of dS
    bool fused = false;
#if defined(LONGTRON_F32_BLOCKS)
    if constexpr (std::is_same_v<T, float>) {
      // dP stored, then S on register blocks straight into P and dS.
      detail::tile_gemm<T>(M, nb, d, dot, d, 1, vt_.data() + klo, bj, dsk, bj, false);
      // key_lo is non-decreasing and key_hi increasing in the query position.
      const bool all_visible = b.p->key_lo(*b.g, b.r0 + b.bi - 1) <= b.c0 + klo &&
                               b.p->key_hi(*b.g, b.r0) >= b.c0 + klo + nb;
      detail::F32Dscores dscores{b.p,  b.g, b.r0, b.bi, b.c0, klo, nb, bj, scale(),
                                 &c_.lse[b.base], &c_.delta[b.base], sk, dsk, all_visible};
      detail::f32_row_range_to(0, M, nb, d, qt, d, kt_.data() + klo, bj, dscores);
      fused = true;
    }
#endif
    if (!fused) {
      detail::tile_gemm<T>(M, nb, d, qt, d, 1, kt_.data() + klo, bj, sk, bj, false);
      detail::tile_gemm<T>(M, nb, d, dot, d, 1, vt_.data() + klo, bj, dsk, bj, false);
      probabilities_and_dscores(b);
    }
    // dV += Pᵀ dO and dK += dSᵀ Q (the transposes are strides of A, nothing is copied).
    if (!ranged()) {
      detail::tile_gemm<T>(nb, d, M, sk, 1, bj, dot, d, dv_.data() + klo * d, d, true);
      detail::tile_gemm<T>(nb, d, M, dsk, 1, bj, qt, d, dk_.data() + klo * d, d, true);
      return;
    }
    // The K passes of tile_gemm (one when M ≤ kPanelSplit, else kPanelRows rows each, so the
    // sums are grouped as in the full product), each block of keys taking only its rows from
    // the first query that sees its first key to the last that sees its last key, per head
    // (the hull over the heads of the pass): P and dS are 0 outside.
    const int64_t step = M <= detail::kPanelSplit ? M : detail::kPanelRows;
    for (int64_t p0 = 0; p0 < M; p0 += step) {
      const int64_t p1 = std::min(M, p0 + step);
      const auto rows = [&](int64_t i, int64_t R) {
        const int64_t c = b.c0 + klo + i;  // the block's first key (segment position)
        const int64_t lo = std::clamp<int64_t>(b.p->query_lo(*b.g, c) - b.r0, 0, b.bi);
        const int64_t hi = std::clamp<int64_t>(b.p->query_hi(*b.g, c + R - 1) - b.r0, 0, b.bi);
        int64_t k0 = p1, k1 = p0;
        for (int64_t h = p0 / b.bi; lo < hi && h * b.bi < p1; ++h) {
          const int64_t first = std::max(p0, h * b.bi + lo), end = std::min(p1, h * b.bi + hi);
          if (first < end) k0 = std::min(k0, first), k1 = std::max(k1, end);
        }
        return std::pair<int64_t, int64_t>(k0 - p0, k1 - p0);
      };
      detail::tile_gemm_ranged<T>(nb, d, sk + p0 * bj, 1, bj, dot + p0 * d, d,
                                  dv_.data() + klo * d, d, true, rows);
      detail::tile_gemm_ranged<T>(nb, d, dsk + p0 * bj, 1, bj, qt + p0 * d, d,
                                  dk_.data() + klo * d, d, true, rows);
    }
  }
  void add_dq(const detail::BackwardBlock& b, bool accumulate) {
    const int64_t d = d_, nb = b.hi - b.lo;
    T* dq = &c_.dq_tiles[b.base * d];
    if (!ranged()) {
      detail::tile_gemm<T>(b.M, d, nb, dp_.data() + b.lo, b.bj, 1, kc_.data() + b.lo * d, d, dq,
                           d, accumulate);
      return;
    }
    // Each row block's keys only up to the last one its rows see (dS is 0 beyond).
    const auto keys = [&](int64_t i, int64_t R) {
      int64_t k0 = nb, k1 = 0;
      for (int64_t x = i; x < i + R; ++x) {
        const int64_t r = b.r0 + x % b.bi, first = b.c0 + b.lo;
        k0 = std::min(k0, std::clamp<int64_t>(b.p->key_lo(*b.g, r) - first, 0, nb));
        k1 = std::max(k1, std::clamp<int64_t>(b.p->key_hi(*b.g, r) - first, 0, nb));
      }
      return std::pair<int64_t, int64_t>(k0, k1);
    };
    detail::tile_gemm_ranged<T>(b.M, d, dp_.data() + b.lo, b.bj, 1, kc_.data() + b.lo * d, d, dq,
                                d, accumulate, keys);
  }
  void end(int64_t offset, int64_t bj) {
    const int64_t d = d_, stride = c_.s.kv_stride;
    for (int64_t c = 0; c < bj; ++c) {
      std::memcpy(c_.dk + offset + c * stride, &dk_[c * d], sizeof(T) * d);
      std::memcpy(c_.dv + offset + c * stride, &dv_[c * d], sizeof(T) * d);
    }
  }

 private:
  T scale() const { return static_cast<T>(c_.s.scale); }
  // The dV, dK and dQ products skip the masked zeros of P and dS (tile_gemm_ranged: columns in
  // whole vectors, K ≤ kPanelSplit per pass).
  bool ranged() const {
    return d_ % (detail::kVecBytes / int64_t(sizeof(T))) == 0 &&
           kKeyBlock <= detail::kPanelSplit && detail::kPanelRows <= detail::kPanelSplit;
  }
  // P = exp(scale·S − lse) (0 where masked) into s_; dS = P ∘ (dP − D) · scale into dp_. Row
  // `row` is query r0 + row % bi of the segment; the tile's keys start at key c0.
  void probabilities_and_dscores(const detail::BackwardBlock& b) {
    const int64_t bj = b.bj;
    for (int64_t row = 0; row < b.M; ++row) {
      const int64_t r = b.r0 + row % b.bi;
      const int64_t lo = std::clamp<int64_t>(b.p->key_lo(*b.g, r) - b.c0, 0, bj);
      const int64_t hi = std::clamp<int64_t>(b.p->key_hi(*b.g, r) - b.c0, 0, bj);
      detail::dscores_row(&s_[row * bj], &dp_[row * bj], bj, lo, hi, c_.lse[b.base + row],
                          c_.delta[b.base + row], scale());
    }
  }

  Call<T>& c_;
  int64_t d_;
  detail::ScratchTile<T> kt_, vt_, kc_, s_, dp_, dk_, dv_;
};

}  // namespace


template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionShape& s, bool add_dq) {
  const detail::AttnPlan p = detail::plan_attention(s, true, kKeyBlock);
  const int64_t tile_rows = (s.num_heads / s.num_kv_heads) * kAttnBlock;
  const int64_t rows = p.q_blocks * s.num_kv_heads * tile_rows;  // ≤ (N + 64·segments)·Hq
  const size_t values = static_cast<size_t>(rows * s.head_dim);
  T* buffer =
      detail::workspace<T>(detail::Arena::kQueries, 3 * values + 2 * static_cast<size_t>(rows));
  const int64_t tiles = p.q_blocks * s.num_kv_heads;
  uint8_t* written =
      detail::workspace<uint8_t>(detail::Arena::kDqWritten, static_cast<size_t>(tiles));
  Call<T> call{{s, p, tile_rows, buffer + 2 * values, written},
               dk, dv, q, k, v, dout, out, lse,
               buffer, buffer + values, buffer + 3 * values, buffer + 3 * values + rows};
  detail::run_backward<BackwardTile<T>>(call, dq, add_dq);
}

template void attention_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const AttentionShape&, bool);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*,
                                         const double*, const AttentionShape&, bool);

}  // namespace longtron::ops::detail::LONGTRON_ISA
LONGTRON_ISA_TARGET_END
