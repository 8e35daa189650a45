// bf16 varlen attention on AVX512-BF16 (and AMX tiles where available): the loops that the fp32
// kernels share (attention_skeleton.h: forward FA2 Algorithm 1, backward Algorithm 2 with 128-key
// blocks) over tile math with every product in bf16 × bf16 → fp32 (bf16_tile_gemm.h). Inputs are
// rounded to bf16 once, while they are packed into the layouts vdpbf16ps reads (pairs along the
// reduction dimension); the softmax, lse, D and all accumulators stay fp32, and P and dS are
// rounded to bf16 only as GEMM inputs, as in FlashAttention-2's bf16 kernels (Dao 2023). The
// scores never reach memory: each register block of S = QKᵀ goes straight into the online softmax
// or into P and dS (bf16_tile_blocks.h, attention_rows_bf16.h). This file is compiled twice: as
// itself (namespace native) and through attention_bf16_emulated.cpp (namespace emulated, the bf16
// instructions emulated in AVX-512F, no AMX).
// Which compilation this is (ops/kernel_isa.h): the kernel region below is built for AVX512-BF16,
// or for AVX-512F alone in the emulated build, whatever the build's baseline.
#ifdef LONGTRON_BF16_EMULATED
#define LONGTRON_ISA avx512
#define LONGTRON_ISA_TARGET LONGTRON_TARGET_AVX512
#else
#define LONGTRON_ISA avx512bf16
#define LONGTRON_ISA_TARGET LONGTRON_TARGET_AVX512_BF16
#endif
#define LONGTRON_ISA_AVX512 1

#include "ops/attention_bf16.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "ops/attention_dq_order.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/attention_rows_bf16.h"
#include "ops/attention_skeleton.h"
#include "ops/attention_transpose.h"
#include "ops/bf16_tile_blocks.h"
#include "ops/bf16_tile_gemm.h"
#include "ops/cpu_features.h"
#include "ops/kernel_isa.h"
#include "ops/precision.h"

