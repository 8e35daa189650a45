// bf16 varlen attention on AVX512-BF16 (and AMX tiles where available): the loop structure of
// attention.cpp (forward, FA2 Algorithm 1) and attention_backward.cpp (backward, Algorithm 2, with
// 128-key blocks) with every tile product in bf16 × bf16 → fp32 (bf16_tile_gemm.h). Inputs are
// rounded to bf16 once, while they are packed into the layouts vdpbf16ps reads (pairs along the
// reduction dimension); the softmax, lse, D and all accumulators stay fp32, and P and dS are
// rounded to bf16 only as GEMM inputs, as in FlashAttention-2's bf16 kernels (Dao 2023). The
// scores never reach memory: each register block of S = QKᵀ goes straight into the online softmax
// or into P and dS (bf16_tile_blocks.h, attention_rows_bf16.h). This file is compiled twice: as
// itself (namespace native) and through attention_bf16_emulated.cpp (namespace emulated, the bf16
// instructions emulated in AVX-512F, no AMX).
#include "ops/attention_bf16.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "ops/attention_dq_order.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/attention_rows_bf16.h"
#include "ops/attention_transpose.h"
#include "ops/bf16_tile_blocks.h"
#include "ops/bf16_tile_gemm.h"
#include "ops/precision.h"

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

// Per-thread tiles of one item, kept in the thread's workspace between calls (s: where AMX
// products spill, bf16_gemm_to; the S and PV products take turns in it).
struct ForwardScratch {
  ScratchTile<bf16_t> q, p;
  ScratchTile<float> s, o, m, l, alpha, sum;
  ForwardScratch(int64_t rows, const Dims& dm) {
    const auto h = scratch_tiles<bf16_t, 2>({rows * dm.dp, rows * B});
    const auto f = scratch_tiles<float, 6>(
        {rows * std::max(B, dm.d16), rows * dm.d, rows, rows, rows, rows});
    q = h[0], p = h[1], s = f[0], o = f[1], m = f[2], l = f[3], alpha = f[4], sum = f[5];
  }
};

// Which of the keys [c0, c0 + n) (n ≤ 64) the queries [r0, r0 + bi) of a segment see, as lanes.
// Where every query sees all of them (most tiles off the diagonal), one set of lanes serves all
// rows and the per-row bounds are skipped.
struct TileVisibility {
  const AttnPlan* plan;
  const AttnSegment* g;
  int64_t c0, n;
  bool full;          // key_lo is non-decreasing and key_hi increasing in the query position
  KeyLanes all;
  TileVisibility(const AttnPlan& p, const AttnSegment& seg, int64_t r0, int64_t bi, int64_t c0_,
                 int64_t n_)
      : plan(&p), g(&seg), c0(c0_), n(n_),
        full(p.key_lo(seg, r0 + bi - 1) <= c0_ && p.key_hi(seg, r0) >= c0_ + n_), all(0, n_) {}
  /// Lanes of query r (segment position).
  KeyLanes row(int64_t r) const {
    if (full) return all;
    return KeyLanes(std::clamp<int64_t>(plan->key_lo(*g, r) - c0, 0, n),
                        std::clamp<int64_t>(plan->key_hi(*g, r) - c0, 0, n));
  }
};

// The online softmax (FlashAttention-2, Algorithm 1) on register blocks of S = QKᵀ for one key
// block, in base 2 (scale2 = scale · log2 e, maxima of scale2 · S): per row, P in bf16 into p
// (stride 64), the new max into m, the previous one into m_old and P's row sum into sum.
// finish_online_softmax then turns m_old into the output accumulator's factor (applied by
// RescaleAdd) and updates l.
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
      __m512 x[4];
      for (int v = 0; v < 4; ++v) x[v] = v < NV ? acc[k][v] : _mm512_setzero_ps();
      softmax_row_bf16(x, vis.row(r0 + r), scale2, m[row], m_old[row], sum[row], p + row * B);
      if (++r == bi) r = 0;
    }
  }
};

// Kᵀ words and V pairs of rows of every (key block, kv head), once per call.
void pack_forward_keys(uint32_t* kw_all, uint32_t* vp_all, const float* k, const float* v,
                       const AttentionShape& s, const AttnPlan& p, const AttnItem& it,
                       const Dims& m, bf16_t* rows) {
  const AttnSegment& g = p.segments[it.seg];
  const int64_t c0 = it.block * B, bj = std::min(B, g.k_len - c0);
  const int64_t index = (g.k_block0 + it.block) * s.num_kv_heads + it.kv_head;
  const int64_t offset = (g.k_begin + c0) * s.kv_stride + it.kv_head * m.d;
  key_rows(rows, k + offset, s.kv_stride, bj, m);
  pack_words_transposed_fast(kw_all + index * m.words_t(), B, rows, m.dp, bj, m.d2);
  key_rows(rows, v + offset, s.kv_stride, bj, m);
  pack_pairs_of_rows(vp_all + index * m.words_rows(), m.d16, rows, m.dp, bj, m.d);
}

