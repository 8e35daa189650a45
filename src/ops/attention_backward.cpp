// Varlen causal attention backward, FlashAttention-2 style (Dao 2023, Algorithm 2) on the CPU.
// One work item = (segment, kv head, key block of 64 tokens): the loop over query blocks runs
// inside it (key blocks outer, query blocks inner), so dK and dV of the tile are accumulated
// privately and written once, without atomics. P is recomputed from the saved lse, and
// D = rowsum(dO ∘ O) replaces the softmax Jacobian. The query heads of the kv group are stacked
// as tile rows, so the GQA sum over them is part of the dK/dV GEMMs. dQ of a query block receives
// one tile from each key block; it is added under a lock per (query block, kv head), the CPU
// counterpart of FA2's atomic adds, after the tile is computed in private memory.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "ops/attention_plan.h"
#include "ops/fast_math.h"
#include "ops/ops.h"
#include "ops/tile_gemm.h"

namespace longtron::ops {
namespace {

using detail::kAttnBlock;

template <typename T>
struct BackwardScratch {
  std::vector<T> q, dout, kt, vt, s, dp, dq, dk, dv, lse, delta;
  BackwardScratch(int64_t rows, int64_t d)
      : q(rows * d), dout(rows * d), kt(d * kAttnBlock), vt(d * kAttnBlock),
        s(rows * kAttnBlock), dp(rows * kAttnBlock), dq(rows * d), dk(kAttnBlock * d),
        dv(kAttnBlock * d), lse(rows), delta(rows) {}
};

struct BackwardArgs {
  const AttentionShape* s;
  const void* delta;  // D[N, Hq] = rowsum(dO ∘ O)
  std::mutex* locks;  // one per (global query block, kv head)
};

// Packs the query block's q and dO rows of the kv group (row h·bi + r), with their lse and D.
template <typename T>
void pack_query_block(BackwardScratch<T>& w, const T* q, const T* dout, const T* lse,
                      const T* delta, const AttentionShape& s, int64_t g, int64_t q0, int64_t bi) {
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads;
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = g * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = h * bi + r, n = q0 + r;
      std::memcpy(&w.q[row * d], q + n * s.q_stride + head * d, sizeof(T) * d);
      std::memcpy(&w.dout[row * d], dout + (n * s.num_heads + head) * d, sizeof(T) * d);
      w.lse[row] = lse[head * s.num_tokens + n];
      w.delta[row] = delta[n * s.num_heads + head];
    }
  }
}

// P = exp(scale·S − lse) (0 where masked) into w.s; dS = P ∘ (dP − D) · scale into w.dp.
template <typename T>
void probabilities_and_dscores(BackwardScratch<T>& w, int64_t M, int64_t bi, int64_t bj,
                               int64_t q0, int64_t k0, bool diagonal, T scale) {
  for (int64_t row = 0; row < M; ++row) {
    const int64_t r = row % bi;
    const int64_t valid = diagonal ? std::min(bj, q0 + r - k0 + 1) : bj;
    T* srow = &w.s[row * bj];
    T* dprow = &w.dp[row * bj];
    const T l = w.lse[row], D = w.delta[row];
#pragma omp simd
    for (int64_t c = 0; c < valid; ++c) {
      const T p = detail::fast_exp(srow[c] * scale - l);
      srow[c] = p;
      dprow[c] = p * (dprow[c] - D) * scale;
    }
    for (int64_t c = valid; c < bj; ++c) srow[c] = dprow[c] = T(0);
  }
}

