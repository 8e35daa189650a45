// Preference pairs on disk and in rows (data/preference_pairs.h, packing/pair_pack.h): the
// tokenized-columns reader and writer, bad lines named by file and line, rows that keep each pair
// whole, labels and answer offsets, TRL's truncation, and the data settings refused with pairs.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/open.h"
#include "data/preference_pairs.h"
#include "expect_error.h"
#include "packing/loader.h"
#include "packing/pair_pack.h"
#include "test_util.h"

namespace longtron::data {
namespace {

using testing::expect_error;

std::vector<PairIds> three_pairs() {
  return {{{1, 2, 3}, {4, 5}, {6}}, {{7}, {8, 9, 10}, {11, 12}}, {{13, 14}, {0, 15}, {16, 17, 18}}};
}

TEST(PreferencePairs, WrittenAndReadBackAsTrlsTokenizedColumns) {
  testing::TempDir dir;
  write_preference_pairs(dir / "p.jsonl", three_pairs());
  EXPECT_EQ(testing::read_file(dir / "p.jsonl").substr(0, 82),
            "{\"prompt_input_ids\": [1, 2, 3], \"chosen_input_ids\": [4, 5], \"rejected_input_ids\": ");
  const Dataset ds = open_dataset(dir.path());  // a .jsonl of pairs is recognised by its columns
  ASSERT_EQ(ds.size(), 1u);
  const auto* pairs = dynamic_cast<const PairSource*>(ds[0].get());
  ASSERT_NE(pairs, nullptr);
  ASSERT_EQ(pairs->num_pairs(), 3u);
  EXPECT_EQ(pairs->num_documents(), 6u);
  EXPECT_EQ(pairs->pair(2).chosen, (std::vector<int32_t>{0, 15}));
  EXPECT_EQ(pairs->document_length(3), 1u + 2);  // prompt + rejected of pair 1
  EXPECT_EQ(pairs->prompt_length(4), 2u);
  std::vector<int32_t> ids(4);
  pairs->read_tokens(4, 0, 4, ids.data());  // id 0 carries loss: stored as kStoredLossZero
  EXPECT_EQ(ids, (std::vector<int32_t>{13, 14, kStoredLossZero, 15}));
}

TEST(PreferencePairs, BadLinesNameFileLineAndReason) {
  testing::TempDir dir;
  const auto bad = [&](const std::string& second, const std::string& reason) {
    testing::write_file(dir / "p.jsonl",
                        "{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2], "
                        "\"rejected_input_ids\": [3]}\n\n" + second + "\n");
    expect_error([&] { open_preference_pairs(dir / "p.jsonl"); },
                 {(dir / "p.jsonl").string(), "line 3", reason});
  };
  bad("{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2]}", "rejected_input_ids");
  bad("{\"prompt_input_ids\": [], \"chosen_input_ids\": [2], \"rejected_input_ids\": [3]}",
      "non-empty");
  bad("{\"prompt_input_ids\": [1], \"chosen_input_ids\": [-2], \"rejected_input_ids\": [3]}",
      "chosen_input_ids[0] is not a token id");
  bad("{\"input_ids\": [1, 2]}", "a supervised row");
  bad("[1, 2]", "expected a JSON object");
  bad("{\"prompt_input_ids\": [1", "not valid JSON");
}

PackConfig pack(int64_t L, int64_t B) {
  PackConfig c;
  c.seq_len = L;
  c.micro_bsz = B;
  return c;
}

TEST(PairRows, PairsStayWholeWithLabelsAndAnswers) {
  const PairSource src(three_pairs(), "<p>");
  // Sequences: pair 0: 5 and 4 tokens; pair 1: 4 and 3; pair 2: 4 and 5. P = 16.
  PairRows rows(src, {0, 1, 2}, pack(8, 2));
  ASSERT_EQ(rows.num_rows(), 2);  // 9 + 7 = 16 fill row 0; pair 2 starts row 1
  const MicroBatch r0 = rows.row(0);
  EXPECT_EQ(r0.cu_seqlens, (std::vector<int32_t>{0, 5, 9, 13, 16}));
  EXPECT_EQ(r0.input_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8, 9, 10, 7, 11, 12}));
  const int I = kIgnoreIndex;
  EXPECT_EQ(r0.labels, (std::vector<int32_t>{2, 3, 4, 5, I, 2, 3, 6, I, 8, 9, 10, I, 11, 12, I}));
  EXPECT_EQ(r0.indexes, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2}));
  ASSERT_EQ(r0.pairs.size(), 2u);
  const PairInRow& p0 = r0.pairs[0];
  EXPECT_EQ(p0.id, 0);
  EXPECT_EQ(std::vector<int32_t>({p0.chosen_begin, p0.chosen_answer, p0.chosen_end}),
            std::vector<int32_t>({0, 2, 5}));  // positions 2, 3 predict 4, 5
  EXPECT_EQ(std::vector<int32_t>({p0.rejected_begin, p0.rejected_answer, p0.rejected_end}),
            std::vector<int32_t>({5, 7, 9}));
  EXPECT_EQ(r0.pairs[1].chosen_answer, 9);  // a one-token prompt: position 9 predicts 8
  const MicroBatch r1 = rows.row(1);
  EXPECT_EQ(r1.cu_seqlens, (std::vector<int32_t>{0, 4, 9, 16}));  // the rest is one pad segment
  EXPECT_EQ(r1.labels[1], 0);  // id 0 is a target
  EXPECT_EQ(r1.indexes[15], 6);
  EXPECT_EQ(r1.max_seqlen, 7);
  std::vector<int32_t> cu;
  rows.segments_into(1, cu);
  EXPECT_EQ(cu, r1.cu_seqlens);
}

