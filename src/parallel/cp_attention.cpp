// Context-parallel attention, all-gather form (see cp_attention.h).
#include "parallel/cp_attention.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "ops/threads.h"
#include "parallel/kv_rows.h"

namespace longtron::parallel {

ContextAttention::ContextAttention(comm::CommPtr context, data::ContextBalance balance,
                                   std::shared_ptr<ContextScratch> scratch, ContextOptions options)
    : comm_(std::move(context)), balance_(balance),
      scratch_(scratch ? std::move(scratch) : std::make_shared<ContextScratch>()),
      compute_(options.compute) {
  if (options.form == ContextForm::kRing && comm_->size() > 1)
    ring_ = std::make_unique<RingAttention>(
        comm_, balance_, RingSchedule(comm_->size(), options.window_size, options.interleaved),
        scratch_->ring, *compute_, options.group_tokens);
}

const ContextPlan& ContextAttention::plan(const ops::AttentionShape& s) const {
  const int64_t C = comm_->size(), M = s.num_tokens;
  check(s.num_segments >= 1, "context parallel: a batch needs at least one segment, got {}",
        s.num_segments);
  const std::span<const int32_t> cu(s.cu_seqlens, static_cast<size_t>(s.num_segments + 1));
  check(cu.back() == C * M,
        "context parallel: cu_seqlens must stay global: 0 … {} (= {} local tokens x {} context "
        "ranks), got … {}",
        C * M, M, C, cu.back());
  ContextPlan& p = scratch_->plan;
  if (std::equal(cu.begin(), cu.end(), p.cu_seqlens.begin(), p.cu_seqlens.end())) return p;
  const auto shares = data::context_assignment(cu, C, balance_);
  std::vector<int32_t> gathered(static_cast<size_t>(C * M));  // row position → all-gather row
  for (int64_t r = 0; r < C; ++r)
    for (int64_t i = 0; i < M; ++i) gathered[shares[r][i]] = static_cast<int32_t>(r * M + i);
  p.segments = data::context_segments(cu, shares[comm_->rank()]);
  p.key_rows.clear();
  for (const auto& [a, b] : p.segments.key_ranges)
    for (int32_t x = a; x < b; ++x) p.key_rows.push_back(gathered[x]);
  p.cu_seqlens.assign(cu.begin(), cu.end());
  return p;
}

void ContextAttention::gather_keys(const float* k, const float* v,
                                   const ops::AttentionShape& s) const {
  const int64_t M = s.num_tokens, kv = s.num_kv_heads * s.head_dim, C = comm_->size();
  ContextScratch& b = *scratch_;
  interleave_kv(b.kv_local, k, v, M, kv, s.kv_stride);
  b.kv_row.resize(static_cast<size_t>(C * M * 2 * kv));
  comm_->all_gather(b.kv_row.data(), b.kv_local.data(), M * 2 * kv);
  const std::vector<int32_t>& rows = b.plan.key_rows;
  b.keys.resize(rows.size() * static_cast<size_t>(2 * kv));
#pragma omp parallel for schedule(static) if (rows.size() * kv > kParallelMinWork)
  for (size_t j = 0; j < rows.size(); ++j) {
    const float* src = b.kv_row.data() + int64_t(rows[j]) * 2 * kv;
    std::copy(src, src + 2 * kv, b.keys.data() + j * 2 * kv);
  }
}

ops::AttentionShape ContextAttention::kernel_shape(const ops::AttentionShape& s) const {
  const ContextPlan& p = scratch_->plan;
  ops::AttentionShape k = s;
  k.kv_stride = 2 * s.num_kv_heads * s.head_dim;
  k.cu_seqlens = p.segments.cu_seqlens_q.data();
  k.num_segments = static_cast<int64_t>(p.segments.key_ranges.size());
  k.cu_seqlens_k = p.segments.cu_seqlens_k.data();
  k.num_kv_tokens = static_cast<int64_t>(p.key_rows.size());
  return k;
}

void ContextAttention::forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const ops::AttentionShape& s) const {
  check(s.cu_seqlens_k == nullptr, "context parallel: the local shape must not have key segments");
  if (ring_) return ring_->forward(out, lse, q, k, v, s);
  plan(s);
  gather_keys(k, v, s);
  const ops::AttentionShape ks = kernel_shape(s);
  const float* keys = scratch_->keys.data();
  ops::varlen_attention_forward(*compute_, out, lse, q, keys, keys + s.num_kv_heads * s.head_dim,
                                ks);
}

void ContextAttention::backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* out,
                                const float* lse, const ops::AttentionShape& s) const {
  if (ring_) return ring_->backward(dq, dk, dv, dout, q, k, v, out, lse, s);
  plan(s);
  gather_keys(k, v, s);  // re-gathered: nothing row-sized lives between the passes
  const ops::AttentionShape ks = kernel_shape(s);
  ContextScratch& b = *scratch_;
  const int64_t kv = s.num_kv_heads * s.head_dim, M = s.num_tokens;
  b.dkeys.resize(b.keys.size());
  const float* keys = b.keys.data();
  ops::varlen_attention_backward(*compute_, dq, b.dkeys.data(), b.dkeys.data() + kv, dout, q, keys,
                                 keys + kv, out, lse, ks);
  // Σ of the key buffer's gradients into the row (a key can sit in several runs), then home.
  std::fill(b.kv_row.begin(), b.kv_row.end(), 0.f);
  add_rows(b.kv_row.data(), b.dkeys.data(), b.plan.key_rows, 2 * kv);
  comm_->reduce_scatter(b.kv_local.data(), b.kv_row.data(), M * 2 * kv);
  split_kv(dk, dv, b.kv_local.data(), M, kv, s.kv_stride);
}

}  // namespace longtron::parallel
