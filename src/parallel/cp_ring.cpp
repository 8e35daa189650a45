// Ring attention (see cp_ring.h).
#include "parallel/cp_ring.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"
#include "ops/attention_add_dq.h"
#include "ops/attention_groups.h"
#include "ops/threads.h"
#include "parallel/kv_rows.h"

namespace longtron::parallel {

namespace {

// Copies `rows` of src (block-local rows mapped by `slot`, nullptr = row r at r) into dst, rows of
// `width` floats.
void pack_rows(std::vector<float>& dst, const float* src, const RowRanges& rows,
               const std::vector<int32_t>* slot, int64_t width) {
  dst.resize(size_t(row_count(rows) * width));
  float* o = dst.data();
  for (const auto& [a, b] : rows)
    for (int32_t r = a; r < b; ++r, o += width) {
      const float* s = src + int64_t(slot ? (*slot)[size_t(r)] : r) * width;
      std::copy(s, s + width, o);
    }
}

// out, lse ← the log-sum-exp merge of (out, lse) and (o2, l2): rows [M, H, d], lse [H, M].
void merge(float* out, float* lse, const float* o2, const float* l2, int64_t M, int64_t H,
           int64_t d) {
  const float inf = std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) if (M * H * d > kParallelMinWork)
  for (int64_t n = 0; n < M; ++n)
    for (int64_t h = 0; h < H; ++h) {
      float& a = lse[h * M + n];
      const float b = l2[h * M + n];
      if (b == -inf) continue;
      float* o = out + (n * H + h) * d;
      const float* p = o2 + (n * H + h) * d;
      if (a == -inf) {
        std::copy(p, p + d, o);
        a = b;
        continue;
      }
      const float m = std::max(a, b), wa = std::exp(a - m), wb = std::exp(b - m);
      const float inv = 1.0f / (wa + wb);
      for (int64_t x = 0; x < d; ++x) o[x] = (o[x] * wa + p[x] * wb) * inv;
      a = m + std::log(wa + wb);
    }
}

constexpr int kKvTag = 0;  // tag of block s: kKvTag·C + s for K/V, C + s for dK/dV

}  // namespace

void RingScratch::release() {
  for (std::vector<float>* b : {&kv_local, &keys, &dkeys, &out, &lse})
    std::vector<float>().swap(*b);
}

RingAttention::RingAttention(comm::CommPtr context, data::ContextBalance balance,
                             RingSchedule schedule, std::shared_ptr<RingScratch> scratch,
                             const ops::ComputeContext& cc, int64_t group_tokens)
    : comm_(std::move(context)), balance_(balance), schedule_(schedule), cc_(cc),
      group_tokens_(group_tokens),
      scratch_(scratch ? std::move(scratch) : std::make_shared<RingScratch>()) {
  check(schedule_.size() == comm_->size(), "ring attention: schedule of {} ranks on a group of {}",
        schedule_.size(), comm_->size());
}

const RingPlan& RingAttention::plan(const ops::AttentionShape& s) {
  const int64_t C = comm_->size(), M = s.num_tokens;
  const std::span<const int32_t> cu(s.cu_seqlens, size_t(s.num_segments + 1));
  check(s.num_segments >= 1 && cu.back() == C * M,
        "context parallel: cu_seqlens must stay global: 0 … {} (= {} local tokens x {} context "
        "ranks), got … {}",
        C * M, M, C, cu.back());
  RingPlan& p = scratch_->plan;
  if (p.window == s.window && p.M == M &&
      std::equal(cu.begin(), cu.end(), p.cu_seqlens.begin(), p.cu_seqlens.end()))
    return p;
  p = make_ring_plan(cu, data::context_assignment(cu, C, balance_), schedule_, comm_->rank(),
                     s.window);
  return p;
}

void RingAttention::pack_local(const float* k, const float* v, const ops::AttentionShape& s) {
  interleave_kv(scratch_->kv_local, k, v, s.num_tokens, s.num_kv_heads * s.head_dim, s.kv_stride);
}

const float* RingAttention::kv_step(int k, int64_t row) {
  const RingPlan& p = scratch_->plan;
  const int s = p.source[size_t(k)], C = comm_->size();
  if (auto it = block_recv_.find(s); it != block_recv_.end()) {
    it->second.wait();
    block_recv_.erase(it);
  }
  const float* block = s == comm_->rank() ? scratch_->kv_local.data() : blocks_[s].data();
  for (const RingMessage& m : p.kv_send[size_t(k)]) {
    send_buffers_.emplace_back();
    pack_rows(send_buffers_.back(), block, m.rows, &p.slot[size_t(s)], row);
    sends_.push_back(comm_->send_async(send_buffers_.back().data(),
                                       int64_t(send_buffers_.back().size()), m.peer,
                                       kKvTag * C + s));
  }
  for (const RingMessage& m : p.kv_recv[size_t(k)]) {
    std::vector<float>& b = blocks_[m.block];
    b.resize(size_t(row_count(m.rows) * row));
    block_recv_[m.block] = comm_->recv_async(b.data(), int64_t(b.size()), m.peer,
                                             kKvTag * C + m.block);
  }
  return block;
}