LONGTRON_ISA_TARGET_BEGIN
namespace longtron::ops::detail::LONGTRON_BF16_ISA {
namespace {

constexpr int64_t B = kAttnBlock;
// Key block of the backward: each query tile (q, dO, their transposes and the shared dq, all from
// beyond L2) then serves 128 keys, and dQ = dS K reduces over 128, halving that traffic per FLOP.
constexpr int64_t KB = kAttnBackwardKeyBlock;
static_assert(B == 64 && KB == 2 * B,
              "the row steps (attention_rows_bf16.h) hold 64 keys of a row in four vectors");

// Sizes of the packed layouts for one call.
struct Dims {
  int64_t d, d2, dp, d16, G;  // head_dim, pairs of it, 2·d2, head_dim rounded up to 16, q per kv
  explicit Dims(const AttentionShape& s)
      : d(s.head_dim), d2((s.head_dim + 1) / 2), dp(2 * d2), d16(round_up(s.head_dim, 16)),
        G(s.num_heads / s.num_kv_heads) {}
  int64_t words_t() const { return d2 * B; }       // Kᵀ or Vᵀ words of one key block [d2, 64]
  int64_t words_rows() const { return B / 2 * d16; }  // K or V pairs of rows [32, d16]
};

// One row of n floats to bf16, zero-padded to `padded` elements.
void row_to_bf16(bf16_t* dst, const float* src, int64_t n, int64_t padded) {
  to_bf16(dst, src, n);
  if (padded > n) std::fill(dst + n, dst + padded, bf16_t(0));
}

// Rows of a key block [bj, d] (token stride kv_stride) to bf16 rows [bj, dp].
void key_rows(bf16_t* dst, const float* x, int64_t stride, int64_t bj, const Dims& m) {
  for (int64_t c = 0; c < bj; ++c) row_to_bf16(dst + c * m.dp, x + c * stride, m.d, m.dp);
}

// B = Yᵀ in the words layout of bf16_tile_gemm.h for bf16 rows Y [N, 2·K2] (ldy even), by 16 × 16
// word transposes: dst[k2·ldb + j] = word k2 of row j, zero columns in [N, ldb).
LONGTRON_BF16_TARGET void pack_words_transposed_fast(uint32_t* dst, int64_t ldb, const bf16_t* Y,
                                                     int64_t ldy, int64_t N, int64_t K2) {
  transpose_words_avx512(dst, ldb, reinterpret_cast<const uint32_t*>(Y), ldy / 2, N, K2);
  if (N < ldb)
    for (int64_t k2 = 0; k2 < K2; ++k2) std::fill(dst + k2 * ldb + N, dst + k2 * ldb + ldb, 0u);
}

// ---- Forward ---------------------------------------------------------------------------------

// The online softmax (online_softmax_row, attention_blocks.h) on register blocks of S = QKᵀ for
// one key block: per row, P rounded to bf16 into p (stride 64), the new max into m, the previous
// one into m_old and P's row sum into sum. finish_online_softmax then turns m_old into the
// output accumulator's factor (applied by RescaleAdd) and updates l.
struct OnlineSoftmax {
  TileVisibility vis;
  int64_t r0, bi;  // the item's first query, rows per head (row h·bi + r is query r0 + r)
  float scale2;
  float *m, *m_old, *sum;
  bf16_t* p;
  template <int R, int NV>
  LONGTRON_BF16_TARGET void block(int64_t i, int64_t, const __m512 (&acc)[R][NV]) {
    int64_t r = i % bi;
#pragma GCC unroll 6
    for (int k = 0; k < R; ++k) {
      const int64_t row = i + k;
      __m512 y[4];
      for (int v = 0; v < NV; ++v) y[v] = acc[k][v];
      online_softmax_row<4, NV>(y, vis.row(r0 + r), scale2, m[row], m_old[row], sum[row]);
      _mm512_storeu_si512(p + row * B, round_two(y[0], y[1]));
      _mm512_storeu_si512(p + row * B + 32, round_two(y[2], y[3]));
      if (++r == bi) r = 0;
    }
  }
};

// The call: inputs, outputs (out, or its bf16 bits in out16 when that is set) and Kᵀ words and V
// pairs of rows of every (key block, kv head).
struct ForwardCall {
  const AttentionShape& s;
  const AttnPlan& p;
  float *out, *lse;
  uint16_t* out16;
  const float *q, *k, *v;
  Dims m;
  uint32_t *kw_all, *vp_all;
};

// The tile math of one thread, its tiles kept in the thread's workspace between calls (s: where
// AMX products spill, bf16_gemm_to; the S and PV products take turns in it).
class ForwardTile {
 public:
  explicit ForwardTile(const ForwardCall& c)
      : c_(c), m_(c.m), rows_(B * c.m.dp), groups_(4 * c.m.G), amx_(amx_available()) {
    const int64_t rows = m_.G * B;
    const auto h = scratch_tiles<bf16_t, 2>({rows * m_.dp, rows * B});
    const auto f = scratch_tiles<float, 6>(
        {rows * std::max(B, m_.d16), rows * m_.d, rows, rows, rows, rows});
    q_ = h[0], p_ = h[1], s_ = f[0], o_ = f[1], mx_ = f[2], l_ = f[3], alpha_ = f[4], sum_ = f[5];
  }
  // Kᵀ words and V pairs of rows of one (key block, kv head), once per call.
  void pack_keys(const AttnItem& it) {
    const AttentionShape& s = c_.s;
    const AttnSegment& g = c_.p.segments[it.seg];
    const int64_t c0 = it.block * B, bj = std::min(B, g.k_len - c0);
    const int64_t index = (g.k_block0 + it.block) * s.num_kv_heads + it.kv_head;
    const int64_t offset = (g.k_begin + c0) * s.kv_stride + it.kv_head * m_.d;
    key_rows(rows_.data(), c_.k + offset, s.kv_stride, bj, m_);
    pack_words_transposed_fast(c_.kw_all + index * m_.words_t(), B, rows_.data(), m_.dp, bj,
                               m_.d2);
    key_rows(rows_.data(), c_.v + offset, s.kv_stride, bj, m_);
    pack_pairs_of_rows(c_.vp_all + index * m_.words_rows(), m_.d16, rows_.data(), m_.dp, bj,
                       m_.d);
  }
  void pack_query_row(int64_t row, const float* src) {
    row_to_bf16(&q_[row * m_.dp], src, m_.d, m_.dp);
  }
  void begin(int64_t M, bool no_keys) {
    if (no_keys) std::fill(o_.begin(), o_.begin() + M * m_.d, 0.0f);
    std::fill(mx_.begin(), mx_.end(), -std::numeric_limits<float>::infinity());
    std::fill(l_.begin(), l_.end(), 0.0f);
  }
  void key_block(const ForwardBlock& b) {
    const int64_t d = m_.d, M = b.M, bj = b.bj, bjp = round_up(bj, 2);
    OnlineSoftmax softmax{TileVisibility(*b.p, *b.g, b.r0, b.bi, b.c0, bj),
                          b.r0,
                          b.bi,
                          static_cast<float>(c_.s.scale) * kLog2e,
                          mx_.data(),
                          alpha_.data(),
                          sum_.data(),
                          p_.data()};
    RescaleAdd rescale{o_.data(), d, alpha_.data(), b.first};
    const uint32_t* kw = c_.kw_all + b.index * m_.words_t();
    const uint32_t* vp = c_.vp_all + b.index * m_.words_rows();
    bf16_gemm_to(M, bj, m_.d2, q_.data(), m_.dp, kw, B, softmax, m_.G * B, s_.data(), B);
    finish_online_softmax<4>(M, mx_.data(), alpha_.data(), sum_.data(), l_.data());
    if (softmax.vis.full || amx_) {
      bf16_gemm_to(M, d, bjp / 2, p_.data(), B, vp, m_.d16, rescale, m_.G * B, s_.data(), m_.d16);
      return;
    }
    // The causal edge: each group of rows stops its PV product at the last 16-key vector it
    // sees (the skeleton's groups).
    for (int64_t k = 0; k < b.n_groups; ++k)
      bf16_row_range_to(b.groups[k].i0, b.groups[k].i1, d, std::min(16 * b.groups[k].nv, bjp) / 2,
                        p_.data(), B, vp, m_.d16, rescale);
  }
  RowGroup* groups() { return groups_.data(); }
  const float* o() const { return o_.data(); }
  const float* m() const { return mx_.data(); }
  const float* l() const { return l_.data(); }
  bool base2() const { return true; }