void forward_item(float* out, float* lse, const float* q, const uint32_t* kw_all,
                  const uint32_t* vp_all, const AttentionShape& s, const AttnPlan& p,
                  const AttnItem& it, const Dims& m, ForwardScratch& w) {
  const AttnSegment& g = p.segments[it.seg];
  const int64_t d = m.d, G = m.G, N = s.num_tokens;
  const int64_t r0 = it.block * B, q0 = g.q_begin + r0;
  const int64_t bi = std::min(B, g.q_len - r0), M = G * bi;
  const float scale2 = static_cast<float>(s.scale) * kLog2e;
  for (int64_t h = 0; h < G; ++h)
    for (int64_t r = 0; r < bi; ++r)
      row_to_bf16(&w.q[(h * bi + r) * m.dp],
                  q + (q0 + r) * s.q_stride + (it.kv_head * G + h) * d, d, m.dp);
  if (it.first == it.last) std::fill(w.o.begin(), w.o.begin() + M * d, 0.0f);
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.end(), 0.0f);
  RescaleAdd rescale{w.o.data(), d, w.alpha.data(), true};
  RowGroup groups[4 * B];  // ≤ 4 per head (64 keys = 4 vectors), G ≤ 64 heads per kv head
  const bool amx = amx_available();
  for (int64_t j = it.first; j < it.last; ++j) {
    const int64_t c0 = j * B, bj = std::min(B, g.k_len - c0), bjp = round_up(bj, 2);
    const int64_t index = (g.k_block0 + j) * s.num_kv_heads + it.kv_head;
    OnlineSoftmax softmax{TileVisibility(p, g, r0, bi, c0, bj),
                          r0,
                          bi,
                          scale2,
                          w.m.data(),
                          w.alpha.data(),
                          w.sum.data(),
                          w.p.data()};
    rescale.first = j == it.first;
    const uint32_t* kw = kw_all + index * m.words_t();
    const uint32_t* vp = vp_all + index * m.words_rows();
    if (softmax.vis.full || amx || G > 64) {
      bf16_gemm_to(M, bj, m.d2, w.q.data(), m.dp, kw, B, softmax, m.G * B, w.s.data(), B);
      finish_online_softmax(M, w.m.data(), w.alpha.data(), w.sum.data(), w.l.data());
      bf16_gemm_to(M, d, bjp / 2, w.p.data(), B, vp, m.d16, rescale, m.G * B, w.s.data(), m.d16);
      continue;
    }
    // The causal edge: each group of rows stops its PV product at the last 16-key vector it
    // sees. The same values as the whole tile's product (the keys left out hold P = 0), fewer
    // products. (Stopping the S product too needs narrower register blocks, which ran slower.)
    const int64_t n_groups = edge_row_groups(groups, p, g, r0, bi, G, c0, bj);
    bf16_gemm_to(M, bj, m.d2, w.q.data(), m.dp, kw, B, softmax, m.G * B, w.s.data(), B);
    finish_online_softmax(M, w.m.data(), w.alpha.data(), w.sum.data(), w.l.data());
    for (int64_t k = 0; k < n_groups; ++k)
      bf16_row_range_to(groups[k].i0, groups[k].i1, d, std::min(16 * groups[k].nv, bjp) / 2,
                        w.p.data(), B, vp, m.d16, rescale);
  }
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = it.kv_head * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = h * bi + r;
      const float inv = w.l[row] > 0.0f ? 1.0f / w.l[row] : 0.0f;
      float* orow = out + (q0 + r) * s.num_heads * d + head * d;
      for (int64_t x = 0; x < d; ++x) orow[x] = w.o[row * d + x] * inv;
      lse[head * N + q0 + r] = w.l[row] > 0.0f ? w.m[row] * kLn2 + std::log(w.l[row])
                                               : -std::numeric_limits<float>::infinity();
    }
  }
}

// ---- Backward --------------------------------------------------------------------------------