void RingAttention::finish_kv_step(int k) {
  for (comm::Work& w : sends_) w.wait();
  sends_.clear();
  send_buffers_.clear();
  const int s = scratch_->plan.source[size_t(k)];
  if (s != comm_->rank()) blocks_.erase(s);
}

ops::AttentionShape RingAttention::pass_shape(const RingPass& pass, const float* block,
                                              int source, const ops::AttentionShape& s) {
  const RingPlan& p = scratch_->plan;
  const int64_t row = 2 * s.num_kv_heads * s.head_dim;
  std::vector<float>& keys = scratch_->keys;
  keys.resize(pass.key_rows.size() * size_t(row));
  const std::vector<int32_t>& slot = p.slot[size_t(source)];
#pragma omp parallel for schedule(static) if (pass.key_rows.size() * row > kParallelMinWorkLarge)
  for (size_t j = 0; j < pass.key_rows.size(); ++j) {
    const float* src = block + int64_t(slot[size_t(pass.key_rows[j])]) * row;
    std::copy(src, src + row, keys.data() + j * row);
  }
  ops::AttentionShape ks = s;
  ks.kv_stride = row;
  ks.cu_seqlens = p.segments.cu_seqlens_q.data();
  ks.num_segments = int64_t(p.segments.key_ranges.size());
  ks.cu_seqlens_k = pass.cu_seqlens_k.data();
  ks.num_kv_tokens = int64_t(pass.key_rows.size());
  ks.key_offsets = pass.key_offsets.data();
  return ks;
}

void RingAttention::forward_pass(float* out, float* lse, const float* q,
                                 const ops::AttentionShape& ks) {
  const float* keys = scratch_->keys.data();
  const int64_t od = ks.num_heads * ks.head_dim, kv = ks.num_kv_heads * ks.head_dim;
  ops::GroupLse<float> lg(ks);
  ops::for_each_attention_group(ks, group_tokens_, [&](const ops::AttentionGroup& g) {
    const float* k = keys + g.k0 * ks.kv_stride;
    ops::varlen_attention_forward(cc_, out + g.t0 * od, lg.out(lse, g.n), q + g.t0 * ks.q_stride,
                                  k, k + kv, g.shape);
    lg.store(lse, g.t0, g.n);
  });
}

void RingAttention::backward_pass(bool add_dq, float* dq, const float* dout, const float* q,
                                  const float* out, const float* lse,
                                  const ops::AttentionShape& ks) {
  RingScratch& b = *scratch_;
  b.dkeys.resize(b.keys.size());
  const int64_t od = ks.num_heads * ks.head_dim, kv = ks.num_kv_heads * ks.head_dim;
  ops::GroupLse<float> lg(ks);
  ops::for_each_attention_group(ks, group_tokens_, [&](const ops::AttentionGroup& g) {
    const int64_t qo = g.t0 * ks.q_stride, oo = g.t0 * od, ko = g.k0 * ks.kv_stride;
    const float* k = b.keys.data() + ko;
    float* dk = b.dkeys.data() + ko;
    const float* l = lg.in(lse, g.t0, g.n);
    if (add_dq)
      ops::varlen_attention_backward_add_dq(cc_, dq + qo, dk, dk + kv, dout + oo, q + qo, k,
                                            k + kv, out + oo, l, g.shape);
    else
      ops::varlen_attention_backward(cc_, dq + qo, dk, dk + kv, dout + oo, q + qo, k, k + kv,
                                     out + oo, l, g.shape);
  });
}

void RingAttention::forward(float* out, float* lse, const float* q, const float* k,
                            const float* v, const ops::AttentionShape& s) {
  check(s.cu_seqlens_k == nullptr, "context parallel: the local shape must not have key segments");
  const RingPlan& p = plan(s);
  pack_local(k, v, s);
  const int64_t M = s.num_tokens, H = s.num_heads, d = s.head_dim;
  const int64_t kv = s.num_kv_heads * d, row = 2 * kv;
  RingScratch& b = *scratch_;
  bool first = true;
  for (int step = 0; step < comm_->size(); ++step) {
    const float* block = kv_step(step, row);
    for (const RingPass& pass : p.passes[size_t(step)]) {
      const ops::AttentionShape ks = pass_shape(pass, block, p.source[size_t(step)], s);
      if (first) {
        forward_pass(out, lse, q, ks);
        first = false;
        continue;
      }
      b.out.resize(size_t(M * H * d));
      b.lse.resize(size_t(H * M));
      forward_pass(b.out.data(), b.lse.data(), q, ks);
      merge(out, lse, b.out.data(), b.lse.data(), M, H, d);
    }
    finish_kv_step(step);
  }
  check(!first, "ring attention: no key visible to this rank's queries (a broken plan)");
  b.release();
  bytes_.kv_sent += uint64_t(p.kv_rows_sent * row * 4);
  bytes_.kv_skipped += uint64_t(p.kv_rows_skipped * row * 4);
  bytes_.calls += 1;
  comm_->count_skipped(comm::Kind::kSend, uint64_t(p.kv_rows_skipped * row * 4));
}

