// The plan of ring attention (see cp_ring_plan.h).
#include "parallel/cp_ring_plan.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace longtron::parallel {

RingSchedule::RingSchedule(int C, int w, bool interleaved)
    : C_(C), w_(w), G_(w >= 1 ? C / w : 0), interleaved_(interleaved) {
  check(C >= 1 && w >= 1 && C % w == 0,
        "ring attention: window_size ({}) must divide context_size ({})", w, C);
}

std::pair<int, int> RingSchedule::place(int q) const {
  return interleaved_ ? std::pair{q % G_, q / G_} : std::pair{q / w_, q % w_};
}

int RingSchedule::rank_at(int g, int i) const {
  g = ((g % G_) + G_) % G_;
  i = ((i % w_) + w_) % w_;
  return interleaved_ ? g + i * G_ : g * w_ + i;
}

int RingSchedule::source(int q, int k) const {
  const auto [g, i] = place(q);
  return rank_at(g - k / w_, i - k % w_);
}

int RingSchedule::step(int q, int s) const {
  const auto [g, i] = place(q);
  const auto [gs, is] = place(s);
  return ((g - gs + G_) % G_) * w_ + (i - is + w_) % w_;
}

int RingSchedule::kv_parent(int q, int s) const {
  if (q == s) return -1;
  const auto [g, i] = place(q);
  const auto [gs, is] = place(s);
  return i != is ? rank_at(g, i - 1) : rank_at(g - 1, i);
}

int RingSchedule::dkv_next(int q, int s) const {
  if (q == s) return -1;
  const auto [g, i] = place(q);
  const auto [gs, is] = place(s);
  return i != is ? rank_at(g, i + 1) : rank_at(g + 1, i);
}

int64_t row_count(const RowRanges& r) {
  int64_t n = 0;
  for (const auto& [a, b] : r) n += b - a;
  return n;
}

