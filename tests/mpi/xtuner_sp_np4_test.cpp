// XTuner's sequence-parallel API end to end on 4 ranks (sp 2 × dp 2): init_sequence_parallel's
// groups, the sampler giving every rank of an SP group the same rows, pad + split of a row whose
// length is not divisible by sp, the ISP model on the shard, and reduce_sequence_parallel_loss
// equal to the one-process loss of the row — plus its zero-token and NaN cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "core/error.h"
#include "data/memory_source.h"
#include "model/decoder.h"
#include "modes/isp_ops.h"
#include "mpi_test_main.h"
#include "packing/pack.h"
#include "packing/sequence_split.h"
#include "parallel/layout.h"
#include "parallel/sequence_parallel.h"

namespace longtron::testing {
namespace {

using parallel::SequenceParallelGroups;

TEST(XtunerSpNp4, Groups) {
  const int r = world()->rank();
  SequenceParallelGroups g = parallel::init_sequence_parallel(world(), 2);
  EXPECT_EQ(g.sp_size(), 2);
  EXPECT_EQ(g.dp_size(), 2);
  EXPECT_EQ(g.sp_rank(), r % 2);  // contiguous SP blocks {0,1}, {2,3}
  EXPECT_EQ(g.dp_rank(), r / 2);  // strided DP {0,2}, {1,3}
  EXPECT_THROW(parallel::init_sequence_parallel(world(), 3), Error);
}

TEST(XtunerSpNp4, LossIsExactWithZeroTokenRanks) {
  SequenceParallelGroups g = parallel::init_sequence_parallel(world(), 2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // sp rank 0: mean 2 over 3 tokens; sp rank 1: no token (XTuner's 0/0 = NaN mean).
  const double a = parallel::reduce_sequence_parallel_loss(g.sp_rank() == 0 ? 2.0 : nan,
                                                           g.sp_rank() == 0 ? 3 : 0, *g.sp);
  EXPECT_EQ(a, 2.0);
  EXPECT_EQ(parallel::reduce_sequence_parallel_loss(nan, 0, *g.sp), 0.0);  // no token anywhere
  const double b = parallel::reduce_sequence_parallel_loss(g.sp_rank() == 0 ? 1.0 : 4.0,
                                                           g.sp_rank() == 0 ? 1 : 3, *g.sp);
  EXPECT_DOUBLE_EQ(b, (1.0 + 12.0) / 4.0);
}

TEST(XtunerSpNp4, EndToEnd) {
  SequenceParallelGroups g = parallel::init_sequence_parallel(world(), 2);
  // Documents → packed rows of 15 tokens (not divisible by sp = 2: padded to 16).
  std::mt19937 gen(3);
  std::vector<std::vector<int32_t>> docs(12);
  for (auto& d : docs) {
    d.resize(1 + gen() % 9);
    for (auto& t : d) t = int32_t(1 + gen() % 40);
  }
  data::MemorySource src(docs);
  data::PackConfig pc;
  pc.seq_len = 15;
  pc.micro_bsz = 1;
  std::vector<int64_t> order(docs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  auto rows = data::build_pack(src, order, pc);
  auto sampler = parallel::make_sequence_parallel_sampler(g, rows->num_rows(), true, 5);
  const auto ids = sampler.indices(0);
  int64_t first = ids.at(0), other = first;
  g.sp->broadcast(&other, 1, 0);
  EXPECT_EQ(first, other) << "ranks of one SP group must draw the same rows";

  // The first of this rank's rows that has a label (the last packed row may be all pad).
  data::MicroBatch row;
  for (int64_t id : ids) {
    rows->row_into(id, row);
    first = id;
    if (std::any_of(row.labels.begin(), row.labels.end(), [](int32_t y) { return y != -100; }))
      break;
  }
  const data::MicroBatch mine = parallel::pad_and_split_for_sequence_parallel(row, g);
  EXPECT_EQ(mine.input_ids.size(), 8u);
  EXPECT_EQ(mine.cu_seqlens.back(), 16);

  model::ModelConfig c;
  c.vocab_size = 41, c.hidden_size = 32, c.num_layers = 2, c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2, c.multiple_of = 8;
  parallel::Layout l;
  l.tensor_size = 2, l.tensor_mode = parallel::TensorMode::kIsp, l.weight_size = 2;
  parallel::Grid grid = parallel::make_grid(world(), l);
  model::ParamTable full(c);
  model::Params<float> params(full), local(full);
  model::init_params(params, 9);
  parallel::isp_scatter_params(local, params, parallel::isp_shard_plan(full, 2, grid.weight->rank()));
  model::Decoder<float> isp(full, local, parallel::make_isp_ops(full, grid, false));
  std::vector<double> token_losses;
  isp.forward_loss(mine, &token_losses);
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < token_losses.size(); ++i)
    if (mine.labels[i] != -100) sum += token_losses[i], ++n;
  const double mean = n > 0 ? sum / double(n) : std::numeric_limits<double>::quiet_NaN();
  const double got = parallel::reduce_sequence_parallel_loss(mean, n, *g.sp);

  data::MicroBatch padded = row;
  data::pad_for_sequence_parallel(padded, 2);
  model::Decoder<float> dense(full, params);
  const model::LossSum want = dense.forward_loss(padded);
  const double ref = want.sum / double(want.count);
  const double err = std::abs(got - ref) / ref;
  if (world()->rank() == 0)
    std::printf("[xtuner-sp] row %lld: reduce_sequence_parallel_loss %.7f, one process %.7f, "
                "rel err %.2e\n", (long long)first, got, ref, err);
  EXPECT_LT(err, 1e-6);
}

// The XTuner-named API with 2D-Attention: sp = 4 split head-first into head 2 x context 2, the
// row split by "document" balance; the exact loss equals one process's.
TEST(XtunerSpNp4, EndToEnd2D) {
  SequenceParallelGroups g =
      parallel::init_sequence_parallel(world(), 4, 2, data::ContextBalance::kDocument);
  EXPECT_EQ(g.head->size(), 2);
  EXPECT_EQ(g.context->size(), 2);
  EXPECT_EQ(g.head->rank(), g.sp_rank() % 2);
  EXPECT_EQ(g.context->rank(), g.sp_rank() / 2);
  // 13 tokens (padded to 16): a document longer than a context share and two of length 1.
  data::MicroBatch row;
  row.cu_seqlens = {0, 10, 11, 12, 13};
  row.max_seqlen = 10;
  for (int s = 0; s < 4; ++s)
    for (int32_t i = 0; i < row.cu_seqlens[s + 1] - row.cu_seqlens[s]; ++i) {
      row.input_ids.push_back(1 + (7 * int32_t(row.input_ids.size())) % 40);
      row.indexes.push_back(i);
    }
  row.labels.assign(row.input_ids.size(), -100);
  for (int32_t n = 0; n + 1 < 10; ++n) row.labels[size_t(n)] = row.input_ids[size_t(n) + 1];
  const data::MicroBatch mine = parallel::pad_and_split_for_sequence_parallel(row, g);
  EXPECT_EQ(mine.input_ids.size(), 4u);
  EXPECT_EQ(mine.cu_seqlens.back(), 16);

  model::ModelConfig c;
  c.vocab_size = 41, c.hidden_size = 32, c.num_layers = 2, c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2, c.multiple_of = 8;
  parallel::Layout l;
  l.tensor_size = 4, l.tensor_mode = parallel::TensorMode::kIsp, l.weight_size = 4;
  l.seq2d = true, l.seq2d_head = 2, l.seq2d_context = 2, l.seq2d_balance = longtron::data::ContextBalance::kDocument;
  parallel::Grid grid = parallel::make_grid(world(), l);
  model::ParamTable full(c);
  model::Params<float> params(full), local(full);
  model::init_params(params, 9);
  parallel::isp_scatter_params(local, params, parallel::isp_shard_plan(full, 4, grid.weight->rank()));
  model::Decoder<float> isp(full, local, parallel::make_isp_ops(full, grid, false));
  const model::LossSum ls = isp.forward_loss(mine);
  const double mean = ls.count > 0 ? ls.sum / double(ls.count) : 0.0;
  const double got = parallel::reduce_sequence_parallel_loss(mean, ls.count, *g.sp);
  data::MicroBatch padded = row;
  data::pad_for_sequence_parallel(padded, 4);
  model::Decoder<float> dense(full, params);
  const model::LossSum want = dense.forward_loss(padded);
  const double err = std::abs(got - want.sum / double(want.count)) / (want.sum / double(want.count));
  if (world()->rank() == 0)
    std::printf("[xtuner-sp] 2D head 2 x context 2 document: loss rel err %.2e\n", err);
  EXPECT_LT(err, 1e-6);
}

}  // namespace
}  // namespace longtron::testing