void RingAttention::backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const ops::AttentionShape& s) {
  const RingPlan& p = plan(s);
  pack_local(k, v, s);
  const int C = comm_->size(), me = comm_->rank();
  const int64_t M = s.num_tokens, d = s.head_dim;
  const int64_t kv = s.num_kv_heads * d, row = 2 * kv;
  RingScratch& b = *scratch_;
  std::map<int, std::vector<float>> acc;  // dK/dV sums [M, row] of blocks this rank handles
  auto sum_of = [&](int block) -> std::vector<float>& {
    std::vector<float>& a = acc[block];
    if (a.empty()) a.assign(size_t(M * row), 0.f);
    return a;
  };
  std::map<std::pair<int, int>, std::pair<std::vector<float>, comm::Work>> incoming;
  // The dK/dV sums sent at this step and at the last one: a sum sent at the end of step k is
  // received at the end of step k (its receive was posted then), so it is waited for and freed
  // at the end of step k + 1, and at most two steps' sums are in flight, not all C − 1.
  std::vector<std::vector<float>> outgoing, outgoing_before;
  std::vector<comm::Work> outgoing_work, outgoing_work_before;
  bool first = true;
  for (int step = 0; step < p.steps_backward; ++step) {
    if (step < C) {
      const int source = p.source[size_t(step)];
      const float* block = kv_step(step, row);
      for (const RingPass& pass : p.passes[size_t(step)]) {
        const ops::AttentionShape ks = pass_shape(pass, block, source, s);
        // The first pass writes dq, the others add to it in place (no q-sized scratch).
        backward_pass(!first, dq, dout, q, out, lse, ks);
        first = false;
        add_rows(sum_of(source).data(), b.dkeys.data(), pass.key_rows, row);
      }
      finish_kv_step(step);
    }
    // dK/dV: add what arrived (sent at the end of the last step), send the sums due now, post
    // the receives of the sums the others send now.
    if (step > 0)
      for (const RingMessage& m : p.dkv_recv[size_t(step - 1)]) {
        auto it = incoming.find({m.block, m.peer});
        it->second.second.wait();
        std::vector<float>& a = sum_of(m.block);
        const float* g = it->second.first.data();
        for (const auto& [r0, r1] : m.rows)
          for (int64_t e = int64_t(r0) * row; e < int64_t(r1) * row; ++e) a[size_t(e)] += *g++;
        incoming.erase(it);
      }
    for (const RingMessage& m : p.dkv_send[size_t(step)]) {
      outgoing.emplace_back();
      std::vector<float>& a = sum_of(m.block);
      pack_rows(outgoing.back(), a.data(), m.rows, nullptr, row);  // sums are kept whole
      outgoing_work.push_back(comm_->send_async(outgoing.back().data(),
                                                int64_t(outgoing.back().size()), m.peer,
                                                C + m.block));
      acc.erase(m.block);
    }
    for (const RingMessage& m : p.dkv_recv[size_t(step)]) {
      auto& [buf, work] = incoming[{m.block, m.peer}];
      buf.resize(size_t(row_count(m.rows) * row));
      work = comm_->recv_async(buf.data(), int64_t(buf.size()), m.peer, C + m.block);
    }
    for (comm::Work& w : outgoing_work_before) w.wait();
    outgoing_before = std::move(outgoing);
    outgoing_work_before = std::move(outgoing_work);
    outgoing.clear();
    outgoing_work.clear();
  }
  for (comm::Work& w : outgoing_work_before) w.wait();
  split_kv(dk, dv, sum_of(me).data(), M, kv, s.kv_stride);
  bytes_.kv_sent += uint64_t(p.kv_rows_sent * row * 4);
  bytes_.kv_skipped += uint64_t(p.kv_rows_skipped * row * 4);
  b.release();
  bytes_.dkv_sent += uint64_t(p.dkv_rows_sent * row * 4);
  bytes_.dkv_skipped += uint64_t(p.dkv_rows_skipped * row * 4);
  comm_->count_skipped(comm::Kind::kSend,
                       uint64_t((p.kv_rows_skipped + p.dkv_rows_skipped) * row * 4));
}

}  // namespace longtron::parallel
