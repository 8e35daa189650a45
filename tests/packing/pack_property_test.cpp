// Properties of build_pack / build_unpack / sampler / sequence split over thousands of random
// documents and configs, checked against a replay of the token stream (the packer itself never
// replays: it binary-searches prefix sums).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "data/memory_source.h"
#include "packing/pack.h"
#include "packing/sampler.h"
#include "packing/sequence_split.h"
#include "packing/unpack.h"

namespace longtron::data {
namespace {

struct Token {
  int32_t id;     // as stored
  int64_t doc;    // position in the order
  bool doc_last;  // last token of its document
};

std::vector<std::vector<int32_t>> random_docs(std::mt19937& g, int max_docs, int max_len) {
  std::vector<std::vector<int32_t>> docs(std::uniform_int_distribution<int>(1, max_docs)(g));
  for (auto& d : docs) {
    d.resize(std::uniform_int_distribution<int>(0, max_len)(g));
    for (auto& t : d) {
      t = std::uniform_int_distribution<int32_t>(-20, 1000)(g);  // negatives and zeros included
    }
  }
  return docs;
}

std::vector<Token> stream_of(const MemorySource& src, const std::vector<int64_t>& order) {
  std::vector<Token> s;
  for (size_t d = 0; d < order.size(); ++d) {
    const size_t n = src.document_length(order[d]);
    std::vector<int32_t> t(n);
    src.read_tokens(order[d], 0, n, t.data());
    for (size_t i = 0; i < n; ++i) s.push_back({t[i], static_cast<int64_t>(d), i + 1 == n});
  }
  return s;
}

int32_t expect_input(int32_t id) { return std::abs(id); }
int32_t expect_label(int32_t id) { return id > 0 ? id : -100; }

void check_segments(const MicroBatch& r, int64_t P, int64_t L, int64_t filled, int64_t k) {
  ASSERT_EQ(r.cu_seqlens.front(), 0);
  ASSERT_EQ(r.cu_seqlens.back(), P);
  int32_t longest = 0;
  for (size_t s = 1; s < r.cu_seqlens.size(); ++s) {
    const int32_t a = r.cu_seqlens[s - 1], b = r.cu_seqlens[s];
    ASSERT_LT(a, b);
    longest = std::max(longest, b - a);
    const bool pad = a >= filled;
    if (!pad) {
      ASSERT_LE(b - a, L) << "row " << k;
    } else {
      ASSERT_EQ(b, P);  // the pad is one segment
    }
    for (int32_t j = a; j < b; ++j) ASSERT_EQ(r.indexes[j], j - a);  // restart per segment
  }
  ASSERT_EQ(r.max_seqlen, longest);
}

TEST(PackProperty, PackedRowsMatchTheStream) {
  std::mt19937 g(7);
  for (int trial = 0; trial < 3000; ++trial) {
    MemorySource src(random_docs(g, 12, 30));
    PackConfig c;
    c.seq_len = std::uniform_int_distribution<int>(1, 9)(g);
    c.micro_bsz = std::uniform_int_distribution<int>(1, 4)(g);
    c.pack_tail = trial % 3 == 0 ? PackTail::kDrop : PackTail::kPad;
    c.pack_sample_into_one = trial % 4 == 1;
    const auto order = document_order(src, trial % 5, trial % 2 == 0, trial);
    const auto stream = stream_of(src, order);
    const int64_t P = c.packed_length(), T = static_cast<int64_t>(stream.size());
    auto rows = build_pack(src, order, c);
    ASSERT_EQ(rows->num_rows(), c.pack_tail == PackTail::kPad ? (T + P - 1) / P : T / P);
    int64_t next = 0;  // stream position: every non-pad token exactly once and in order
    MicroBatch r;
    for (int64_t k = 0; k < rows->num_rows(); ++k) {
      rows->row_into(k, r);
      const int64_t filled = std::min(P, T - next);
      ASSERT_EQ(next, k * P);
      for (int64_t i = 0; i < P; ++i) {
        if (i >= filled) {
          ASSERT_EQ(r.input_ids[i], 0);
          ASSERT_EQ(r.labels[i], -100);
          continue;
        }
        const Token& t = stream[next + i];
        ASSERT_EQ(r.input_ids[i], expect_input(t.id)) << "trial " << trial << " row " << k;
        int32_t want = t.doc_last ? -100 : expect_label(stream[next + i + 1].id);
        if (c.pack_sample_into_one && i == P - 1) want = -100;
        ASSERT_EQ(r.labels[i], want) << "trial " << trial << " row " << k << " i " << i;
      }
      if (c.pack_sample_into_one) {
        for (size_t s = 0; s < r.cu_seqlens.size(); ++s) ASSERT_EQ(r.cu_seqlens[s], s * c.seq_len);
        for (int64_t i = 0; i < P; ++i) ASSERT_EQ(r.indexes[i], i % c.seq_len);
      } else {
        check_segments(r, P, c.seq_len, filled, k);
        std::set<int32_t> cuts(r.cu_seqlens.begin(), r.cu_seqlens.end());
        for (int64_t i = 0; i + 1 < filled; ++i)  // every document boundary is a segment boundary
          if (stream[next + i].doc_last) {
            ASSERT_TRUE(cuts.count(i + 1)) << "trial " << trial;
          }
      }
      next += filled;
    }
    if (c.pack_tail == PackTail::kPad) {
      ASSERT_EQ(next, T);
    }
  }
}

TEST(PackProperty, UnpackedRowsAndUnpackData) {
  std::mt19937 g(11);
  for (int trial = 0; trial < 2000; ++trial) {
    MemorySource src(random_docs(g, 12, 14));
    PackConfig c;
    c.seq_len = std::uniform_int_distribution<int>(1, 8)(g);
    c.micro_bsz = std::uniform_int_distribution<int>(1, 4)(g);
    c.use_packed_dataset = false;
    const auto order = document_order(src, 0, trial % 2 == 0, trial);
    auto rows = build_unpack(src, order, c);
    const auto B = c.micro_bsz, L = c.seq_len;
    ASSERT_EQ(rows->num_rows(), (static_cast<int64_t>(order.size()) + B - 1) / B);
    for (int64_t k = 0; k < rows->num_rows(); ++k) {
      MicroBatch r = rows->row(k);
      UnpackedBatch u = unpack_data(r, B, L);
      int64_t filled = 0;
      for (int64_t j = 0; j < B; ++j) {
        const int64_t d = k * B + j;
        std::vector<int32_t> doc;
        if (d < static_cast<int64_t>(order.size())) {
          doc.resize(src.document_length(order[d]));
          src.read_tokens(order[d], 0, doc.size(), doc.data());
        }
        const int64_t kept = std::min<int64_t>(doc.size(), L);
        filled += kept;
        for (int64_t i = 0; i < L; ++i) {
          const int32_t in = i < kept ? expect_input(doc[i]) : 0;
          const int32_t lab = i + 1 < kept ? expect_label(doc[i + 1]) : -100;
          ASSERT_EQ(u.input_ids[j * L + i], in) << "trial " << trial;
          ASSERT_EQ(u.labels[j * L + i], lab) << "trial " << trial;
        }
      }
      check_segments(r, B * L, L, filled, k);
    }
  }
}

TEST(PackProperty, DpShardsDisjointAndCovering) {
  std::mt19937 g(3);
  for (int trial = 0; trial < 1000; ++trial) {
    const int64_t micro_num = std::uniform_int_distribution<int>(1, 4)(g);
    const int64_t dp = std::uniform_int_distribution<int>(1, 5)(g);
    const int64_t rows = micro_num * dp + std::uniform_int_distribution<int>(0, 40)(g);
    StaticBatchSampler s(rows, micro_num, dp, trial % 2 == 0, trial);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::multiset<int64_t> seen;
      for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
        std::set<int64_t> this_step;
        for (int64_t r = 0; r < dp; ++r)
          for (int64_t row : s.rows(r, epoch * s.steps_per_epoch() + step)) {
            ASSERT_TRUE(row >= 0 && row < rows);
            this_step.insert(row);
            seen.insert(row);
          }
        ASSERT_EQ(static_cast<int64_t>(this_step.size()), micro_num * dp);  // disjoint
      }
      // Covering: all rows but the truncated remainder, each exactly once.
      ASSERT_EQ(static_cast<int64_t>(seen.size()), rows / (micro_num * dp) * micro_num * dp);
      ASSERT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size());
    }
  }
}