 private:
  const ForwardCall& c_;
  const Dims& m_;
  std::vector<bf16_t> rows_;  // a key block's rows in bf16, while packing
  std::vector<RowGroup> groups_;
  bool amx_;
  ScratchTile<bf16_t> q_, p_;
  ScratchTile<float> s_, o_, mx_, l_, alpha_, sum_;
};

// ---- Backward --------------------------------------------------------------------------------

// P and dS (FlashAttention-2, Algorithm 2) on register blocks of S = QKᵀ for one key block and
// query tile, two rows at a time: dS rows in bf16 into ds (A of dQ = dS K) and words of row pairs
// of P and dS into p_pairs, ds_pairs (B of dVᵀ = dOᵀ P and dKᵀ = Qᵀ dS); all with KB columns.
struct Dscores {
  TileVisibility vis[KB / B];  // per 64-key panel of the block
  int64_t r0, bi;              // the tile's first query, rows per head (row h·bi + r: query r0 + r)
  float scale;
  const float *dp, *lse2, *delta;  // dP [rows, KB]; lse · log2 e and D of the tile's rows
  bf16_t* ds;
  uint32_t *p_pairs, *ds_pairs;
  ScoreRow row(int64_t rr, int64_t r, int64_t j) const {
    return ScoreRow{dp + rr * KB + j, vis[j / B].row(r0 + r), lse2[rr], delta[rr], scale};
  }
  template <int R, int NV>
  LONGTRON_BF16_TARGET void block(int64_t i, int64_t j, const __m512 (&acc)[R][NV]) {
    // Rows h·bi + r: the query of a row, then of each next one (wrapping to the next head).
    const int64_t ra = i % bi, rb = ra + 1 == bi ? 0 : ra + 1;
    int64_t r[2] = {ra, rb};
#pragma GCC unroll 3
    for (int rr = 0; rr < R; rr += 2) {
      const bool pair = rr + 1 < R;  // an odd last row pairs with zeros
      const int second = pair ? rr + 1 : rr;
      __m512 xa[4], xb[4];
      for (int v = 0; v < 4; ++v) {
        xa[v] = v < NV ? acc[rr][v] : _mm512_setzero_ps();
        xb[v] = v < NV && pair ? acc[second][v] : _mm512_setzero_ps();
      }
      const int64_t ia = i + rr;
      const ScoreRow a = row(ia, r[0], j), b = row(pair ? ia + 1 : ia, pair ? r[1] : r[0], j);
      for (int64_t& x : r)
        for (x += 2; x >= bi;) x -= bi;
      dscores_rows_bf16(xa, a, pair ? xb : nullptr, pair ? &b : nullptr, scale,
                        ds + ia * KB + j, ds + (ia + 1) * KB + j, p_pairs + ia / 2 * KB + j,
                        ds_pairs + ia / 2 * KB + j);
    }
  }
};

// dst = srcᵀ for bf16 rows src [M, lds], x < d: dst[x·ldd + i] = src[i·lds + x] (ldd even), a zero
// column i = M when M is odd. Built as 32-bit words (rows i, i + 1 interleaved by one permute),
// transposed 16 × 16 words at a time.
LONGTRON_BF16_TARGET void transpose_rows(bf16_t* dst, int64_t ldd, const bf16_t* src,
                                         int64_t lds, int64_t M, int64_t d) {
  // Word j takes element j of row i (first operand) and element j of row i + 1 (second).
  const __m512i interleave =
      _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                       6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  alignas(64) uint32_t block[16][16];
  uint32_t* words = reinterpret_cast<uint32_t*>(dst);  // written only by vector stores
  const int64_t M2 = (M + 1) / 2, ldw = ldd / 2;
  for (int64_t i0 = 0; i0 < M2; i0 += 16) {
    const int64_t n2 = std::min<int64_t>(16, M2 - i0);
    for (int64_t x0 = 0; x0 < d; x0 += 16) {
      const int64_t nx = std::min<int64_t>(16, d - x0);
      const __mmask16 mx = static_cast<__mmask16>((1u << nx) - 1);
      for (int64_t r = 0; r < n2; ++r) {
        const int64_t i = 2 * (i0 + r);
        const bf16_t* a = src + i * lds + x0;
        const __m512i lo = _mm512_maskz_loadu_epi16(mx, a);
        const __m512i hi = i + 1 < M ? _mm512_maskz_loadu_epi16(mx, a + lds) : _mm512_setzero_si512();
        _mm512_store_si512(block[r], _mm512_permutex2var_epi16(lo, interleave, hi));
      }
      store_block_transposed(words + x0 * ldw + i0, ldw, block, n2, nx);
    }
  }
}

// 16 values from p (masked by m) as fp32: floats as they are, bf16 widened exactly (bf16 is the
// top half of an fp32: 16-bit lane 2j + 1 takes p[j], the even lanes are zeroed by the mask).
LONGTRON_BF16_TARGET inline __m512 load_widened(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
LONGTRON_BF16_TARGET inline __m512 load_widened(const bf16_t* p, __mmask16 m) {
  const __m512i widen = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7,
                                         0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
  return _mm512_castsi512_ps(
      _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, widen, _mm512_maskz_loadu_epi16(m, p)));
}

// Σ o[x] · g[x] over x < n, g in bf16, o in fp32 or bf16 (widened exactly, so a bf16 o gives
// the bits of its widened floats).
template <typename O>
LONGTRON_BF16_TARGET float dot_bf16(const bf16_t* g, const O* o, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 m = n - x >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - x)) - 1);
    acc = _mm512_fmadd_ps(load_widened(g + x, m), load_widened(o + x, m), acc);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