template <typename T>
void backward_item(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* lse, const BackwardArgs& a, const detail::AttnItem& it,
                   BackwardScratch<T>& w) {
  const AttentionShape& s = *a.s;
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, g = it.kv_head;
  const int64_t k0 = it.seg_begin + it.block * kAttnBlock;
  const int64_t bj = std::min(kAttnBlock, it.seg_end - k0);
  const int64_t blocks = (it.seg_end - it.seg_begin + kAttnBlock - 1) / kAttnBlock;
  const T scale = static_cast<T>(s.scale);
  const T* kb = k + k0 * s.kv_stride + g * d;
  const T* vb = v + k0 * s.kv_stride + g * d;
  for (int64_t c = 0; c < bj; ++c) {
    for (int64_t x = 0; x < d; ++x) {
      w.kt[x * bj + c] = kb[c * s.kv_stride + x];
      w.vt[x * bj + c] = vb[c * s.kv_stride + x];
    }
  }
  std::fill(w.dk.begin(), w.dk.end(), T(0));
  std::fill(w.dv.begin(), w.dv.end(), T(0));
  for (int64_t i = it.block; i < blocks; ++i) {
    const int64_t q0 = it.seg_begin + i * kAttnBlock;
    const int64_t bi = std::min(kAttnBlock, it.seg_end - q0), M = G * bi;
    pack_query_block(w, q, dout, lse, static_cast<const T*>(a.delta), s, g, q0, bi);
    std::fill(w.s.begin(), w.s.begin() + M * bj, T(0));
    std::fill(w.dp.begin(), w.dp.begin() + M * bj, T(0));
    detail::tile_gemm<T>(M, bj, d, w.q.data(), d, 1, w.kt.data(), bj, w.s.data(), bj);
    detail::tile_gemm<T>(M, bj, d, w.dout.data(), d, 1, w.vt.data(), bj, w.dp.data(), bj);
    probabilities_and_dscores(w, M, bi, bj, q0, k0, i == it.block, scale);
    // dV += Pᵀ dO and dK += dSᵀ Q (the transposes are strides of A, nothing is copied).
    detail::tile_gemm<T>(bj, d, M, w.s.data(), 1, bj, w.dout.data(), d, w.dv.data(), d);
    detail::tile_gemm<T>(bj, d, M, w.dp.data(), 1, bj, w.q.data(), d, w.dk.data(), d);
    std::fill(w.dq.begin(), w.dq.begin() + M * d, T(0));
    detail::tile_gemm<T>(M, d, bj, w.dp.data(), bj, 1, kb, s.kv_stride, w.dq.data(), d);
    std::lock_guard<std::mutex> lock(a.locks[(it.block_id - it.block + i) * s.num_kv_heads + g]);
    for (int64_t h = 0; h < G; ++h) {
      for (int64_t r = 0; r < bi; ++r) {
        T* dst = dq + (q0 + r) * s.q_stride + (g * G + h) * d;
        const T* src = &w.dq[(h * bi + r) * d];
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) dst[x] += src[x];
      }
    }
  }
  for (int64_t c = 0; c < bj; ++c) {
    std::memcpy(dk + (k0 + c) * s.kv_stride + g * d, &w.dk[c * d], sizeof(T) * d);
    std::memcpy(dv + (k0 + c) * s.kv_stride + g * d, &w.dv[c * d], sizeof(T) * d);
  }
}

}  // namespace

template <typename T>
void varlen_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                               const T* v, const T* out, const T* lse, const AttentionShape& s) {
  detail::validate_attention_shape(s);
  const int64_t N = s.num_tokens, Hq = s.num_heads, d = s.head_dim;
  std::vector<T> delta(N * Hq);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < Hq; ++h) {
      const T* o = out + (n * Hq + h) * d;
      const T* g = dout + (n * Hq + h) * d;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t x = 0; x < d; ++x) sum += o[x] * g[x];
      delta[n * Hq + h] = sum;
      std::memset(dq + n * s.q_stride + h * d, 0, sizeof(T) * d);  // dq is accumulated into
    }
  }
  int64_t total_blocks = 0;
  const std::vector<detail::AttnItem> items = detail::attention_items(s, true, &total_blocks);
  std::unique_ptr<std::mutex[]> locks(new std::mutex[total_blocks * s.num_kv_heads]);
  const BackwardArgs args{&s, delta.data(), locks.get()};
  const int64_t rows = (Hq / s.num_kv_heads) * kAttnBlock;
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    BackwardScratch<T> scratch(rows, d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i)
      backward_item(dq, dk, dv, dout, q, k, v, lse, args, items[i], scratch);
  }
}

template void varlen_attention_backward<float>(float*, float*, float*, const float*, const float*,
                                               const float*, const float*, const float*,
                                               const float*, const AttentionShape&);
template void varlen_attention_backward<double>(double*, double*, double*, const double*,
                                                const double*, const double*, const double*,
                                                const double*, const double*,
                                                const AttentionShape&);

}  // namespace longtron::ops