TEST(PackProperty, SamplerStateResumesExactly) {
  StaticBatchSampler a(37, 2, 3, true, 5);  // 6 steps per epoch
  for (int i = 0; i < 9; ++i) a.next(1);
  const SamplerState saved = a.state();
  EXPECT_EQ(saved, (SamplerState{1, 3}));
  nlohmann::json j = saved;
  StaticBatchSampler b(37, 2, 3, true, 5);
  b.restore(j.get<SamplerState>());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next(1), b.next(1));
  EXPECT_EQ(a.state(), b.state());
  // Epoch 1 is a different, deterministic order.
  EXPECT_NE(a.rows(0, 0), a.rows(0, 6));
  EXPECT_EQ(a.rows(0, 6), b.rows(0, 6));
  EXPECT_THROW(b.restore({0, 6}), Error);
  EXPECT_THROW(StaticBatchSampler(5, 2, 3, false, 0), Error);
}

TEST(PackProperty, SequenceShardsConcatenateToTheRow) {
  std::mt19937 g(5);
  for (int trial = 0; trial < 1000; ++trial) {
    MemorySource src(random_docs(g, 8, 20));
    PackConfig c;
    c.seq_len = std::uniform_int_distribution<int>(1, 7)(g);
    c.micro_bsz = std::uniform_int_distribution<int>(1, 3)(g);
    auto rows = build_pack(src, document_order(src, 0, false, 0), c);
    if (rows->num_rows() == 0) continue;
    MicroBatch row = rows->row(0);
    const int64_t T = std::uniform_int_distribution<int>(1, 5)(g);
    MicroBatch padded = row;
    pad_for_sequence_parallel(padded, T);
    ASSERT_EQ(padded.input_ids.size() % T, 0u);
    ASSERT_EQ(padded.cu_seqlens.back(), static_cast<int32_t>(padded.input_ids.size()));
    MicroBatch again = padded;
    packed_data_normalizer(again);
    ASSERT_EQ(again.max_seqlen, padded.max_seqlen);
    std::vector<int32_t> in, lab, idx;
    for (int64_t r = 0; r < T; ++r) {
      MicroBatch s = split_for_sequence_parallel(padded, T, r);
      ASSERT_EQ(s.cu_seqlens, padded.cu_seqlens);
      in.insert(in.end(), s.input_ids.begin(), s.input_ids.end());
      lab.insert(lab.end(), s.labels.begin(), s.labels.end());
      idx.insert(idx.end(), s.indexes.begin(), s.indexes.end());
    }
    ASSERT_EQ(in, padded.input_ids);
    ASSERT_EQ(lab, padded.labels);
    ASSERT_EQ(idx, padded.indexes);
    ASSERT_EQ(std::vector<int32_t>(in.begin(), in.begin() + row.input_ids.size()), row.input_ids);
  }
}