// The call. Query-side tiles are packed once (BackwardCall's tile order): q and dO as bf16 rows
// (A of S = QKᵀ, dP = dO Vᵀ) and transposed (A of dKᵀ = Qᵀ dS and dVᵀ = dOᵀ P: computing the
// transposed gradients lets P and dS enter as B, pairs of rows, built without a transpose); lse,
// D and the fp32 dq accumulator (dq_tiles). O is read from out, or from its bf16 bits out16
// when that is set.
struct Call : BackwardCall<float, float> {
  float *dk, *dv;
  const float *q, *k, *v, *dout, *out, *lse;
  const uint16_t* out16;
  Dims m;
  bf16_t *pq, *pdout;      // [tile_rows, dp] per tile
  bf16_t *q_t, *dout_t;    // [d, tile_rows] per tile, zero column after an odd row count
  float *lse2, *delta;     // [tile_rows] per tile (lse · log2 e)
  void pack_row(int64_t row, int64_t n, int64_t head) {
    bf16_t* go = &pdout[row * m.dp];
    row_to_bf16(&pq[row * m.dp], q + n * s.q_stride + head * m.d, m.d, m.dp);
    row_to_bf16(go, dout + (n * s.num_heads + head) * m.d, m.d, m.dp);
    // D = rowsum(dO ∘ O) with the rounded dO the products use.
    const int64_t o = (n * s.num_heads + head) * m.d;
    delta[row] = out16 != nullptr ? dot_bf16(go, out16 + o, m.d) : dot_bf16(go, out + o, m.d);
    lse2[row] = lse[head * s.num_tokens + n] * kLog2e;
  }
  void pack_tile(int64_t tile, int64_t base, int64_t M) {
    const int64_t size = m.d * tile_rows;
    transpose_rows(q_t + tile * size, tile_rows, &pq[base * m.dp], m.dp, M, m.d);
    transpose_rows(dout_t + tile * size, tile_rows, &pdout[base * m.dp], m.dp, M, m.d);
  }
};

