// Context-parallel token assignment (packing/context_split.h): golden layouts, the permutation and
// share invariants of every balance, brute-force work and key ranges, and the balance goal of
// "document" on random rows.
#include "packing/context_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"
#include "expect_error.h"
#include "packing/sequence_split.h"

namespace longtron::data {
namespace {

using longtron::testing::expect_error;
using V = std::vector<int32_t>;
const ContextBalance kAll[] = {ContextBalance::kContiguous, ContextBalance::kZigzag,
                               ContextBalance::kDocument};

// Brute force: the segment start of every position.
int64_t brute_work(const V& cu, const V& positions) {
  int64_t w = 0;
  for (int32_t p : positions)
    for (size_t s = 0; s + 1 < cu.size(); ++s)
      if (cu[s] <= p && p < cu[s + 1]) w += p - cu[s] + 1;
  return w;
}

// A row of exponential document lengths (mean `mean`, at least 1) cut at P, as packing cuts.
V exponential_row(int64_t P, double mean, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::exponential_distribution<double> e(1.0 / mean);
  V cu{0};
  while (cu.back() < P)
    cu.push_back(static_cast<int32_t>(std::min<int64_t>(P, cu.back() + 1 + int64_t(e(g)))));
  return cu;
}

void expect_partition(const V& cu, int64_t C, const std::vector<V>& a) {
  const int64_t P = cu.back();
  ASSERT_EQ(static_cast<int64_t>(a.size()), C);
  std::vector<int> seen(static_cast<size_t>(P), 0);
  for (const V& r : a) {
    EXPECT_EQ(static_cast<int64_t>(r.size()), P / C);
    EXPECT_TRUE(std::is_sorted(r.begin(), r.end()));
    for (int32_t p : r) {
      ASSERT_TRUE(p >= 0 && p < P);
      ++seen[p];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

TEST(ContextSplit, GoldenContiguousAndZigzag) {
  const V cu{0, 3, 8, 12};
  EXPECT_EQ(context_assignment(cu, 2, ContextBalance::kContiguous),
            (std::vector<V>{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}));
  // 2C = 4 chunks of 3: rank 0 chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(context_assignment(cu, 2, ContextBalance::kZigzag),
            (std::vector<V>{{0, 1, 2, 9, 10, 11}, {3, 4, 5, 6, 7, 8}}));
  // P/C = 3 is odd: chunk r gets the larger half (2), chunk 2C-1-r the smaller (1).
  EXPECT_EQ(context_assignment(V{0, 6}, 2, ContextBalance::kZigzag),
            (std::vector<V>{{0, 1, 5}, {2, 3, 4}}));
}

TEST(ContextSplit, ZigzagBalancesOneSegmentExactly) {
  for (int64_t C : {2, 4, 8}) {
    const V cu{0, static_cast<int32_t>(64 * C)};
    const auto a = context_assignment(cu, C, ContextBalance::kZigzag);
    for (const V& r : a) EXPECT_EQ(attention_work(cu, r), attention_work(cu, a[0]));
    EXPECT_DOUBLE_EQ(context_imbalance(cu, a), 1.0);
    EXPECT_GT(context_imbalance(cu, context_assignment(cu, C, ContextBalance::kContiguous)), 1.45);
    // A row that is one document: "document" zigzags it the same way.
    EXPECT_EQ(context_assignment(cu, C, ContextBalance::kDocument), a);
  }
}

TEST(ContextSplit, EveryBalanceIsAPermutationWithEqualShares) {
  const std::vector<V> rows{{0, 1, 2, 3, 4, 5, 6, 7, 8},  // length-1 documents
                            {0, 40, 41, 48},              // one document longer than a share
                            {0, 5, 5, 16},                // an empty segment
                            {0, 3, 10, 13, 16},           // pad segment at the end
                            exponential_row(4096, 512, 7)};
  for (const V& cu : rows)
    for (int64_t C : {1, 2, 4, 8})
      for (ContextBalance b : kAll) {
        if (cu.back() % C != 0) continue;
        SCOPED_TRACE(context_balance_name(b) + " C=" + std::to_string(C));
        expect_partition(cu, C, context_assignment(cu, C, b));
      }
}

TEST(ContextSplit, DocumentKeepsShortDocumentsWholeAndSplitsLongOnes) {
  // 48 tokens, C = 2: the 32-token document is long (longer than a rank's share of 24), the
  // eight 2-token documents (work 3 each, under 1/32 of the mean work 276) short.
  V cu{0, 32};
  for (int i = 0; i < 8; ++i) cu.push_back(cu.back() + 2);
  const auto a = context_assignment(cu, 2, ContextBalance::kDocument);
  expect_partition(cu, 2, a);
  for (size_t d = 1; d + 1 < cu.size(); ++d) {  // each short one on a single rank
    const int owner = std::count(a[0].begin(), a[0].end(), cu[d]) ? 0 : 1;
    for (int32_t p = cu[d]; p < cu[d + 1]; ++p)
      EXPECT_TRUE(std::binary_search(a[owner].begin(), a[owner].end(), p)) << p;
  }
  // The long one: 8 tokens per chunk, rank 0 chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(V(a[0].begin(), a[0].begin() + 8), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(std::binary_search(a[0].begin(), a[0].end(), 24));
  EXPECT_TRUE(std::binary_search(a[1].begin(), a[1].end(), 8));
  EXPECT_DOUBLE_EQ(context_imbalance(cu, a), 1.0);
}

TEST(ContextSplit, DocumentBalanceGoalOnRandomRows) {
  // The goal of "document": max/mean work <= 1.05. Rows of mean document length P/8 and P/64.
  for (uint64_t seed = 1; seed <= 20; ++seed)
    for (double mean_share : {8.0, 64.0})
      for (int64_t C : {2, 4, 8}) {
        const V cu = exponential_row(8192, 8192 / mean_share, seed);
        const double x = context_imbalance(cu, context_assignment(cu, C, ContextBalance::kDocument));
        EXPECT_LE(x, 1.05) << "seed " << seed << " C " << C << " mean P/" << mean_share;
      }
}

TEST(ContextSplit, AttentionWorkMatchesBruteForce) {
  const V cu = exponential_row(1000, 60, 3);
  std::mt19937 g(5);
  for (int t = 0; t < 20; ++t) {
    V pos;
    for (int32_t p = 0; p < 1000; ++p)
      if (g() % 3 == 0) pos.push_back(p);
    EXPECT_EQ(attention_work(cu, pos), brute_work(cu, pos));
  }
  EXPECT_EQ(attention_work(V{0, 3, 8, 12}, V{0, 1, 2, 3, 4, 11}), 1 + 2 + 3 + 1 + 2 + 4);
  // A window of 2: each query sees at most 2 keys.
  EXPECT_EQ(attention_work(V{0, 3, 8, 12}, V{0, 1, 2, 3, 4, 11}, 2), 1 + 2 + 2 + 1 + 2 + 2);
  EXPECT_EQ(attention_work(cu, V{0, 1, 2, 3, 4, 5}, 1000), attention_work(cu, V{0, 1, 2, 3, 4, 5}));
}

TEST(ContextSplit, SegmentsGolden) {
  // Rank 0 of zigzag C = 2 on {0, 3, 8, 12}: positions 0 1 2 | 9 10 11.
  const ContextSegments s = context_segments(V{0, 3, 8, 12}, V{0, 1, 2, 9, 10, 11});
  EXPECT_EQ(s.cu_seqlens_q, (V{0, 3, 6}));
  EXPECT_EQ(s.cu_seqlens_k, (V{0, 3, 7}));  // keys [0,3) and [8,12)
  EXPECT_EQ(s.key_ranges, (std::vector<std::pair<int32_t, int32_t>>{{0, 3}, {8, 12}}));
  EXPECT_EQ(s.max_seqlen_q, 3);
  EXPECT_EQ(s.max_seqlen_k, 4);
  // Runs stop at a segment boundary even when positions are consecutive.
  const ContextSegments t = context_segments(V{0, 3, 8, 12}, V{2, 3, 4});
  EXPECT_EQ(t.cu_seqlens_q, (V{0, 1, 3}));
  EXPECT_EQ(t.key_ranges, (std::vector<std::pair<int32_t, int32_t>>{{0, 3}, {3, 5}}));
}

TEST(ContextSplit, SegmentsSeeExactlyTheCausalKeys) {
  // Bottom-right aligned keys of every run = the keys each query sees in the whole row.
  const V cu = exponential_row(512, 40, 11);
  for (ContextBalance b : kAll)
    for (const V& pos : context_assignment(cu, 4, b)) {
      const ContextSegments s = context_segments(cu, pos);
      ASSERT_EQ(s.cu_seqlens_q.back(), static_cast<int32_t>(pos.size()));
      int64_t pairs = 0;
      for (size_t i = 0; i + 1 < s.cu_seqlens_q.size(); ++i) {
        const int32_t lq = s.cu_seqlens_q[i + 1] - s.cu_seqlens_q[i];
        const int32_t lk = s.cu_seqlens_k[i + 1] - s.cu_seqlens_k[i];
        EXPECT_EQ(lk, s.key_ranges[i].second - s.key_ranges[i].first);
        for (int32_t r = 0; r < lq; ++r) {
          const int32_t p = pos[s.cu_seqlens_q[i] + r];
          EXPECT_EQ(s.key_ranges[i].first + r + lk - lq, p);  // the last key it sees is itself
          pairs += r + lk - lq + 1;
        }
      }
      EXPECT_EQ(pairs, attention_work(cu, pos));
    }
}

TEST(ContextSplit, SplitOfARowPadsAndKeepsLabels) {
  MicroBatch row;
  row.input_ids = {11, 12, 13, 14, 15, 16, 17};
  row.labels = {12, 13, -100, 15, 16, 17, -100};
  row.indexes = {0, 1, 2, 0, 1, 2, 3};
  row.cu_seqlens = {0, 3, 7};
  row.max_seqlen = 4;
  // hp = 1, C = 1 is the plain sequence split.
  MicroBatch one = split_for_context_parallel(row, 1, 0, 1, 0, ContextBalance::kZigzag);
  EXPECT_EQ(one.input_ids, row.input_ids);
  // hp 2 x cp 2: padded to 8 (pad segment [7, 8)); zigzag chunks of 2: c0 = {0,1,6,7}, c1 = {2..5}.
  std::vector<int32_t> all;
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t h = 0; h < 2; ++h) {
      MicroBatch m = split_for_context_parallel(row, 2, h, 2, c, ContextBalance::kZigzag);
      EXPECT_EQ(m.cu_seqlens, (V{0, 3, 7, 8}));
      ASSERT_EQ(m.input_ids.size(), 2u);
      all.insert(all.end(), m.input_ids.begin(), m.input_ids.end());
      if (c == 0 && h == 1) {
        EXPECT_EQ(m.input_ids, (V{17, 0}));
        EXPECT_EQ(m.labels, (V{-100, -100}));
        EXPECT_EQ(m.indexes, (V{3, 0}));
      }
      if (c == 1 && h == 0) {
        EXPECT_EQ(m.labels, (V{-100, 15}));
      }
    }
  EXPECT_EQ(all, (V{11, 12, 17, 0, 13, 14, 15, 16}));
}

TEST(ContextSplit, WorkMaxMeanPadsLikeTheSplit) {
  // {0, 3, 7} padded to 8 (pad segment of 1), zigzag C = 2: c0 = {0, 1, 6, 7}, c1 = {2, 3, 4, 5}.
  const auto [max, mean] = context_work_max_mean(V{0, 3, 7}, 2, 4, ContextBalance::kZigzag);
  const int64_t w0 = 1 + 2 + 4 + 1, w1 = 3 + 1 + 2 + 3;  // position 6 is offset 3 of [3, 7)
  EXPECT_DOUBLE_EQ(max, double(std::max(w0, w1)));
  EXPECT_DOUBLE_EQ(mean, (w0 + w1) / 2.0);
  expect_error([] { context_work_max_mean(V{0, 8}, 2, 3, ContextBalance::kZigzag); },
               {"not a multiple of 2"});
}

TEST(ContextSplit, BadInputIsAnError) {
  expect_error([] { context_assignment(V{0, 7}, 2, ContextBalance::kZigzag); },
               {"does not divide the row length 7"});
  expect_error([] { context_assignment(V{0, 8}, 0, ContextBalance::kZigzag); }, {">= 1"});
  expect_error([] { context_assignment(V{0, 5, 4, 8}, 2, ContextBalance::kZigzag); },
               {"must not decrease"});
  expect_error([] { parse_context_balance("ring"); },
               {"parallel.sequence_2D.balance must be \"contiguous\", \"zigzag\" or \"document\""});
  expect_error([] { context_segments(V{0, 8}, V{3, 2}); }, {"must ascend"});
  expect_error([] { attention_work(V{0, 8}, V{8}); }, {"outside the row"});
  MicroBatch row{{1, 2}, {2, -100}, {0, 1}, {0, 2}, 2, {}};
  expect_error([&] { split_for_context_parallel(row, 1, 0, 2, 2, ContextBalance::kZigzag); },
               {"context parallel rank 2 out of range"});
}

}  // namespace
}  // namespace longtron::data