// Query-side tiles of the call, packed once (tile of (query block b, kv head g) at index
// b·Hkv + g, rows h·bi + r as in the forward): q and dO as bf16 rows (A of S = QKᵀ, dP = dO Vᵀ)
// and transposed (A of dKᵀ = Qᵀ dS and dVᵀ = dOᵀ P: computing the transposed gradients lets P and
// dS enter as B, pairs of rows, built without a transpose); lse, D and the fp32 dq accumulator.
struct PackedQueries {
  int64_t tile_rows;
  bf16_t *q, *dout;      // [tile_rows, dp] per tile
  bf16_t *q_t, *dout_t;  // [d, tile_rows] per tile, zero column after an odd row count
  float *lse2, *delta, *dq;  // [tile_rows], [tile_rows], [tile_rows, d] per tile (lse · log2 e)
  uint8_t* dq_written;      // per tile: whether a key block has written its dq yet
};

enum class Move { kPack, kStore, kAdd };

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

// Per-thread tiles of one item (a key block of KB keys), kept in the thread's workspace between
// calls. Score-shaped tiles have KB columns (s: where AMX products spill, bf16_gemm_to).
struct BackwardScratch {
  ScratchTile<bf16_t> rows, ds;
  ScratchTile<uint32_t> kw, vw, kp, p_pairs, ds_pairs;
  ScratchTile<float> s, dp, dk_t, dv_t;
  BackwardScratch(int64_t tile_rows, const Dims& m) {
    const auto h = scratch_tiles<bf16_t, 2>({KB * m.dp, tile_rows * KB});
    const auto u = scratch_tiles<uint32_t, 5>(
        {m.d2 * KB, m.d2 * KB, KB / 2 * m.d16, tile_rows / 2 * KB, tile_rows / 2 * KB});
    const auto f = scratch_tiles<float, 4>({tile_rows * KB, tile_rows * KB, m.d * KB, m.d * KB});
    rows = h[0], ds = h[1];
    kw = u[0], vw = u[1], kp = u[2], p_pairs = u[3], ds_pairs = u[4];
    s = f[0], dp = f[1], dk_t = f[2], dv_t = f[3];
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

// Σ o[x] · g[x] over x < n, g in bf16 (widened exactly: bf16 is the top half of an fp32).
LONGTRON_BF16_TARGET float dot_bf16(const bf16_t* g, const float* o, int64_t n) {
  // 16-bit lane 2j + 1 takes g[j]; the even lanes (low halves) are zeroed by the mask.
  const __m512i widen = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7,
                                         0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 m = n - x >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - x)) - 1);
    const __m512i w = _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, widen,
                                                     _mm512_maskz_loadu_epi16(m, g + x));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(w), _mm512_maskz_loadu_ps(m, o + x), acc);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

// Packs (kPack) the query block of `it` into PackedQueries with its lse and D, or moves its fp32
// dq into the caller's layout, overwriting (kStore) or adding to (kAdd) it.
void move_query_block(PackedQueries& pq, float* dq, const float* q, const float* dout,
                      const float* out, const float* lse, const AttentionShape& s,
                      const AttnPlan& p, const AttnItem& it, const Dims& m, Move move) {
  const AttnSegment& sg = p.segments[it.seg];
  const int64_t d = m.d, G = m.G, g = it.kv_head;
  const int64_t q0 = sg.q_begin + it.block * B, bi = std::min(B, sg.q_len - it.block * B);
  const int64_t tile = (sg.q_block0 + it.block) * s.num_kv_heads + g;
  const int64_t base = tile * pq.tile_rows;
  // A tile no key block added into: its queries see no key (possible with key_offsets).
  if (move != Move::kPack && !pq.dq_written[tile])
    std::fill_n(&pq.dq[base * d], G * bi * d, 0.0f);
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = g * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = base + h * bi + r, n = q0 + r;
      float* dst = dq + n * s.q_stride + head * d;
      if (move == Move::kStore) {
        std::memcpy(dst, &pq.dq[row * d], sizeof(float) * d);
        continue;
      }
      if (move == Move::kAdd) {
        const float* src = &pq.dq[row * d];
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) dst[x] += src[x];
        continue;
      }
      bf16_t* go = &pq.dout[row * m.dp];
      row_to_bf16(&pq.q[row * m.dp], q + n * s.q_stride + head * d, d, m.dp);
      row_to_bf16(go, dout + (n * s.num_heads + head) * d, d, m.dp);
      // D = rowsum(dO ∘ O) with the rounded dO the products use.
      pq.delta[row] = dot_bf16(go, out + (n * s.num_heads + head) * d, d);
      pq.lse2[row] = lse[head * s.num_tokens + n] * kLog2e;
    }
  }
  if (move != Move::kPack) return;
  const int64_t M = G * bi, size = d * pq.tile_rows;
  transpose_rows(pq.q_t + tile * size, pq.tile_rows, &pq.q[base * m.dp], m.dp, M, d);
  transpose_rows(pq.dout_t + tile * size, pq.tile_rows, &pq.dout[base * m.dp], m.dp, M, d);
}