// The tile math of one thread (a key block of KB keys against its query tiles), its tiles kept
// in the thread's workspace between calls. Score-shaped tiles have KB columns (s: where AMX
// products spill, bf16_gemm_to).
class BackwardTile {
 public:
  explicit BackwardTile(Call& c) : c_(c), m_(c.m) {
    const int64_t tile_rows = c.tile_rows;
    const auto h = scratch_tiles<bf16_t, 2>({KB * m_.dp, tile_rows * KB});
    const auto u = scratch_tiles<uint32_t, 5>(
        {m_.d2 * KB, m_.d2 * KB, KB / 2 * m_.d16, tile_rows / 2 * KB, tile_rows / 2 * KB});
    const auto f = scratch_tiles<float, 4>({tile_rows * KB, tile_rows * KB, m_.d * KB, m_.d * KB});
    rows_ = h[0], ds_ = h[1];
    kw_ = u[0], vw_ = u[1], kp_ = u[2], p_pairs_ = u[3], ds_pairs_ = u[4];
    s_ = f[0], dp_ = f[1], dk_t_ = f[2], dv_t_ = f[3];
  }
  void begin(const AttnSegment&, const AttnItem& it, int64_t, int64_t k0, int64_t bj) {
    const AttentionShape& s = c_.s;
    const int64_t offset = k0 * s.kv_stride + it.kv_head * m_.d;
    key_rows(rows_.data(), c_.k + offset, s.kv_stride, bj, m_);
    pack_words_transposed_fast(kw_.data(), KB, rows_.data(), m_.dp, bj, m_.d2);
    pack_pairs_of_rows(kp_.data(), m_.d16, rows_.data(), m_.dp, bj, m_.d);
    key_rows(rows_.data(), c_.v + offset, s.kv_stride, bj, m_);
    pack_words_transposed_fast(vw_.data(), KB, rows_.data(), m_.dp, bj, m_.d2);
    if (it.first == it.last) {  // keys no query sees
      std::fill(dk_t_.begin(), dk_t_.end(), 0.0f);
      std::fill(dv_t_.begin(), dv_t_.end(), 0.0f);
    }
  }
  // Keys [0, n) of the block are all the query tile sees (the causal edge); its products stop
  // there, which saves half of them where a 64-query tile meets the diagonal of a 128-key block.
  // (Starting past the keys a window hides would move the pairs along K and change the bits.)
  static std::pair<int64_t, int64_t> key_range(const AttnPlan& p, const AttnSegment& sg,
                                               int64_t r0, int64_t bi, int64_t c0, int64_t bj) {
    return {0, std::clamp<int64_t>(p.key_hi(sg, r0 + bi - 1) - c0, 0, bj)};
  }
  void products(const BackwardBlock& b) {
    const int64_t d = m_.d, M = b.M, Mp = round_up(M, 2), n = b.hi, rows = c_.tile_rows;
    const int64_t size = d * rows;
    bf16_gemm(M, n, m_.d2, &c_.pdout[b.base * m_.dp], m_.dp, vw_.data(), KB, dp_.data(), KB,
              false, rows);
    Dscores dscores{{TileVisibility(*b.p, *b.g, b.r0, b.bi, b.c0, std::min(n, B)),
                     TileVisibility(*b.p, *b.g, b.r0, b.bi, b.c0 + B, std::max<int64_t>(n - B, 0))},
                    b.r0,
                    b.bi,
                    static_cast<float>(c_.s.scale),
                    dp_.data(),
                    &c_.lse2[b.base],
                    &c_.delta[b.base],
                    ds_.data(),
                    p_pairs_.data(),
                    ds_pairs_.data()};
    bf16_gemm_to(M, n, m_.d2, &c_.pq[b.base * m_.dp], m_.dp, kw_.data(), KB, dscores, rows,
                 s_.data(), KB);
    bf16_gemm(d, n, Mp / 2, c_.dout_t + b.tile * size, rows, p_pairs_.data(), KB, dv_t_.data(),
              KB, !b.first, d);
    bf16_gemm(d, n, Mp / 2, c_.q_t + b.tile * size, rows, ds_pairs_.data(), KB, dk_t_.data(), KB,
              !b.first, d);
    if (b.first && n < b.bj)  // the block's later tiles add into the columns this one did not write
      for (int64_t x = 0; x < d; ++x) {
        std::fill(&dv_t_[x * KB + n], &dv_t_[x * KB + b.bj], 0.0f);
        std::fill(&dk_t_[x * KB + n], &dk_t_[x * KB + b.bj], 0.0f);
      }
  }
  // The tile's first add writes (no zero fill of dq).
  void add_dq(const BackwardBlock& b, bool accumulate) {
    bf16_gemm(b.M, m_.d, round_up(b.hi, 2) / 2, ds_.data(), KB, kp_.data(), m_.d16,
              &c_.dq_tiles[b.base * m_.d], m_.d, accumulate, c_.tile_rows);
  }
  void end(int64_t offset, int64_t bj) {
    transpose_floats_avx512(c_.dk + offset, c_.s.kv_stride, dk_t_.data(), KB, m_.d, bj);
    transpose_floats_avx512(c_.dv + offset, c_.s.kv_stride, dv_t_.data(), KB, m_.d, bj);
  }

