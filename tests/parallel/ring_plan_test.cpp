// The ring attention plan (parallel/cp_ring_plan.h) without MPI: the double-ring schedule visits
// every block once and its K/V and dK/dV routes reach every rank and home; every (query, key) pair
// that attends in the whole row (causal inside its segment, inside the window) is computed exactly
// once by some pass of the query's rank and no other pair is; rows that nobody downstream sees
// are not sent; blocks a rank cannot see cost it no kernel call.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "parallel/cp_ring_plan.h"

namespace longtron::parallel {
namespace {

using data::ContextBalance;

TEST(RingSchedule, VisitsEveryBlockOnceAndRoutesReachHome) {
  for (int C : {1, 2, 4, 6, 8})
    for (int w = 1; w <= C; ++w) {
      if (C % w != 0) continue;
      for (bool interleaved : {false, true}) {
        SCOPED_TRACE("C " + std::to_string(C) + " w " + std::to_string(w) +
                     (interleaved ? " interleaved" : ""));
        const RingSchedule r(C, w, interleaved);
        for (int q = 0; q < C; ++q) {
          std::set<int> seen;
          EXPECT_EQ(r.source(q, 0), q);
          for (int k = 0; k < C; ++k) {
            seen.insert(r.source(q, k));
            EXPECT_EQ(r.step(q, r.source(q, k)), k);
          }
          EXPECT_EQ(int(seen.size()), C);
          for (int s = 0; s < C; ++s) {
            if (q == s) {
              EXPECT_EQ(r.kv_parent(q, s), -1);
              continue;
            }
            // The parent holds the block earlier; following parents reaches the owner.
            int x = q, hops = 0;
            while (x != s && hops++ < C) {
              EXPECT_LT(r.step(r.kv_parent(x, s), s), r.step(x, s));
              x = r.kv_parent(x, s);
            }
            EXPECT_EQ(x, s);
            x = q, hops = 0;  // dK/dV: following next reaches home
            while (x != s && hops++ < C) x = r.dkv_next(x, s);
            EXPECT_EQ(x, s);
          }
        }
      }
    }
  EXPECT_THROW(RingSchedule(4, 3, false), Error);
}

// Rows: one document; documents longer than a share with length-1 ones; many short ones; a pad.
std::vector<std::vector<int32_t>> rows(int32_t P, std::mt19937& rng) {
  std::vector<std::vector<int32_t>> out = {{0, P}, {0, P / 8, P / 8 + 1, P / 8 + 2, P - 3, P}};
  std::vector<int32_t> random{0};
  while (random.back() < P)
    random.push_back(std::min(P, random.back() + std::uniform_int_distribution<int32_t>(1, P / 5)(rng)));
  out.push_back(random);
  return out;
}

// The (query position, key position) pairs rank `me`'s passes compute.
std::multiset<std::pair<int32_t, int32_t>> computed(const RingPlan& p,
                                                   const std::vector<std::vector<int32_t>>& shares,
                                                   int me) {
  std::multiset<std::pair<int32_t, int32_t>> pairs;
  const data::ContextSegments& seg = p.segments;
  for (size_t k = 0; k < p.passes.size(); ++k)
    for (const RingPass& pass : p.passes[k])
      for (size_t i = 0; i + 1 < seg.cu_seqlens_q.size(); ++i)
        for (int32_t j = 0; j < seg.cu_seqlens_q[i + 1] - seg.cu_seqlens_q[i]; ++j)
          for (int32_t c = pass.cu_seqlens_k[i]; c < pass.cu_seqlens_k[i + 1]; ++c) {
            const int32_t kc = c - pass.cu_seqlens_k[i], at = j + pass.key_offsets[i];
            if (kc > at || (p.window > 0 && kc <= at - p.window)) continue;
            const int32_t qpos = shares[size_t(me)][size_t(seg.cu_seqlens_q[i] + j)];
            const int32_t kpos = shares[size_t(p.source[k])][size_t(pass.key_rows[size_t(c)])];
            pairs.insert({qpos, kpos});
          }
  return pairs;
}

TEST(RingPlan, EveryVisiblePairOnceAndNothingElse) {
  std::mt19937 rng(5);
  for (int C : {2, 4})
    for (int w : {1, 2})
      for (bool interleaved : {false, true})
        for (ContextBalance b : {ContextBalance::kContiguous, ContextBalance::kZigzag,
                                 ContextBalance::kDocument})
          for (int64_t window : {0, 1, 5})
            for (const auto& cu : rows(int32_t(12 * C), rng)) {
              if (C % w != 0) continue;
              const RingSchedule sched(C, w, interleaved);
              const auto shares = data::context_assignment(cu, C, b);
              std::vector<int32_t> doc(size_t(cu.back()));
              for (size_t s = 0; s + 1 < cu.size(); ++s)
                for (int32_t x = cu[s]; x < cu[s + 1]; ++x) doc[size_t(x)] = int32_t(s);
              for (int me = 0; me < C; ++me) {
                SCOPED_TRACE("C " + std::to_string(C) + " w " + std::to_string(w) + " " +
                             data::context_balance_name(b) + " window " + std::to_string(window) +
                             " segments " + std::to_string(cu.size() - 1) + " rank " +
                             std::to_string(me));
                const RingPlan p = make_ring_plan(cu, shares, sched, me, window);
                std::multiset<std::pair<int32_t, int32_t>> want;
                for (int32_t q : shares[size_t(me)])
                  for (int32_t c = cu[size_t(doc[size_t(q)])]; c <= q; ++c)
                    if (window == 0 || q - c < window) want.insert({q, c});
                ASSERT_EQ(computed(p, shares, me), want);
                // A key row a pass uses was received (or is this rank's own).
                for (size_t k = 0; k < p.passes.size(); ++k)
                  for (const RingPass& pass : p.passes[k])
                    for (int32_t r : pass.key_rows)
                      ASSERT_GE(p.slot[size_t(p.source[k])][size_t(r)], 0);
              }
            }
}

TEST(RingPlan, DocumentsInsideOneShareSendNothing) {
  // Each of 4 ranks holds whole documents (contiguous split of 4 documents of P/4): no rank sees
  // another's keys, so no K/V or dK/dV row moves and only step 0 computes.
  const std::vector<int32_t> cu = {0, 16, 32, 48, 64};
  const auto shares = data::context_assignment(cu, 4, ContextBalance::kContiguous);
  for (int me = 0; me < 4; ++me) {
    const RingPlan p = make_ring_plan(cu, shares, RingSchedule(4, 1, false), me, 0);
    EXPECT_EQ(p.kv_rows_sent, 0);
    EXPECT_EQ(p.kv_rows_skipped, 3 * 16);
    EXPECT_EQ(p.dkv_rows_sent, 0);
    EXPECT_EQ(p.passes[0].size(), 1u);
    for (int k = 1; k < 4; ++k) {
      EXPECT_TRUE(p.passes[size_t(k)].empty());
      EXPECT_TRUE(p.kv_send[size_t(k)].empty());
    }
  }
}

TEST(RingPlan, OneCausalDocumentSendsOnlyWhatIsAhead) {
  // One document, contiguous over 4 ranks: block s is needed by ranks s+1 … 3 only, so the hop
  // from rank 3 back to rank 0 (which sees nothing later) is skipped: per rank one hop skipped.
  const std::vector<int32_t> cu = {0, 64};
  const auto shares = data::context_assignment(cu, 4, ContextBalance::kContiguous);
  int64_t sent = 0, skipped = 0;
  for (int me = 0; me < 4; ++me) {
    const RingPlan p = make_ring_plan(cu, shares, RingSchedule(4, 1, false), me, 0);
    sent += p.kv_rows_sent;
    skipped += p.kv_rows_skipped;
  }
  // Block s travels s → s+1 → … → 3: 3 − s hops of 16 rows.
  EXPECT_EQ(sent, (3 + 2 + 1) * 16);
  EXPECT_EQ(skipped, 4 * 3 * 16 - sent);
}

}  // namespace
}  // namespace longtron::parallel