void backward_item(float* dk, float* dv, const float* k, const float* v, PackedQueries& pq,
                   DqOrder& order, const AttentionShape& s, const AttnPlan& p,
                   const AttnItem& it, const Dims& m, BackwardScratch& w) {
  const AttnSegment& sg = p.segments[it.seg];
  const int64_t d = m.d, G = m.G, g = it.kv_head;
  const int64_t c0 = it.block * KB, k0 = sg.k_begin + c0;
  const int64_t bj = std::min(KB, sg.k_len - c0);
  const float scale = static_cast<float>(s.scale);
  const int64_t offset = k0 * s.kv_stride + g * d;
  key_rows(w.rows.data(), k + offset, s.kv_stride, bj, m);
  pack_words_transposed_fast(w.kw.data(), KB, w.rows.data(), m.dp, bj, m.d2);
  pack_pairs_of_rows(w.kp.data(), m.d16, w.rows.data(), m.dp, bj, d);
  key_rows(w.rows.data(), v + offset, s.kv_stride, bj, m);
  pack_words_transposed_fast(w.vw.data(), KB, w.rows.data(), m.dp, bj, m.d2);
  if (it.first == it.last) {  // keys no query sees
    std::fill(w.dk_t.begin(), w.dk_t.end(), 0.0f);
    std::fill(w.dv_t.begin(), w.dv_t.end(), 0.0f);
  }
  const int64_t size = d * pq.tile_rows;
  for (int64_t i = it.first; i < it.last; ++i) {
    const int64_t r0 = i * B, bi = std::min(B, sg.q_len - r0), M = G * bi;
    const int64_t Mp = round_up(M, 2);
    const int64_t tile = (sg.q_block0 + i) * s.num_kv_heads + g;
    const int64_t base = tile * pq.tile_rows;
    const bool first = i == it.first;
    const int64_t rows = pq.tile_rows;
    // Keys [0, n) of the block are all this tile sees (the causal edge); its products stop there,
    // which saves half of them where a 64-query tile meets the diagonal of a 128-key block.
    const int64_t n = std::clamp<int64_t>(p.key_hi(sg, r0 + bi - 1) - c0, 0, bj);
    bf16_gemm(M, n, m.d2, &pq.dout[base * m.dp], m.dp, w.vw.data(), KB, w.dp.data(), KB, false,
              rows);
    Dscores dscores{{TileVisibility(p, sg, r0, bi, c0, std::min(n, B)),
                     TileVisibility(p, sg, r0, bi, c0 + B, std::max<int64_t>(n - B, 0))},
                    r0,
                    bi,
                    scale,
                    w.dp.data(),
                    &pq.lse2[base],
                    &pq.delta[base],
                    w.ds.data(),
                    w.p_pairs.data(),
                    w.ds_pairs.data()};
    bf16_gemm_to(M, n, m.d2, &pq.q[base * m.dp], m.dp, w.kw.data(), KB, dscores, rows,
                 w.s.data(), KB);
    bf16_gemm(d, n, Mp / 2, pq.dout_t + tile * size, pq.tile_rows, w.p_pairs.data(), KB,
              w.dv_t.data(), KB, !first, d);
    bf16_gemm(d, n, Mp / 2, pq.q_t + tile * size, pq.tile_rows, w.ds_pairs.data(), KB,
              w.dk_t.data(), KB, !first, d);
    if (first && n < bj)  // the block's later tiles add into the columns this one did not write
      for (int64_t x = 0; x < d; ++x) {
        std::fill(&w.dv_t[x * KB + n], &w.dv_t[x * KB + bj], 0.0f);
        std::fill(&w.dk_t[x * KB + n], &w.dk_t[x * KB + bj], 0.0f);
      }
    // dQ += dS K, straight into the shared tile on this block's turn (attention_dq_order.h).
    // The tile's first add writes (no zero fill of dq); dq_written is read and set only on the
    // tile's turn, so never concurrently.
    order.wait(tile, it.block);
    bf16_gemm(M, d, round_up(n, 2) / 2, w.ds.data(), KB, w.kp.data(), m.d16, &pq.dq[base * d], d,
              pq.dq_written[tile] != 0, rows);
    pq.dq_written[tile] = 1;
    order.pass(tile, it.block);
  }
  transpose_floats_avx512(dk + offset, s.kv_stride, w.dk_t.data(), KB, d, bj);
  transpose_floats_avx512(dv + offset, s.kv_stride, w.dv_t.data(), KB, d, bj);
}

}  // namespace