 private:
  Call& c_;
  const Dims& m_;
  ScratchTile<bf16_t> rows_, ds_;
  ScratchTile<uint32_t> kw_, vw_, kp_, p_pairs_, ds_pairs_;
  ScratchTile<float> s_, dp_, dk_t_, dv_t_;
};

}  // namespace

namespace {

void forward(float* out, uint16_t* out16, float* lse, const float* q, const float* k,
             const float* v, const AttentionShape& s) {
  const AttnPlan p = plan_attention(s, false);
  const Dims m(s);
  const int64_t blocks = p.k_blocks * s.num_kv_heads;
  uint32_t* kw_all = workspace<uint32_t>(Arena::kKeys, blocks * m.words_t());
  uint32_t* vp_all = workspace<uint32_t>(Arena::kValues, blocks * m.words_rows());
  const ForwardCall call{s, p, out, lse, out16, q, k, v, m, kw_all, vp_all};
  run_forward<ForwardTile>(call);
}

void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
              const float* v, const float* out, const uint16_t* out16, const float* lse,
              const AttentionShape& s, bool add_dq) {
  const AttnPlan p = plan_attention(s, true, KB);
  const Dims m(s);
  const int64_t tile_rows = m.G * B, tiles = p.q_blocks * s.num_kv_heads;
  const size_t rows = static_cast<size_t>(tiles * tile_rows);
  bf16_t* halves = workspace<bf16_t>(Arena::kQueries, 2 * rows * (m.dp + m.d));
  float* floats = workspace<float>(Arena::kQueryFloats, rows * (2 + m.d));
  Call call{{s, p, tile_rows, floats + 2 * rows,
             workspace<uint8_t>(Arena::kDqWritten, static_cast<size_t>(tiles))},
            dk, dv, q, k, v, dout, out, lse, out16, m,
            halves, halves + rows * m.dp,
            halves + 2 * rows * m.dp, halves + 2 * rows * m.dp + rows * m.d,
            floats, floats + rows};
  run_backward<BackwardTile>(call, dq, add_dq);
}

}  // namespace