TEST(PairRows, TruncationAsTrlsMaxLengthAndMode) {
  const PairSource src({{{1, 2, 3, 4}, {5, 6, 7, 8}, {9}}}, "<p>");
  PackConfig c = pack(6, 2);
  expect_error([&] { PairRows(src, {0}, c); },
               {"<p>, line 1", "chosen sequence", "8 tokens", "data.seq_len = 6",
                "preference.max_length"});
  c.pair_max_length = 6;  // keep_start: 1 2 3 4 | 5 6
  MicroBatch b = PairRows(src, {0}, c).row(0);
  EXPECT_EQ(std::vector<int32_t>(b.input_ids.begin(), b.input_ids.begin() + 6),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(b.pairs[0].chosen_answer, 3);
  c.pair_keep_end = true;  // keep_end: 3 4 | 5 6 7 8 (the prompt loses its head)
  b = PairRows(src, {0}, c).row(0);
  EXPECT_EQ(std::vector<int32_t>(b.input_ids.begin(), b.input_ids.begin() + 6),
            (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b.pairs[0].chosen_answer, 1);
  EXPECT_EQ(b.pairs[0].rejected_end - b.pairs[0].rejected_begin, 5);  // 1 2 3 4 9: not cut
  c.pair_keep_end = false;
  c.pair_max_length = 4;  // keep_start leaves the prompt alone: no answer token
  expect_error([&] { PairRows(src, {0}, c); }, {"<p>, line 1", "no answer token"});
  expect_error([&] { PairRows(src, {0}, pack(8, 1)); },
               {"<p>, line 1", "the pair has 13 tokens", "packed_length", "never split"});
}

TEST(PairRows, ShuffleMovesPairsAsUnitsAndEveryPairOnce) {
  std::vector<PairIds> many;
  for (int32_t i = 1; i <= 40; ++i) many.push_back({{i}, {i, i + 1}, {i + 2}});
  const PairSource src(std::move(many), "<p>");
  const std::vector<int64_t> order = pair_order(src, true, 1024);
  EXPECT_NE(order, pair_order(src, false, 1024));
  PairRows rows(src, order, pack(4, 3));
  std::multiset<int64_t> seen;
  for (int64_t k = 0; k < rows.num_rows(); ++k) {
    const MicroBatch b = rows.row(k);
    for (const PairInRow& p : b.pairs) {
      seen.insert(p.id);
      EXPECT_EQ(b.input_ids[p.chosen_begin], b.input_ids[p.rejected_begin]);  // the same prompt
      EXPECT_EQ(b.input_ids[p.chosen_begin], p.id + 1);
    }
  }
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 40u);
}

TEST(PairRows, SettingsThatWouldSeparateAPairAreRefused) {
  testing::TempDir dir;
  write_preference_pairs(dir / "p.jsonl", three_pairs());
  const auto refused = [&](DataConfig c, const std::string& key) {
    expect_error([&] { BatchLoader(open_dataset(dir.path()), c, 1); }, {"p.jsonl", key});
  };
  DataConfig c;
  c.pack = pack(8, 2);
  BatchLoader ok(open_dataset(dir.path()), c, 1);
  EXPECT_TRUE(ok.has_pairs());
  EXPECT_FALSE(ok.step(0, 0)[0].pairs.empty());
  DataConfig d = c;
  d.pack.use_packed_dataset = false;
  refused(d, "data.use_packed_dataset");
  d = c;
  d.pack.pack_sample_into_one = true;
  refused(d, "data.pack_sample_into_one");
  d = c;
  d.min_length = 3;
  refused(d, "data.min_length");
  d = c;
  d.balance.mode = BalanceMode::kDocuments;
  refused(d, "data.balance");
  testing::write_file(dir / "q.jsonl", "{\"input_ids\": [1, 2, 3]}\n");  // documents beside pairs
  expect_error([&] { BatchLoader(open_dataset(dir.path()), c, 1); },
               {"q.jsonl", "pair files only"});
}

}  // namespace
}  // namespace longtron::data