void varlen_attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionShape& s) {
  const AttnPlan p = plan_attention(s, false);
  const Dims m(s);
  const int64_t blocks = p.k_blocks * s.num_kv_heads;
  uint32_t* kw_all = workspace<uint32_t>(Arena::kKeys, blocks * m.words_t());
  uint32_t* vp_all = workspace<uint32_t>(Arena::kValues, blocks * m.words_rows());
  const int64_t n_items = static_cast<int64_t>(p.items.size());
  const int64_t n_keys = static_cast<int64_t>(p.k_side.size());
#pragma omp parallel
  {
    std::vector<bf16_t> rows(B * m.dp);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_keys; ++i)
      pack_forward_keys(kw_all, vp_all, k, v, s, p, p.k_side[i], m, rows.data());
    ForwardScratch scratch(m.G * B, m);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i)
      forward_item(out, lse, q, kw_all, vp_all, s, p, p.items[i], m, scratch);
  }
}

void varlen_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const AttentionShape& s,
                                    bool add_dq) {
  const AttnPlan p = plan_attention(s, true, KB);
  const Dims m(s);
  const int64_t tile_rows = m.G * B, tiles = p.q_blocks * s.num_kv_heads;
  const size_t rows = static_cast<size_t>(tiles * tile_rows);
  bf16_t* halves = workspace<bf16_t>(Arena::kQueries, 2 * rows * (m.dp + m.d));
  float* floats = workspace<float>(Arena::kQueryFloats, rows * (2 + m.d));
  PackedQueries pq{tile_rows,
                   halves,
                   halves + rows * m.dp,
                   halves + 2 * rows * m.dp,
                   halves + 2 * rows * m.dp + rows * m.d,
                   floats,
                   floats + rows,
                   floats + 2 * rows,
                   workspace<uint8_t>(Arena::kDqWritten, static_cast<size_t>(tiles))};
  std::fill_n(pq.dq_written, tiles, uint8_t(0));
  DqOrder order(p, s.num_kv_heads);
  ChainClaim items(p);  // chains in block order (what DqOrder needs), largest first
  const int64_t n_queries = static_cast<int64_t>(p.q_side.size());
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_queries; ++i)
      move_query_block(pq, dq, q, dout, out, lse, s, p, p.q_side[i], m, Move::kPack);
    BackwardScratch scratch(tile_rows, m);
    int64_t chain = -1;
    for (int64_t i = items.claim(chain); i >= 0; i = items.claim(chain))
      backward_item(dk, dv, k, v, pq, order, s, p, p.items[i], m, scratch);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_queries; ++i)
      move_query_block(pq, dq, q, dout, out, lse, s, p, p.q_side[i], m,
                       add_dq ? Move::kAdd : Move::kStore);
  }
}

}  // namespace longtron::ops::detail::LONGTRON_BF16_ISA

#ifndef LONGTRON_BF16_EMULATED
namespace longtron::ops::detail {

namespace native {
bool amx_available() {
  static const bool available = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux uapi asm/prctl.h
    // Read once: the AMX tiles are chosen per tile inside the kernels' parallel loops.
    if (cpu_feature_masked("amx_bf16")) return false;
    return amx_bf16 && amx_tile && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return available;
}

}  // namespace native

void varlen_attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionShape& s) {
  if (attention_bf16_native()) {
    native::varlen_attention_forward_bf16(out, lse, q, k, v, s);
  } else {
    emulated::varlen_attention_forward_bf16(out, lse, q, k, v, s);
  }
}

void varlen_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, const AttentionShape& s,
                                    bool add_dq) {
  if (attention_bf16_native()) {
    native::varlen_attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, add_dq);
  } else {
    emulated::varlen_attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, add_dq);
  }
}

}  // namespace longtron::ops::detail

namespace longtron::ops {

bool attention_bf16_native() {
  static const bool native = __builtin_cpu_supports("avx512bf16") && gemm_backend().native_bf16;
  return native && cpu_has_avx512_bf16();  // the latter honours kCpuFeaturesMaskEnv
}

bool attention_bf16_runs() { return attention_bf16_native() || bf16_emulated(); }

}  // namespace longtron::ops
#endif  // LONGTRON_BF16_EMULATED
