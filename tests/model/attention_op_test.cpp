// The dense attention op's forward_rounded and backward_rounded: every output of its forward
// and backward, bit for bit, and the round_to_bf16 of the split q, k, v it saves and of dqkv
// (the bits a bf16 save or GEMM would make of them), written as the rows are permuted; the
// default (a double model) only runs forward.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "model/layers.h"
#include "model/params.h"
#include "model_testing.h"
#include "ops/ops.h"

namespace longtron::model {
namespace {

template <typename T>
struct AttentionCall {
  std::vector<T> out, saved, lse;
  AttentionCall(const AttentionOp<T>& op, int64_t N)
      : out(static_cast<size_t>(N * op.out_features())),
        saved(static_cast<size_t>(op.saved_qkv_size(N))),
        lse(static_cast<size_t>(op.saved_lse_size(N))) {}
};

template <typename T>
std::vector<T> random_qkv(int64_t n) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> x(static_cast<size_t>(n));
  for (T& v : x) v = static_cast<T>(normal(rng));
  return x;
}

AttentionBatch batch_of(const data::MicroBatch& row) {
  return AttentionBatch{row.indexes.data(), row.cu_seqlens.data(),
                        static_cast<int64_t>(row.cu_seqlens.size()) - 1,
                        static_cast<int64_t>(row.input_ids.size())};
}

TEST(AttentionOp, ForwardRoundedIsTheForwardAndTheRoundingOfItsSaves) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  ModelOps<float> ops = make_dense_ops<float>(layout);
  AttentionOp<float>& op = *ops.blocks.front().attention;
  const data::MicroBatch row = testing::tiny_row(c.vocab_size);
  const AttentionBatch b = batch_of(row);
  const std::vector<float> qkv = random_qkv<float>(b.num_tokens * op.qkv_features());
  AttentionCall<float> plain(op, b.num_tokens), rounded(op, b.num_tokens);
  op.forward(plain.out.data(), plain.saved.data(), plain.lse.data(), qkv.data(), b);
  std::vector<uint16_t> bits(plain.saved.size(), 0xFFFF);
  ASSERT_TRUE(op.forward_rounded(rounded.out.data(), rounded.saved.data(), bits.data(),
                                 rounded.lse.data(), qkv.data(), b));
  EXPECT_EQ(rounded.out, plain.out);
  EXPECT_EQ(rounded.saved, plain.saved);
  EXPECT_EQ(rounded.lse, plain.lse);
  std::vector<uint16_t> expect(plain.saved.size());
  ops::round_to_bf16(plain.saved.data(), static_cast<int64_t>(expect.size()), expect.data());
  EXPECT_EQ(bits, expect);
}

TEST(AttentionOp, BackwardRoundedIsTheBackwardAndTheRoundingOfDqkv) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  ModelOps<float> ops = make_dense_ops<float>(layout);
  AttentionOp<float>& op = *ops.blocks.front().attention;
  const data::MicroBatch row = testing::tiny_row(c.vocab_size);
  const AttentionBatch b = batch_of(row);
  const int64_t N = b.num_tokens, Q = op.qkv_features();
  const std::vector<float> qkv = random_qkv<float>(N * Q);
  AttentionCall<float> f(op, N);
  op.forward(f.out.data(), f.saved.data(), f.lse.data(), qkv.data(), b);
  const std::vector<float> dout = random_qkv<float>(N * op.out_features());
  std::vector<float> dqkv(N * Q), dqkv2(N * Q), scratch(f.saved.size()), scratch2(f.saved.size());
  op.backward(dqkv.data(), scratch.data(), dout.data(), f.saved.data(), f.out.data(), f.lse.data(),
              b);
  std::vector<uint16_t> bits(dqkv.size(), 0xFFFF);
  ASSERT_TRUE(op.backward_rounded(dqkv2.data(), bits.data(), scratch2.data(), dout.data(),
                                  f.saved.data(), f.out.data(), f.lse.data(), b));
  EXPECT_EQ(dqkv2, dqkv);
  std::vector<uint16_t> expect(dqkv.size());
  ops::round_to_bf16(dqkv.data(), static_cast<int64_t>(expect.size()), expect.data());
  EXPECT_EQ(bits, expect);
}

TEST(AttentionOp, ForwardRoundedOfADoubleModelOnlyRunsForward) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  ModelOps<double> ops = make_dense_ops<double>(layout);
  AttentionOp<double>& op = *ops.blocks.front().attention;
  const data::MicroBatch row = testing::tiny_row(c.vocab_size);
  const AttentionBatch b = batch_of(row);
  const std::vector<double> qkv = random_qkv<double>(b.num_tokens * op.qkv_features());
  AttentionCall<double> plain(op, b.num_tokens), rounded(op, b.num_tokens);
  op.forward(plain.out.data(), plain.saved.data(), plain.lse.data(), qkv.data(), b);
  std::vector<uint16_t> bits(plain.saved.size(), 0xFFFF);
  EXPECT_FALSE(op.forward_rounded(rounded.out.data(), rounded.saved.data(), bits.data(),
                                  rounded.lse.data(), qkv.data(), b));
  EXPECT_EQ(rounded.out, plain.out);
  EXPECT_EQ(rounded.lse, plain.lse);
  EXPECT_EQ(bits, std::vector<uint16_t>(plain.saved.size(), 0xFFFF));
}

}  // namespace
}  // namespace longtron::model
