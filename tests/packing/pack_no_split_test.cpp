// data.split_documents = false over random documents and configs: no document is cut unless it is
// longer than P (then it starts a row and is cut into P-long pieces), every pad gap is one segment
// at a row end with tokens 0 / labels -100, the pad count is rows·P − tokens, and labels never cross
// a document. Documents are recognisable by their ids (document d holds 1000·(d+1) + j), so each
// row can be traced back without replaying the packer.
#include <gtest/gtest.h>

#include <random>

#include "data/memory_source.h"
#include "packing/pack.h"

namespace longtron::data {
namespace {

struct Case {
  std::vector<std::vector<int32_t>> docs;
  PackConfig config;
};

Case random_case(std::mt19937& g) {
  Case c;
  c.config.seq_len = std::uniform_int_distribution<int64_t>(1, 9)(g);
  c.config.micro_bsz = std::uniform_int_distribution<int64_t>(1, 3)(g);
  c.config.split_documents = false;
  c.config.pack_sample_into_one = g() % 5 == 0;
  c.config.pack_tail = g() % 3 == 0 ? PackTail::kDrop : PackTail::kPad;
  const int64_t P = c.config.packed_length();
  c.docs.resize(std::uniform_int_distribution<size_t>(1, 12)(g));
  for (size_t d = 0; d < c.docs.size(); ++d) {
    // Mostly shorter than P, sometimes longer (up to 2.5 P).
    const int64_t len = std::uniform_int_distribution<int64_t>(1, g() % 4 == 0 ? 5 * P / 2 + 1 : P)(g);
    for (int64_t j = 0; j < len; ++j) {
      const int32_t id = int32_t(1000 * (d + 1) + j);
      c.docs[d].push_back(g() % 4 == 0 ? -id : id);  // some no-loss tokens, as SFT stores them
    }
  }
  return c;
}

TEST(PackNoSplit, RandomProperties) {
  std::mt19937 g(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const Case c = random_case(g);
    const int64_t P = c.config.packed_length();
    MemorySource src(c.docs);
    std::vector<int64_t> order(c.docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
    const auto rows = build_pack(src, order, c.config);
    SCOPED_TRACE(testing::Message() << "trial " << trial << " L " << c.config.seq_len << " B "
                                    << c.config.micro_bsz << " into_one "
                                    << c.config.pack_sample_into_one);
    int64_t tokens = 0, pads = 0;
    std::vector<int64_t> seen(c.docs.size(), 0);  // tokens of each document met so far
    for (int64_t k = 0; k < rows->num_rows(); ++k) {
      const MicroBatch b = rows->row(k);
      ASSERT_EQ(int64_t(b.input_ids.size()), P);
      int64_t i = 0;
      while (i < P && b.input_ids[size_t(i)] != 0) {  // document pieces, then only pad
        const int64_t d = b.input_ids[size_t(i)] / 1000 - 1;
        const int64_t len = int64_t(c.docs[size_t(d)].size());
        const int64_t first = b.input_ids[size_t(i)] % 1000;
        ASSERT_EQ(first, seen[size_t(d)]) << "document " << d << " resumes where it stopped";
        // A document starting mid-row fits the row; one continued from the previous row was
        // longer than P and then started at a row start.
        if (first == 0 && i > 0) {
          ASSERT_LE(len, P - i) << "document " << d << " cut at row " << k;
        }
        if (first > 0) {
          ASSERT_EQ(i, 0);
          ASSERT_GT(len, P);
          ASSERT_EQ(first % P, 0) << "pieces of a long document are P long";
        }
        const int64_t piece = std::min(len - first, P - i);
        for (int64_t j = 0; j < piece; ++j) {
          const int64_t at = i + j;
          ASSERT_EQ(b.input_ids[size_t(at)], 1000 * (d + 1) + first + j);
          // Labels stay inside the document: the next token (if it carries loss) or -100.
          int32_t want = kIgnoreIndex;
          if (first + j + 1 < len && !(c.config.pack_sample_into_one && j + 1 == piece)) {
            const int32_t next = c.docs[size_t(d)][size_t(first + j + 1)];
            want = next > 0 ? next : kIgnoreIndex;
          }
          ASSERT_EQ(b.labels[size_t(at)], want) << "row " << k << " position " << at;
        }
        seen[size_t(d)] += piece;
        tokens += piece;
        i += piece;
      }
      for (int64_t j = i; j < P; ++j) {  // the rest of the row: pad
        ASSERT_EQ(b.input_ids[size_t(j)], 0);
        ASSERT_EQ(b.labels[size_t(j)], kIgnoreIndex);
      }
      pads += P - i;
      if (!c.config.pack_sample_into_one && i < P) {  // one pad segment, [i, P)
        ASSERT_GE(b.cu_seqlens.size(), 2u);
        ASSERT_EQ(b.cu_seqlens[b.cu_seqlens.size() - 2], i);
        ASSERT_EQ(b.cu_seqlens.back(), P);
        for (size_t s = 1; s + 1 < b.cu_seqlens.size(); ++s)
          ASSERT_LE(b.cu_seqlens[s] - b.cu_seqlens[s - 1], c.config.seq_len);
      }
    }
    EXPECT_EQ(tokens + pads, rows->num_rows() * P);
    if (c.config.pack_tail == PackTail::kPad) {
      for (size_t d = 0; d < c.docs.size(); ++d) EXPECT_EQ(seen[d], int64_t(c.docs[d].size()));
      EXPECT_EQ(tokens, rows->num_tokens());
    }
  }
}

// When no document crosses a row edge anyway, both settings give identical rows; on a stream
// where one does, split_documents = true is today's packing (the worked example of docs/data.md
// tests is covered by pack_test) and false moves the document.
TEST(PackNoSplit, SameRowsWhenNothingIsCutAndMovesOtherwise) {
  PackConfig split;
  split.seq_len = 4;
  split.micro_bsz = 2;
  PackConfig no_split = split;
  no_split.split_documents = false;
  MemorySource fits({{1, 2, 3}, {4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}, {17}});
  const std::vector<int64_t> order{0, 1, 2, 3};
  const auto a = build_pack(fits, order, split), b = build_pack(fits, order, no_split);
  ASSERT_EQ(a->num_rows(), b->num_rows());
  for (int64_t k = 0; k < a->num_rows(); ++k) {
    EXPECT_EQ(a->row(k).input_ids, b->row(k).input_ids);
    EXPECT_EQ(a->row(k).labels, b->row(k).labels);
    EXPECT_EQ(a->row(k).cu_seqlens, b->row(k).cu_seqlens);
  }
  MemorySource cut({{1, 2, 3, 4, 5}, {6, 7, 8, 9}});  // P = 8: the second document does not fit
  const MicroBatch s0 = build_pack(cut, {0, 1}, split)->row(0);
  EXPECT_EQ(s0.input_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s0.labels, (std::vector<int32_t>{2, 3, 4, 5, -100, 7, 8, 9}));
  const auto moved = build_pack(cut, {0, 1}, no_split);
  ASSERT_EQ(moved->num_rows(), 2);
  const MicroBatch m0 = moved->row(0), m1 = moved->row(1);
  EXPECT_EQ(m0.input_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 0, 0, 0}));
  EXPECT_EQ(m0.labels, (std::vector<int32_t>{2, 3, 4, 5, -100, -100, -100, -100}));
  EXPECT_EQ(m0.cu_seqlens, (std::vector<int32_t>{0, 4, 5, 8}));
  EXPECT_EQ(m1.input_ids, (std::vector<int32_t>{6, 7, 8, 9, 0, 0, 0, 0}));
  EXPECT_EQ(m1.labels, (std::vector<int32_t>{7, 8, 9, -100, -100, -100, -100, -100}));
  EXPECT_EQ(m1.cu_seqlens, (std::vector<int32_t>{0, 4, 8}));
  EXPECT_EQ(moved->document_starts(), (std::vector<int64_t>{0, 8, 12}));
}

}  // namespace
}  // namespace longtron::data
