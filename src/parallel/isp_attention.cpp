// Ulysses attention (see isp_attention.h).
#include "parallel/isp_attention.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "model/rope_scaling.h"
#include "ops/attention_groups.h"
#include "ops/ops.h"
#include "ops/threads.h"
#include "parallel/mappings.h"

namespace longtron::parallel {

UlyssesHeads ulysses_heads(int64_t hq, int64_t hkv, int64_t T) {
  check(T >= 1, "Ulysses: sequence-parallel size must be >= 1, got {}", T);
  check(hq % T == 0,
        "isp: model.num_attention_heads = {} is not divisible by parallel.tensor.size = {} "
        "(Ulysses scatters the heads over the sequence-parallel ranks)",
        hq, T);
  check(hkv % T == 0 || T % hkv == 0,
        "isp: model.num_kv_attention_heads = {} and parallel.tensor.size = {}: one must divide the "
        "other (kv heads are split, or repeated T / num_kv_attention_heads times)",
        hkv, T);
  const int64_t repeat = hkv % T == 0 ? 1 : T / hkv;
  return UlyssesHeads{hq, hkv, repeat, hq / T, hkv * repeat / T};
}

UlyssesAttention::UlyssesAttention(const model::ModelConfig& c, comm::CommPtr tensor,
                                   std::shared_ptr<Scratch> scratch, comm::CommPtr context,
                                   data::ContextBalance balance, int64_t window,
                                   ContextOptions options)
    : comm_(std::move(tensor)), T_(comm_->size()),
      h_(ulysses_heads(c.num_attention_heads, c.num_kv_attention_heads, comm_->size())),
      d_(c.head_dim()), q_(c.qkv_size()), local_(h_.hq_local + 2 * h_.hkv_local),
      config_(c), inv_freq_(model::rope_inv_freq(c)), window_(window),
      scratch_(scratch ? std::move(scratch) : std::make_shared<Scratch>()),
      compute_(options.compute), group_tokens_(options.group_tokens) {
  if (context && context->size() > 1) {
    C_ = context->size();
    context_ = std::make_unique<ContextAttention>(std::move(context), balance, scratch_->context,
                                                  options);
  }
}

void UlyssesAttention::permute(float* dst, const float* src, int64_t N, bool to_split) const {
  const int64_t hq = h_.hq, hkv = h_.hkv, qpk = hq / hkv;
#pragma omp parallel for schedule(static) if (N * q_ > kParallelMinWork)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < hkv; ++g)
      for (int64_t j = 0; j < qpk + 2; ++j) {
        const int64_t grouped = (g * (qpk + 2) + j) * d_;
        const int64_t head = j < qpk ? g * qpk + j : (j == qpk ? hq + g : hq + hkv + g);
        const float* s = src + n * q_ + (to_split ? grouped : head * d_);
        std::copy(s, s + d_, dst + n * q_ + (to_split ? head * d_ : grouped));
      }
}

void UlyssesAttention::pack(float* dst, const float* split, int64_t N) const {
  const int64_t row = T_ * local_ * d_;
#pragma omp parallel for schedule(static) if (N * row > kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* s = split + n * q_;
    for (int64_t j = 0; j < T_; ++j) {
      float* o = dst + n * row + j * local_ * d_;
      const float* q = s + j * h_.hq_local * d_;
      o = std::copy(q, q + h_.hq_local * d_, o);
      for (int64_t kv = 0; kv < 2; ++kv)  // k heads, then v heads
        for (int64_t t = 0; t < h_.hkv_local; ++t) {
          const int64_t g = (j * h_.hkv_local + t) / h_.repeat;  // original kv head
          const float* src = s + (h_.hq + kv * h_.hkv + g) * d_;
          o = std::copy(src, src + d_, o);
        }
    }
  }
}

void UlyssesAttention::pack_back(float* split, const float* src, int64_t N) const {
  const int64_t row = T_ * local_ * d_;
#pragma omp parallel for schedule(static) if (N * row > kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    float* s = split + n * q_;
    std::fill(s + h_.hq * d_, s + q_, 0.f);  // kv gradients are sums over copies
    for (int64_t j = 0; j < T_; ++j) {
      const float* i = src + n * row + j * local_ * d_;
      std::copy(i, i + h_.hq_local * d_, s + j * h_.hq_local * d_);
      i += h_.hq_local * d_;
      for (int64_t kv = 0; kv < 2; ++kv)
        for (int64_t t = 0; t < h_.hkv_local; ++t, i += d_) {
          const int64_t g = (j * h_.hkv_local + t) / h_.repeat;
          float* dst = s + (h_.hq + kv * h_.hkv + g) * d_;
          for (int64_t e = 0; e < d_; ++e) dst[e] += i[e];
        }
    }
  }
}

model::AttentionBatch UlyssesAttention::check_batch(const model::AttentionBatch& b) const {
  const int64_t total = b.num_tokens * T_ * C_;
  check(b.num_segments >= 1, "isp: a batch needs at least one segment, got {}", b.num_segments);
  check(b.cu_seqlens[0] == 0 && b.cu_seqlens[b.num_segments] == total,
        "isp: cu_seqlens must stay global: 0 … {} (= {} local tokens x parallel.tensor.size {}), "
        "got {} … {}",
        total, b.num_tokens, T_ * C_, b.cu_seqlens[0], b.cu_seqlens[b.num_segments]);
  model::AttentionBatch g = b;
  g.num_tokens = b.num_tokens * T_;  // the tokens after the head all-to-all (the context share)
  return g;
}