void varlen_attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionShape& s) {
  forward(out, nullptr, lse, q, k, v, s);
}

void varlen_attention_forward_bf16_out16(uint16_t* out16, float* lse, const float* q,
                                         const float* k, const float* v, const AttentionShape& s) {
  forward(nullptr, out16, lse, q, k, v, s);
}

void varlen_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const AttentionShape& s,
                                    bool add_dq) {
  backward(dq, dk, dv, dout, q, k, v, out, nullptr, lse, s, add_dq);
}

void varlen_attention_backward_bf16_out16(float* dq, float* dk, float* dv, const float* dout,
                                          const float* q, const float* k, const float* v,
                                          const uint16_t* out16, const float* lse,
                                          const AttentionShape& s) {
  backward(dq, dk, dv, dout, q, k, v, nullptr, out16, lse, s, false);
}

}  // namespace longtron::ops::detail::LONGTRON_BF16_ISA
LONGTRON_ISA_TARGET_END

#ifndef LONGTRON_BF16_EMULATED
namespace longtron::ops::detail {

namespace native {
bool amx_available() {
  static const bool available = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux uapi asm/prctl.h
    // Read once: the AMX tiles are chosen per tile inside the kernels' parallel loops.
    return cpu_has("amx_bf16") && cpu_has("amx_tile") &&
           syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return available;
}

}  // namespace native

namespace {

// Calls the native compilation's entry point where this CPU has AVX512-BF16, else the emulated
// one's (both declared in attention_bf16.h with the same signature).
template <typename... P, typename... A>
void on_this_cpu(void (*native_f)(P...), void (*emulated_f)(P...), A... args) {
  (attention_bf16_native() ? native_f : emulated_f)(args...);
}

}  // namespace

void varlen_attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionShape& s) {
  on_this_cpu(native::varlen_attention_forward_bf16, emulated::varlen_attention_forward_bf16, out,
              lse, q, k, v, s);
}

void varlen_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const AttentionShape& s,
                                    bool add_dq) {
  on_this_cpu(native::varlen_attention_backward_bf16, emulated::varlen_attention_backward_bf16,
              dq, dk, dv, dout, q, k, v, out, lse, s, add_dq);
}

void varlen_attention_forward_bf16_out16(uint16_t* out16, float* lse, const float* q,
                                         const float* k, const float* v, const AttentionShape& s) {
  on_this_cpu(native::varlen_attention_forward_bf16_out16,
              emulated::varlen_attention_forward_bf16_out16, out16, lse, q, k, v, s);
}

void varlen_attention_backward_bf16_out16(float* dq, float* dk, float* dv, const float* dout,
                                          const float* q, const float* k, const float* v,
                                          const uint16_t* out16, const float* lse,
                                          const AttentionShape& s) {
  on_this_cpu(native::varlen_attention_backward_bf16_out16,
              emulated::varlen_attention_backward_bf16_out16, dq, dk, dv, dout, q, k, v, out16,
              lse, s);
}

}  // namespace longtron::ops::detail

namespace longtron::ops {

bool attention_bf16_native() {
  // oneDNN's instruction set is fixed at its first use (after the mask's cap): read it once.
  static const bool gemm_bf16 = gemm_backend().native_bf16;
  return kernel_isa() == KernelIsa::kAvx512 && cpu_has("avx512_bf16") && gemm_bf16;
}

bool attention_bf16_runs() { return attention_bf16_native() || bf16_emulated(); }

}  // namespace longtron::ops
#endif  // LONGTRON_BF16_EMULATED
