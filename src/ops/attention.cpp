// Varlen causal attention forward, FlashAttention-2 style (Dao 2023, Algorithm 1) on the CPU.
// One work item = (segment, kv head, query block of 64 tokens). The q_per_kv query heads that
// share the kv head are stacked as the rows of one tile (GQA without copying K/V), so each K/V
// tile is packed once and used by all of them. An item visits only the key blocks holding a key
// visible to one of its queries (from the window's start, or the segment's first key, up to the
// diagonal), so no fully masked tile is computed: the work is ≈ Σ lᵢ²/2 · d per head without a
// window and ≈ Σ lᵢ · W · d with one. Memory per thread is a few tiles. The loops are those of
// attention_skeleton.h, shared with the bf16 kernel; this file holds the fp32/double tile math.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/attention_f32_blocks.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/attention_skeleton.h"
#include "ops/attention_kernels.h"
#include "ops/attention_transpose.h"
#include "ops/compute_context.h"
#include "ops/fast_math.h"
#include "ops/kernel_isa.h"
#include "ops/ops.h"
#include "ops/tile_gemm.h"

// Compiled once per instruction set (ops/kernel_isa.h): attention_forward_avx512.cpp includes this file.
LONGTRON_ISA_TARGET_BEGIN
namespace longtron::ops::detail::LONGTRON_ISA {
namespace {

using detail::kAttnBlock;

// The call: inputs, outputs and the packed key tiles.
template <typename T>
struct ForwardCall {
  const AttentionShape& s;
  const detail::AttnPlan& p;
  T *out, *lse;
  const T *q, *k, *v;
  // Kᵀ tiles [d, bj] and V tiles [bj, d] of every (key block, kv head), packed once per call so
  // the score GEMM reads rows and the PV GEMM reads contiguous rows (a strided V, rows a packed
  // qkv row apart, costs the PV product ~25%); every later query block of the segment reuses
  // them. 2 · O(N_k · Hkv · d) values.
  T *kt_all, *v_all;
};

// The tile math of the fp32/double forward, one per thread, its tiles kept in the thread's
// workspace between calls: for float with head_dim a multiple of 16 on AVX-512 or AVX2 register
// blocks (attention_f32_blocks.h: the softmax in base 2, on AVX-512 on the S blocks in registers,
// on AVX2 on a row group's S just stored; the rescale of O folded into the PV product's store),
// else on tile_gemm with S stored and the softmax run row by row.
template <typename T>
class ForwardTile {
 public:
  explicit ForwardTile(const ForwardCall<T>& c)
      : c_(c), d_(c.s.head_dim), groups_(4 * (c.s.num_heads / c.s.num_kv_heads)) {
    const int64_t rows = (c.s.num_heads / c.s.num_kv_heads) * kAttnBlock, d = d_;
    const auto t = detail::scratch_tiles<T, 7>(
        {rows * d, rows * kAttnBlock, rows * d, rows, rows, rows, rows});
    q_ = t[0], s_ = t[1], o_ = t[2], m_ = t[3], l_ = t[4], alpha_ = t[5], sum_ = t[6];
#if defined(LONGTRON_F32_BLOCKS)
    if constexpr (std::is_same_v<T, float>) blocks_ = d_ % 16 == 0;
#endif
  }
  void pack_keys(const detail::AttnItem& it) {
    const AttentionShape& s = c_.s;
    const detail::AttnSegment& g = c_.p.segments[it.seg];
    const int64_t d = d_;
    const int64_t c0 = it.block * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
    const T* kb = c_.k + (g.k_begin + c0) * s.kv_stride + it.kv_head * d;
    const int64_t index = (g.k_block0 + it.block) * s.num_kv_heads + it.kv_head;
    detail::transpose(c_.kt_all + index * d * kAttnBlock, bj, kb, s.kv_stride, bj, d);
    const T* vb = c_.v + (g.k_begin + c0) * s.kv_stride + it.kv_head * d;
    T* vt = c_.v_all + index * d * kAttnBlock;
    for (int64_t c = 0; c < bj; ++c) std::memcpy(vt + c * d, vb + c * s.kv_stride, sizeof(T) * d);
  }
  void pack_query_row(int64_t row, const T* src) {
    std::memcpy(&q_[row * d_], src, sizeof(T) * d_);
  }
  void begin(int64_t M, bool no_keys) {
    if (no_keys) std::fill(o_.begin(), o_.begin() + M * d_, T(0));
    std::fill(m_.begin(), m_.end(), -std::numeric_limits<T>::infinity());
    std::fill(l_.begin(), l_.end(), T(0));
  }
  void key_block(const detail::ForwardBlock& b) {
#if defined(LONGTRON_F32_BLOCKS)
    if constexpr (std::is_same_v<T, float>) {
      if (blocks_) return key_block_f32(b);
    }
#endif
    key_block_generic(b);
  }
  detail::RowGroup* groups() { return groups_.data(); }
  const T* o() const { return o_.data(); }
  const T* m() const { return m_.data(); }
  const T* l() const { return l_.data(); }
  bool base2() const { return blocks_; }