namespace {

RowRanges unite(RowRanges r) {
  std::sort(r.begin(), r.end());
  RowRanges out;
  for (const auto& x : r) {
    if (x.first >= x.second) continue;
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

RowRanges unite(const RowRanges& a, const RowRanges& b) {
  RowRanges r = a;
  r.insert(r.end(), b.begin(), b.end());
  return unite(std::move(r));
}

// Rows of `share` (ascending positions) inside positions [lo, hi).
std::pair<int32_t, int32_t> rows_between(const std::vector<int32_t>& share, int32_t lo,
                                         int32_t hi) {
  const auto a = std::lower_bound(share.begin(), share.end(), lo);
  const auto b = std::lower_bound(a, share.end(), hi);
  return {int32_t(a - share.begin()), int32_t(b - share.begin())};
}

// Position range [lo, b) that run i of `seg` may see (its segment's start, or its window's).
std::pair<int32_t, int32_t> visible_range(const data::ContextSegments& seg, size_t i,
                                          int64_t window) {
  const auto [start, b] = seg.key_ranges[i];
  const int32_t a = b - (seg.cu_seqlens_q[i + 1] - seg.cu_seqlens_q[i]);
  const int32_t lo = window > 0 ? std::max<int32_t>(start, int32_t(a - window + 1)) : start;
  return {lo, b};
}

// The steps' kernel calls of rank `me`: per run, the rows of the block it sees, in pieces whose
// positions are consecutive when there is a window (one linear offset each), else one piece.
void plan_passes(RingPlan& p, const std::vector<std::vector<int32_t>>& shares, int me) {
  const data::ContextSegments& seg = p.segments;
  const size_t runs = seg.key_ranges.size();
  for (size_t k = 0; k < p.source.size(); ++k) {
    const int s = p.source[k];
    const std::vector<int32_t>& share = shares[size_t(s)];
    std::vector<std::vector<std::pair<RowRanges::value_type, int32_t>>> pieces(runs);
    size_t most = 0;
    for (size_t i = 0; i < runs; ++i) {
      const auto [lo, b] = visible_range(seg, i, p.window);
      const int32_t lq = seg.cu_seqlens_q[i + 1] - seg.cu_seqlens_q[i], a = b - lq;
      const auto [i0, i1] = rows_between(share, lo, b);
      if (i0 >= i1) continue;
      if (p.window == 0) {  // whole earlier rows, then (own block) the run itself: one piece
        pieces[i].push_back({{i0, i1}, s == me ? (i1 - i0) - lq : (i1 - i0)});
      } else {
        for (int32_t j0 = i0, j = i0 + 1; j <= i1; ++j)
          if (j == i1 || share[size_t(j)] != share[size_t(j) - 1] + 1) {
            pieces[i].push_back({{j0, j}, a - share[size_t(j0)]});
            j0 = j;
          }
      }
      most = std::max(most, pieces[i].size());
    }
    for (size_t n = 0; n < most; ++n) {
      RingPass pass;
      pass.cu_seqlens_k.push_back(0);
      for (size_t i = 0; i < runs; ++i) {
        int32_t off = 0;
        if (n < pieces[i].size()) {
          const auto& [rows, o] = pieces[i][n];
          for (int32_t r = rows.first; r < rows.second; ++r) pass.key_rows.push_back(r);
          off = o;
        }
        pass.cu_seqlens_k.push_back(int32_t(pass.key_rows.size()));
        pass.key_offsets.push_back(off);
      }
      p.passes[k].push_back(std::move(pass));
    }
  }
}

}  // namespace

RingPlan make_ring_plan(std::span<const int32_t> cu, const std::vector<std::vector<int32_t>>& shares,
                        const RingSchedule& sched, int me, int64_t window) {
  const int C = sched.size();
  check(int(shares.size()) == C && me >= 0 && me < C,
        "ring attention: {} shares for {} context ranks (rank {})", shares.size(), C, me);
  RingPlan p;
  p.cu_seqlens.assign(cu.begin(), cu.end());
  p.window = window;
  p.M = int64_t(shares[0].size());
  const int32_t M = int32_t(p.M);
  // need[q][s]: rows of block s that some query of rank q sees.
  std::vector<data::ContextSegments> segs;
  for (int q = 0; q < C; ++q) segs.push_back(data::context_segments(cu, shares[size_t(q)]));
  std::vector<std::vector<RowRanges>> need(static_cast<size_t>(C), std::vector<RowRanges>(static_cast<size_t>(C)));
  for (int q = 0; q < C; ++q)
    for (int s = 0; s < C; ++s) {
      RowRanges r;
      for (size_t i = 0; i < segs[size_t(q)].key_ranges.size(); ++i) {
        const auto [lo, b] = visible_range(segs[size_t(q)], i, window);
        r.push_back(rows_between(shares[size_t(s)], lo, b));
      }
      need[size_t(q)][size_t(s)] = unite(std::move(r));
    }
  p.segments = segs[size_t(me)];
  p.source.resize(static_cast<size_t>(C));
  p.passes.resize(static_cast<size_t>(C));
  p.kv_send.resize(static_cast<size_t>(C));
  p.kv_recv.resize(static_cast<size_t>(C));
  p.received.resize(static_cast<size_t>(C));
  p.slot.resize(static_cast<size_t>(C));
  for (int k = 0; k < C; ++k) p.source[size_t(k)] = sched.source(me, k);
  int last_message = C - 1;
  std::vector<std::pair<int, RingMessage>> dkv_sends, dkv_recvs;  // (step, message)
  for (int s = 0; s < C; ++s) {
    // Forward: the rows a hop into q carries = what q and every rank it forwards to need.
    std::vector<int> order(static_cast<size_t>(C));
    for (int q = 0; q < C; ++q) order[size_t(q)] = q;
    std::sort(order.begin(), order.end(),
              [&](int x, int y) { return sched.step(x, s) > sched.step(y, s); });
    std::vector<RowRanges> sub(static_cast<size_t>(C));
    for (int q : order) {
      sub[size_t(q)] = unite(sub[size_t(q)], need[size_t(q)][size_t(s)]);
      const int parent = sched.kv_parent(q, s);
      if (parent >= 0) sub[size_t(parent)] = unite(sub[size_t(parent)], sub[size_t(q)]);
    }
    p.received[size_t(s)] = s == me ? RowRanges{{0, M}} : sub[size_t(me)];
    for (int q = 0; q < C; ++q) {
      if (sched.kv_parent(q, s) != me) continue;
      if (!sub[size_t(q)].empty())
        p.kv_send[size_t(sched.step(me, s))].push_back({s, q, sub[size_t(q)]});
      p.kv_rows_sent += row_count(sub[size_t(q)]);
      p.kv_rows_skipped += M - row_count(sub[size_t(q)]);
    }
    const int parent = sched.kv_parent(me, s);
    if (parent >= 0 && !sub[size_t(me)].empty())
      p.kv_recv[size_t(sched.step(parent, s))].push_back({s, parent, sub[size_t(me)]});
    // Backward: what a rank's dK/dV message carries and the step at whose end it leaves.
    std::vector<RowRanges> contrib(static_cast<size_t>(C));
    std::vector<int> ready(static_cast<size_t>(C), -1);
    std::function<void(int)> solve = [&](int q) {
      if (ready[size_t(q)] >= 0) return;
      int r = sched.step(q, s);
      RowRanges rows = need[size_t(q)][size_t(s)];
      for (int x = 0; x < C; ++x)
        if (sched.dkv_next(x, s) == q) {
          solve(x);
          r = std::max(r, ready[size_t(x)] + 1);
          rows = unite(rows, contrib[size_t(x)]);
        }
      ready[size_t(q)] = r;
      contrib[size_t(q)] = std::move(rows);
    };
    for (int q = 0; q < C; ++q) solve(q);
    if (s != me) {
      const RowRanges& rows = contrib[size_t(me)];
      if (!rows.empty())
        dkv_sends.push_back({ready[size_t(me)], {s, sched.dkv_next(me, s), rows}});
      p.dkv_rows_sent += row_count(rows);
      p.dkv_rows_skipped += M - row_count(rows);
      last_message = std::max(last_message, ready[size_t(me)]);
    }
    for (int x = 0; x < C; ++x)
      if (x != s && sched.dkv_next(x, s) == me && !contrib[size_t(x)].empty()) {
        dkv_recvs.push_back({ready[size_t(x)], {s, x, contrib[size_t(x)]}});
        last_message = std::max(last_message, ready[size_t(x)] + 1);
      }
  }
  p.steps_backward = last_message + 1;
  p.dkv_send.resize(size_t(p.steps_backward));
  p.dkv_recv.resize(size_t(p.steps_backward));
  for (auto& [k, m] : dkv_sends) p.dkv_send[size_t(k)].push_back(std::move(m));
  for (auto& [k, m] : dkv_recvs) p.dkv_recv[size_t(k)].push_back(std::move(m));
  for (int s = 0; s < C; ++s) {
    std::vector<int32_t>& slot = p.slot[size_t(s)];
    slot.assign(size_t(M), -1);
    int32_t n = 0;
    for (const auto& [a, b] : p.received[size_t(s)])
      for (int32_t r = a; r < b; ++r) slot[size_t(r)] = n++;
  }
  plan_passes(p, shares, me);
  return p;
}

}  // namespace longtron::parallel