TEST(PackProperty, ReduceSequenceParallelLossIsTheTokenMean) {
  std::mt19937 g(9);
  for (int trial = 0; trial < 500; ++trial) {
    const int T = std::uniform_int_distribution<int>(1, 6)(g);
    std::vector<double> means(T);
    std::vector<int64_t> counts(T);
    double sum = 0;
    int64_t n = 0;
    for (int r = 0; r < T; ++r) {
      counts[r] = std::uniform_int_distribution<int>(0, 3)(g) == 0 ? 0 : std::uniform_int_distribution<int>(1, 50)(g);
      double s = 0;
      for (int64_t t = 0; t < counts[r]; ++t) s += std::uniform_real_distribution<double>(0, 5)(g);
      means[r] = counts[r] ? s / counts[r] : std::nan("");  // HF's 0/0 on an empty shard
      sum += s;
      n += counts[r];
    }
    const double got = reduce_sequence_parallel_loss(means, counts);
    ASSERT_FALSE(std::isnan(got));
    ASSERT_NEAR(got, n ? sum / n : 0.0, 1e-12 * (1 + std::abs(got)));
  }
  EXPECT_THROW(reduce_sequence_parallel_loss(std::vector<double>{1.0}, std::vector<int64_t>{}),
               Error);
}

TEST(PackProperty, SequenceParallelSamplerShardsByDpOnly) {
  for (int64_t n : {1, 7, 16, 33}) {
    for (int64_t sp : {1, 2, 4}) {
      const int64_t world = 8;
      std::vector<int64_t> all;
      for (int64_t rank = 0; rank < world; ++rank) {
        SequenceParallelSampler s(n, world, sp, rank, true, 3);
        SequenceParallelSampler first(n, world, sp, rank / sp * sp, true, 3);
        ASSERT_EQ(s.indices(2), first.indices(2));  // one SP group, identical data
        if (rank % sp == 0) {
          auto idx = s.indices(0);
          all.insert(all.end(), idx.begin(), idx.end());
        }
      }
      const int64_t dp = world / sp;
      ASSERT_EQ(static_cast<int64_t>(all.size()), (n + dp - 1) / dp * dp);  // round_up
      ASSERT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), static_cast<size_t>(n));
    }
  }
  EXPECT_THROW(SequenceParallelSampler(10, 6, 4, 0, false, 0), Error);
}

}  // namespace
}  // namespace longtron::data