void UlyssesAttention::forward(float* out, float* saved, float* lse, const float* qkv,
                               const model::AttentionBatch& b) {
  const int64_t N = b.num_tokens;
  const model::AttentionBatch g = check_batch(b);
  float* qkv_g = saved;                         // [T·N, local, d]
  float* out_g = saved + T_ * N * local_ * d_;  // [T·N, hq_local, d]
  model::check_rope_positions(config_, b.indexes, N);
  if (T_ == 1) {
    // No all-to-all (head size 1, e.g. pure context parallel): the split order is the saved one.
    permute(qkv_g, qkv, N, /*to_split=*/true);
    ops::rope_forward(qkv_g, b.indexes, N, h_.hq + h_.hkv, d_, q_, inv_freq_.data());
  } else {
    std::vector<float>& split = scratch_->split;
    std::vector<float>& packed = scratch_->packed;
    split.resize(static_cast<size_t>(N * q_));
    packed.resize(static_cast<size_t>(N * T_ * local_ * d_));
    permute(split.data(), qkv, N, /*to_split=*/true);
    // RoPE is per token, so the local (split) indexes rotate q and k before the swap.
    ops::rope_forward(split.data(), b.indexes, N, h_.hq + h_.hkv, d_, q_, inv_freq_.data());
    pack(packed.data(), split.data(), N);
    ulysses_scatter_heads(qkv_g, packed.data(), N, T_ * local_, d_, *comm_);
  }
  const int64_t stride = local_ * d_;
  ops::AttentionShape s{g.num_tokens, h_.hq_local, h_.hkv_local, d_, stride, stride,
                        g.cu_seqlens, g.num_segments, 1.0 / std::sqrt(double(d_))};
  s.window = window_;  // under context parallelism too: positions stay those of the document
  if (context_)
    context_->forward(out_g, lse, qkv_g, qkv_g + h_.hq_local * d_,
                      qkv_g + (h_.hq_local + h_.hkv_local) * d_, s);
  else
    ops::varlen_attention_forward_groups(*compute_, out_g, lse, qkv_g, qkv_g + h_.hq_local * d_,
                                         qkv_g + (h_.hq_local + h_.hkv_local) * d_, s,
                                         group_tokens_);
  ulysses_gather_heads(out, out_g, N, h_.hq, d_, *comm_);
}

void UlyssesAttention::backward(float* dqkv, float* scratch, const float* dout, const float* saved,
                                const float* /*out*/, const float* lse,
                                const model::AttentionBatch& b) {
  const int64_t N = b.num_tokens;
  const model::AttentionBatch g = check_batch(b);
  const float* qkv_g = saved;
  const float* out_g = saved + T_ * N * local_ * d_;
  float* dqkv_g = scratch;                         // [T·N, local, d]
  float* dout_g = scratch + T_ * N * local_ * d_;  // [T·N, hq_local, d]
  ulysses_scatter_heads(dout_g, dout, N, h_.hq, d_, *comm_);
  const int64_t stride = local_ * d_;
  ops::AttentionShape s{g.num_tokens, h_.hq_local, h_.hkv_local, d_, stride, stride,
                        g.cu_seqlens, g.num_segments, 1.0 / std::sqrt(double(d_))};
  s.window = window_;
  if (context_)
    context_->backward(dqkv_g, dqkv_g + h_.hq_local * d_,
                       dqkv_g + (h_.hq_local + h_.hkv_local) * d_, dout_g, qkv_g,
                       qkv_g + h_.hq_local * d_, qkv_g + (h_.hq_local + h_.hkv_local) * d_, out_g,
                       lse, s);
  else
    ops::varlen_attention_backward_groups(*compute_, dqkv_g, dqkv_g + h_.hq_local * d_,
                                          dqkv_g + (h_.hq_local + h_.hkv_local) * d_, dout_g,
                                          qkv_g, qkv_g + h_.hq_local * d_,
                                          qkv_g + (h_.hq_local + h_.hkv_local) * d_, out_g, lse, s,
                                          group_tokens_);
  if (T_ == 1) {  // no all-to-all: the gradient is in split order already (forward's adjoint)
    ops::rope_backward(dqkv_g, b.indexes, N, h_.hq + h_.hkv, d_, q_, inv_freq_.data());
    permute(dqkv, dqkv_g, N, /*to_split=*/false);
    return;
  }
  std::vector<float>& split = scratch_->split;
  std::vector<float>& packed = scratch_->packed;
  split.resize(static_cast<size_t>(N * q_));
  packed.resize(static_cast<size_t>(N * T_ * local_ * d_));
  ulysses_gather_heads(packed.data(), dqkv_g, N, T_ * local_, d_, *comm_);
  pack_back(split.data(), packed.data(), N);
  ops::rope_backward(split.data(), b.indexes, N, h_.hq + h_.hkv, d_, q_, inv_freq_.data());
  permute(dqkv, split.data(), N, /*to_split=*/false);
}

}  // namespace longtron::parallel
