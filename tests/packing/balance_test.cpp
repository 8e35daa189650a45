// data.balance: the cost model, the longest-processing-time assignment of a step's rows, the
// cost-balanced window packing ("documents") checked token by token against the document stream
// over random corpora, and the loader's plans ("rows" keeps the step's set of rows; "documents"
// depends only on the global batch; a plan is a pure function of the step, so resume is exact).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "data/memory_source.h"
#include "expect_error.h"
#include "packing/balance.h"
#include "packing/balanced_pack.h"
#include "packing/loader.h"
#include "packing/pack.h"

namespace longtron::data {
namespace {

using longtron::testing::expect_error;

std::vector<std::vector<int32_t>> random_docs(std::mt19937& g, int max_docs, int max_len) {
  std::vector<std::vector<int32_t>> docs(std::uniform_int_distribution<int>(1, max_docs)(g));
  for (auto& d : docs) {
    d.resize(std::uniform_int_distribution<int>(0, max_len)(g));
    for (auto& t : d) t = std::uniform_int_distribution<int32_t>(-20, 1000)(g);
  }
  return docs;
}

TEST(Balance, CostModelCountsCausalPairsPerSegment) {
  EXPECT_EQ(causal_pairs(4), 10);
  EXPECT_EQ(piece_pairs(10, 4), 10 + 10 + 3);  // segments 4, 4, 2
  EXPECT_EQ(piece_pairs(10, 0), 55);
  RowCost c{2.0, 0.5};
  const std::vector<int32_t> cu = {0, 4, 11, 16};  // segments 4, 7, 5
  EXPECT_DOUBLE_EQ(c.of(cu), 2.0 * 16 + 0.5 * (10 + 28 + 15));
  EXPECT_DOUBLE_EQ(imbalance_of({1, 1, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(imbalance_of({3, 1}), 1.5);
  EXPECT_DOUBLE_EQ(imbalance_of({0, 0}), 1.0);
}

TEST(Balance, BadSettingsNameTheirKeys) {
  expect_error([] { parse_balance_mode("docs"); }, {"data.balance", "\"docs\""});
  BalanceConfig b;
  b.window = 0;
  expect_error([&] { b.validate(); }, {"data.balance_window", "0"});
  b.window = 2;
  b.cost = {0, 0};
  expect_error([&] { b.validate(); }, {"data.balance_cost", "not both 0"});
  b.cost = {-1, 1};
  expect_error([&] { b.validate(); }, {"data.balance_cost"});
  PackConfig p;
  p.seq_len = 4;
  p.micro_bsz = 2;
  p.balance_window_rows = 8;
  p.use_packed_dataset = false;
  expect_error([&] { p.validate(); }, {"data.balance = \"documents\"", "data.use_packed_dataset"});
  p.use_packed_dataset = true;
  p.pack_sample_into_one = true;
  expect_error([&] { p.validate(); }, {"data.pack_sample_into_one"});
  p.pack_sample_into_one = false;
  p.split_documents = false;
  expect_error([&] { p.validate(); }, {"data.split_documents"});
}

TEST(Balance, AssignRowsHandExample) {
  // Costs by canonical index; LPT: 0 (10) → r0, 3 (10) → r1, 1 (1) → r0 (tie: lower rank), 2 → r1.
  const auto a = assign_rows({10, 1, 1, 10}, 2, 2);
  EXPECT_EQ(a, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(assign_rows({5, 1, 3}, 1, 3), (std::vector<std::vector<int64_t>>{{0, 1, 2}}));
  expect_error([] { assign_rows({1, 2, 3}, 2, 2); }, {"3 costs", "dp_size 2"});
}

TEST(Balance, AssignRowsIsAPermutationWithinTheGreedyBound) {
  std::mt19937 g(1);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t dp = std::uniform_int_distribution<int>(1, 8)(g);
    const int64_t m = std::uniform_int_distribution<int>(1, 6)(g);
    std::vector<double> c(dp * m);
    std::exponential_distribution<double> e(1.0);
    for (auto& x : c) x = trial % 2 ? std::pow(e(g), 3) : std::floor(e(g) * 3);
    const auto a = assign_rows(c, dp, m);
    std::vector<int64_t> all;
    std::vector<double> load(dp, 0);
    for (int64_t r = 0; r < dp; ++r) {
      ASSERT_EQ(static_cast<int64_t>(a[r].size()), m);
      ASSERT_TRUE(std::is_sorted(a[r].begin(), a[r].end()));
      for (const int64_t i : a[r]) {
        all.push_back(i);
        load[r] += c[i];
      }
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int64_t>(i));
    // LPT's guarantee: the ranks differ by at most one row's cost.
    const double top = *std::max_element(c.begin(), c.end());
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    ASSERT_LE(*hi - *lo, top * (1 + 1e-12)) << "trial " << trial;
    ASSERT_EQ(assign_rows(c, dp, m), a);  // deterministic
  }
}

TEST(Balance, PackWindowHandExample) {
  // Documents of 3, 3, 1, 1 tokens into two rows of 4: the plain packer cuts document 1 at the row
  // edge; balanced, each row gets a 3 and a 1 (6 + 1 pairs each) and nothing is cut.
  const auto rows = pack_window({{0, 0, 3}, {1, 0, 3}, {2, 0, 1}, {3, 0, 1}}, {4, 4}, 0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], (std::vector<Piece>{{0, 0, 3}, {2, 0, 1}}));
  EXPECT_EQ(rows[1], (std::vector<Piece>{{1, 0, 3}, {3, 0, 1}}));
  // A piece that fits no row is cut at the roomiest row's edge: 5 and 5 into rows of 4 and 6.
  const auto cut = pack_window({{0, 0, 5}, {1, 0, 5}}, {4, 6}, 0);
  EXPECT_EQ(cut[1], (std::vector<Piece>{{0, 0, 5}, {1, 4, 1}}));
  EXPECT_EQ(cut[0], (std::vector<Piece>{{1, 0, 4}}));
  // A document of 6 (21 pairs) exceeds a row's fair share (24 pairs / 2 rows) and is cut in two
  // halves; here both halves can only land in one row, where they become one piece again.
  const auto share = pack_window({{0, 0, 6}, {1, 0, 1}, {2, 0, 1}, {3, 0, 4}}, {6, 6}, 0);
  EXPECT_EQ(share[0], (std::vector<Piece>{{1, 0, 1}, {2, 0, 1}, {3, 0, 4}}));
  EXPECT_EQ(share[1], (std::vector<Piece>{{0, 0, 6}}));
  // Two long documents in four rows: each is cut so that no row holds more than its share.
  const auto two = pack_window({{0, 0, 8}, {1, 0, 8}}, {4, 4, 4, 4}, 0);
  for (const auto& row : two) EXPECT_EQ(row.size(), 1u);
  expect_error([] { pack_window({{0, 0, 5}}, {4}, 0); }, {"5 tokens", "4 tokens"});
}

/// (document position in order, token offset) of every non-pad token of `rows`, row by row, with
/// each row checked against the documents: inputs, labels, segments, indexes.
void check_rows(const MemorySource& src, const std::vector<int64_t>& order, const BalancedRows& rows,
                const PackConfig& c, std::multiset<std::pair<int64_t, int64_t>>& seen,
                int trial) {
  const int64_t P = c.packed_length(), L = c.seq_len;
  MicroBatch b;
  std::vector<int32_t> cu;
  for (int64_t k = 0; k < rows.num_rows(); ++k) {
    rows.row_into(k, b);
    rows.segments_into(k, cu);
    ASSERT_EQ(cu, b.cu_seqlens);
    ASSERT_EQ(static_cast<int64_t>(b.input_ids.size()), P);
    std::set<int32_t> cuts(b.cu_seqlens.begin(), b.cu_seqlens.end());
    int64_t pos = 0;
    for (const Piece& p : rows.row_pieces(k)) {
      const int64_t doc = order[p.doc];
      const auto len = static_cast<int64_t>(src.document_length(doc));
      std::vector<int32_t> t(len);
      src.read_tokens(doc, 0, len, t.data());
      ASSERT_TRUE(cuts.count(static_cast<int32_t>(pos)));  // a piece starts a segment
      for (int64_t i = 0; i < p.count; ++i) {
        const int64_t at = p.offset + i;
        seen.insert({p.doc, at});
        ASSERT_EQ(b.input_ids[pos + i], std::abs(t[at])) << "trial " << trial;
        const int32_t want = at + 1 == len ? -100 : (t[at + 1] > 0 ? t[at + 1] : -100);
        ASSERT_EQ(b.labels[pos + i], want) << "trial " << trial << " row " << k;
        ASSERT_EQ(b.indexes[pos + i], i % L);  // segments of <= L from the piece start
      }
      pos += p.count;
    }
    for (int64_t i = pos; i < P; ++i) {  // the padded tail: one segment
      ASSERT_EQ(b.input_ids[i], 0);
      ASSERT_EQ(b.labels[i], -100);
      ASSERT_EQ(b.indexes[i], i - pos);
    }
    ASSERT_EQ(b.cu_seqlens.back(), P);
  }
}

TEST(Balance, DocumentsRowsHoldEveryTokenOnceAndOnlyMoveInsideTheirWindow) {
  std::mt19937 g(9);
  for (int trial = 0; trial < 1500; ++trial) {
    MemorySource src(random_docs(g, 30, 40));
    PackConfig c;
    c.seq_len = std::uniform_int_distribution<int>(1, 9)(g);
    c.micro_bsz = std::uniform_int_distribution<int>(1, 3)(g);
    c.pack_tail = trial % 3 == 0 ? PackTail::kDrop : PackTail::kPad;
    c.balance_window_rows = std::uniform_int_distribution<int>(1, 6)(g);
    const auto order = document_order(src, 0, trial % 2 == 0, trial);
    BalancedRows rows(src, order, c);
    PackConfig plain_config = c;
    plain_config.balance_window_rows = 0;
    const auto plain = build_pack(src, order, plain_config);
    ASSERT_EQ(rows.num_rows(), plain->num_rows());  // same rows, same tail rule
    std::multiset<std::pair<int64_t, int64_t>> seen;
    check_rows(src, order, rows, c, seen, trial);
    // Exactly the plain packer's tokens, each once: the stream up to the last row's end.
    const int64_t P = c.packed_length(), T = plain->num_tokens();
    const int64_t used = std::min(T, plain->num_rows() * P);
    ASSERT_EQ(static_cast<int64_t>(seen.size()), used);
    const std::set<std::pair<int64_t, int64_t>> distinct(seen.begin(), seen.end());
    ASSERT_EQ(distinct.size(), seen.size());
    // Order changes only within a window: a row of window w holds stream tokens of window w.
    const auto& starts = plain->document_starts();
    for (int64_t k = 0; k < rows.num_rows(); ++k) {
      const int64_t w = k / c.balance_window_rows;
      for (const Piece& p : rows.row_pieces(k)) {
        const int64_t s = starts[p.doc] + p.offset;
        ASSERT_GE(s, w * c.balance_window_rows * P);
        ASSERT_LE(s + p.count, (w + 1) * c.balance_window_rows * P);
      }
    }
  }
}

/// Exponential documents (mean `mean` tokens), as a MemorySource.
MemorySource exponential_docs(uint32_t seed, int64_t n, double mean) {
  std::mt19937 g(seed);
  std::exponential_distribution<double> e(1.0 / mean);
  std::vector<std::vector<int32_t>> docs(n);
  for (auto& d : docs) d.assign(1 + static_cast<int64_t>(e(g)), 7);
  return MemorySource(std::move(docs));
}

// (max − min) ÷ mean of `cost` over the first `rows` rows of `source`.
double cost_spread(const RowSource& source, int64_t rows, const RowCost& cost) {
  std::vector<double> costs;
  std::vector<int32_t> cu;
  for (int64_t k = 0; k < rows; ++k) {
    source.segments_into(k, cu);
    costs.push_back(cost.of(cu));
  }
  const auto [lo, hi] = std::minmax_element(costs.begin(), costs.end());
  return (*hi - *lo) / (std::accumulate(costs.begin(), costs.end(), 0.0) / costs.size());
}

TEST(Balance, DocumentsRowsCarryNearEqualAttentionWork) {
  const MemorySource src = exponential_docs(3, 2000, 300);
  PackConfig c;
  c.seq_len = 2048;
  c.micro_bsz = 1;
  c.pack_tail = PackTail::kDrop;
  c.balance_window_rows = 64;
  const auto order = document_order(src, 0, false, 0);
  PackConfig plain_config = c;
  plain_config.balance_window_rows = 0;
  const auto plain = build_pack(src, order, plain_config);
  BalancedRows rows(src, order, c);
  const RowCost attention{0, 1};
  // Spread of the attention work of the rows of the first window.
  const double before = cost_spread(*plain, c.balance_window_rows, attention),
               after = cost_spread(rows, c.balance_window_rows, attention);
  std::printf("[balance] attention spread of 64 rows: plain %.3f, documents %.3f\n", before, after);
  EXPECT_GT(before, 1.0);  // plain rows differ a lot (measured 3.3) ...
  EXPECT_LT(after, 0.1);   // ... balanced ones by a few percent (measured 0.03)
}

// With a sliding window the kernel computes only the visible pairs of a segment (≤ W per query), so
// a long document costs far less than its causal pairs: "documents" balances what the window leaves
// (balance_pairs = the cost with the window), and packing by causal pairs instead would not.
TEST(Balance, DocumentsRowsBalanceVisiblePairsUnderAWindow) {
  const MemorySource src = exponential_docs(3, 2000, 300);
  PackConfig c;
  c.seq_len = 2048;
  c.micro_bsz = 1;
  c.pack_tail = PackTail::kDrop;
  c.balance_window_rows = 64;
  const RowCost windowed{0, 1, /*window=*/256, /*windowed=*/1.0};
  const auto order = document_order(src, 0, false, 0);
  PackConfig causal_config = c;  // balance_pairs: every causal pair
  c.balance_pairs = windowed;
  BalancedRows causal(src, order, causal_config), visible(src, order, c);
  // Spread of the windowed attention work of the rows of the first window.
  const double by_causal = cost_spread(causal, c.balance_window_rows, windowed),
               by_visible = cost_spread(visible, c.balance_window_rows, windowed);
  std::printf("[balance] window 256: visible-pair spread of 64 rows packed by causal pairs %.3f, "
              "by visible pairs %.3f\n", by_causal, by_visible);
  EXPECT_LT(by_visible, 0.1);             // measured 0.064
  EXPECT_GT(by_causal, 2 * by_visible);    // measured 0.316
  // A window longer than every segment changes nothing: the same rows as the causal count.
  PackConfig wide = c;
  wide.balance_pairs.window = 4096;
  BalancedRows same(src, order, wide);
  ASSERT_EQ(same.num_rows(), causal.num_rows());
  for (int64_t k = 0; k < same.num_rows(); ++k)
    ASSERT_TRUE(std::ranges::equal(same.row_pieces(k), causal.row_pieces(k))) << "row " << k;
}

/// A two-file dataset of random documents (packs never cross a file).
Dataset two_files(uint32_t seed) {
  std::mt19937 g(seed);
  Dataset d;
  for (int f = 0; f < 2; ++f) {
    std::vector<std::vector<int32_t>> docs(60);
    for (auto& doc : docs) {
      doc.resize(std::uniform_int_distribution<int>(1, 70)(g));
      for (auto& t : doc) t = std::uniform_int_distribution<int32_t>(1, 500)(g);
    }
    d.push_back(std::make_unique<MemorySource>(std::move(docs), "file" + std::to_string(f)));
  }
  return d;
}

DataConfig loader_config(BalanceMode mode, int64_t micro_num, bool shuffle) {
  DataConfig c;
  c.pack.seq_len = 16;
  c.pack.micro_bsz = 2;
  c.micro_num = micro_num;
  c.shuffle = shuffle;
  c.balance.mode = mode;
  c.balance.window = 2;
  c.balance.cost = {1.0, 0.25};
  return c;
}

std::vector<int64_t> sorted_rows(const StepPlan& p) {
  std::vector<int64_t> all;
  for (const auto& r : p.rows) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end());
  return all;
}

// Typo-sized micro_num, data-parallel size or window: a clear "fewer rows than a step needs",
// never a product that wraps past 64 bits (micro_num 2^62 × dp 4 once divided by zero).
TEST(Balance, HugeStepSizesAreRefusedWithoutOverflow) {
  const int64_t huge = int64_t{1} << 62;
  for (const auto& [micro_num, dp] : std::vector<std::pair<int64_t, int64_t>>{
           {huge, 4}, {3, huge}, {huge, huge}}) {
    try {
      BatchLoader loader(two_files(4), loader_config(BalanceMode::kNone, micro_num, false), dp);
      ADD_FAILURE() << "no error for micro_num " << micro_num << " x dp " << dp;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fewer than one step needs"), std::string::npos) << e.what();
    }
  }
  // A documents window wider than the dataset is one window over all of it.
  DataConfig c = loader_config(BalanceMode::kDocuments, 3, false);
  c.balance.window = INT64_MAX;
  const BatchLoader wide(two_files(4), c, 2);
  EXPECT_EQ(sorted_rows(wide.plan(0)).size(), 6u);
}

TEST(Balance, RowsModeKeepsEachStepsRowsAndBalancesRanks) {
  for (const bool shuffle : {false, true}) {
    const BatchLoader none(two_files(4), loader_config(BalanceMode::kNone, 3, shuffle), 4);
    const BatchLoader rows(two_files(4), loader_config(BalanceMode::kRows, 3, shuffle), 4);
    ASSERT_EQ(none.steps_per_epoch(), rows.steps_per_epoch());
    for (int64_t s = 0; s < 2 * none.steps_per_epoch(); ++s) {
      const StepPlan a = none.plan(s), b = rows.plan(s);
      for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(a.rows[r], none.sampler().rows(r, s));
      EXPECT_EQ(sorted_rows(a), sorted_rows(b));  // the same global batch
      EXPECT_NEAR(std::accumulate(a.cost.begin(), a.cost.end(), 0.0),
                  std::accumulate(b.cost.begin(), b.cost.end(), 0.0), 1e-9);
      EXPECT_LE(b.imbalance(), a.imbalance() + 1e-12);
      // The greedy bound: ranks within one row's cost of each other.
      double top = 0;
      std::vector<int32_t> cu;
      for (const int64_t row : sorted_rows(b)) {
        rows.rows().segments_into(row, cu);
        top = std::max(top, RowCost{1.0, 0.25}.of(cu));
      }
      const auto [lo, hi] = std::minmax_element(b.cost.begin(), b.cost.end());
      EXPECT_LE(*hi - *lo, top + 1e-9);
      // Every rank gets its rows' micro-batches, in plan order.
      const auto mbs = rows.micro_batches(b, 1);
      ASSERT_EQ(mbs.size(), 3u);
      EXPECT_EQ(mbs[2].input_ids, rows.rows().row(b.rows[1][2]).input_ids);
      EXPECT_EQ(rows.step(1, s)[0].input_ids, mbs[0].input_ids);
    }
  }
}

TEST(Balance, DocumentsDependOnlyOnTheGlobalBatch) {
  // dp 2 × micro_num 3 and dp 1 × micro_num 6: the same windows, the same rows, the same steps.
  for (const bool shuffle : {false, true}) {
    const BatchLoader dp2(two_files(5), loader_config(BalanceMode::kDocuments, 3, shuffle), 2);
    const BatchLoader one(two_files(5), loader_config(BalanceMode::kDocuments, 6, shuffle), 1);
    ASSERT_EQ(dp2.num_rows(), one.num_rows());
    for (int64_t k = 0; k < dp2.num_rows(); ++k)
      ASSERT_EQ(dp2.rows().row(k).input_ids, one.rows().row(k).input_ids);
    for (int64_t s = 0; s < dp2.steps_per_epoch(); ++s)
      EXPECT_EQ(sorted_rows(dp2.plan(s)), sorted_rows(one.plan(s)));
    // A fresh loader (a resumed run) plans every step as the first one did.
    const BatchLoader again(two_files(5), loader_config(BalanceMode::kDocuments, 3, shuffle), 2);
    for (int64_t s = 0; s < 2 * dp2.steps_per_epoch(); ++s)
      EXPECT_EQ(dp2.plan(s).rows, again.plan(s).rows);
  }
}

TEST(Balance, NoneAndRowsKeepThePlainRows) {
  const BatchLoader plain(two_files(6), loader_config(BalanceMode::kNone, 2, true), 2);
  const BatchLoader rows(two_files(6), loader_config(BalanceMode::kRows, 2, true), 2);
  const BatchLoader docs(two_files(6), loader_config(BalanceMode::kDocuments, 2, true), 2);
  ASSERT_EQ(plain.num_rows(), docs.num_rows());
  for (int64_t k = 0; k < plain.num_rows(); ++k)
    ASSERT_EQ(plain.rows().row(k).input_ids, rows.rows().row(k).input_ids);
  // Documents rows hold the same tokens per file, re-packed: the same multiset over the dataset.
  std::multiset<int32_t> a, b;
  for (int64_t k = 0; k < plain.num_rows(); ++k) {
    for (int32_t t : plain.rows().row(k).input_ids) a.insert(t);
    for (int32_t t : docs.rows().row(k).input_ids) b.insert(t);
  }
  EXPECT_EQ(a, b);
}

TEST(Balance, SegmentsMatchTheRowsPackedAndUnpacked) {
  std::mt19937 g(13);
  for (int trial = 0; trial < 1500; ++trial) {
    MemorySource src(random_docs(g, 12, 30));
    PackConfig c;
    c.seq_len = std::uniform_int_distribution<int>(1, 9)(g);
    c.micro_bsz = std::uniform_int_distribution<int>(1, 4)(g);
    c.pack_tail = trial % 3 == 0 ? PackTail::kDrop : PackTail::kPad;
    c.pack_sample_into_one = trial % 4 == 1;
    c.split_documents = trial % 5 != 2;
    const auto order = document_order(src, 0, trial % 2 == 0, trial);
    const auto rows = build_pack(src, order, c);
    std::vector<int32_t> cu;
    for (int64_t k = 0; k < rows->num_rows(); ++k) {
      rows->segments_into(k, cu);
      ASSERT_EQ(cu, rows->row(k).cu_seqlens) << "trial " << trial << " row " << k;
    }
    c.use_packed_dataset = false;
    const auto unpacked = build_unpack(src, order, c);
    for (int64_t k = 0; k < unpacked->num_rows(); ++k) {
      unpacked->segments_into(k, cu);
      ASSERT_EQ(cu, unpacked->row(k).cu_seqlens) << "trial " << trial << " unpacked row " << k;
    }
  }
}

}  // namespace
}  // namespace longtron::data