 private:
  const T* kt(const detail::ForwardBlock& b) const {
    return c_.kt_all + b.index * d_ * kAttnBlock;  // [d, bj]: rows readable to 64 columns
  }
  const T* vt(const detail::ForwardBlock& b) const { return c_.v_all + b.index * d_ * kAttnBlock; }

  void key_block_generic(const detail::ForwardBlock& b) {
    const int64_t d = d_, bj = b.bj;
    const T scale = static_cast<T>(c_.s.scale);
    detail::tile_gemm<T>(b.M, bj, d, q_.data(), d, 1, kt(b), bj, s_.data(), bj, false);
    for (int64_t row = 0; row < b.M; ++row) {
      const int64_t r = b.r0 + row % b.bi;
      const int64_t lo = std::clamp<int64_t>(b.p->key_lo(*b.g, r) - b.c0, 0, bj);
      const int64_t hi = std::clamp<int64_t>(b.p->key_hi(*b.g, r) - b.c0, 0, bj);
      const T alpha = detail::softmax_row_update(&s_[row * bj], bj, lo, hi, scale, m_[row], l_[row]);
      if (alpha != T(1) && !b.first) {
        T* orow = &o_[row * d];
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) orow[x] *= alpha;
      }
    }
    for (int64_t k = 0; k < b.n_groups; ++k) {
      const detail::RowGroup& rg = b.groups[k];
      detail::tile_gemm<T>(rg.i1 - rg.i0, d, std::min(16 * rg.nv, bj), &s_[rg.i0 * bj], bj, 1,
                           vt(b), d, &o_[rg.i0 * d], d, !b.first);
    }
  }

#if defined(LONGTRON_F32_BLOCKS)
  void key_block_f32(const detail::ForwardBlock& b) {
    const int64_t d = d_, bj = b.bj;
    const float scale2 = static_cast<float>(c_.s.scale) * detail::kLog2e;
    detail::F32OnlineSoftmax softmax{detail::TileVisibility(*b.p, *b.g, b.r0, b.bi, b.c0, bj),
                                     b.r0,       b.bi,        scale2,       m_.data(),
                                     alpha_.data(), sum_.data(), s_.data()};
    // S for each row group only up to the last 16 keys its rows see (the causal edge): the
    // lanes left out are invisible to those rows, so P, the row maxima and sums are the same.
    for (int64_t k = 0; k < b.n_groups; ++k) {
      const detail::RowGroup& rg = b.groups[k];
      detail::f32_row_range_to(rg.i0, rg.i1, std::min(16 * rg.nv, bj), d, q_.data(), d, kt(b), bj,
                               softmax);
      softmax.rows(rg.i0, rg.i1, rg.nv);  // AVX2: the step on the rows' stored S, still in L1
    }
    softmax.finish(b.M, l_.data());
    detail::F32RescaleAdd rescale{o_.data(), d, alpha_.data(), b.first};
    for (int64_t k = 0; k < b.n_groups; ++k)
      detail::f32_row_range_to(b.groups[k].i0, b.groups[k].i1, d,
                               std::min(16 * b.groups[k].nv, bj), s_.data(), kAttnBlock, vt(b),
                               d, rescale);
  }
#endif

  const ForwardCall<T>& c_;
  int64_t d_;
  bool blocks_ = false;  // the register-block path (AVX-512 or AVX2)
  std::vector<detail::RowGroup> groups_;
  detail::ScratchTile<T> q_, s_, o_, m_, l_, alpha_, sum_;
};

}  // namespace


template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionShape& s) {
  const AttnPlan p = plan_attention(s, false);
  const size_t tiles = static_cast<size_t>(p.k_blocks * s.num_kv_heads * s.head_dim * kAttnBlock);
  T* kt_all = workspace<T>(Arena::kKeys, 2 * tiles);
  const ForwardCall<T> call{s, p, out, lse, q, k, v, kt_all, kt_all + tiles};
  run_forward<ForwardTile<T>>(call);
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*,
                                        const double*, const AttentionShape&);

}  // namespace longtron::ops::detail::LONGTRON_ISA
LONGTRON_ISA_TARGET_END
