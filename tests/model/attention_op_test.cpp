// The dense attention op's forward_rounded and backward_rounded: every output of its forward
// and backward, bit for bit, and the round_to_bf16 of the split q, k, v it saves and of dqkv
// (the bits a bf16 save or GEMM would make of them), written as the rows are permuted; the
// default (a double model) only runs forward.
#include <gtest/gtest.h>

#include <random>
#include <type_traits>
#include <vector>

#include "model/layers.h"
#include "model/params.h"
#include "model_testing.h"
#include "ops/ops.h"

namespace longtron::model {
namespace {

template <typename T>
std::vector<T> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> x(static_cast<size_t>(n));
  for (T& v : x) v = static_cast<T>(normal(rng));
  return x;
}

/// The first block's attention op of the tiny model on the tiny row, with random qkv.
template <typename T>
struct OnTinyRow {
  ModelConfig c = testing::tiny_config();
  ParamTable layout{c};
  ModelOps<T> ops = make_dense_ops<T>(layout);
  AttentionOp<T>& op = *ops.blocks.front().attention;
  data::MicroBatch row = testing::tiny_row(c.vocab_size);
  AttentionBatch b{row.indexes.data(), row.cu_seqlens.data(),
                   static_cast<int64_t>(row.cu_seqlens.size()) - 1,
                   static_cast<int64_t>(row.input_ids.size())};
  int64_t N = b.num_tokens;
  std::vector<T> qkv = random_values<T>(N * op.qkv_features(), 5);
};

/// The outputs of one forward call.
template <typename T>
struct Forward {
  std::vector<T> out, saved, lse;
  explicit Forward(const OnTinyRow<T>& t)
      : out(static_cast<size_t>(t.N * t.op.out_features())),
        saved(static_cast<size_t>(t.op.saved_qkv_size(t.N))),
        lse(static_cast<size_t>(t.op.saved_lse_size(t.N))) {}
};

std::vector<uint16_t> rounding_of(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  ops::round_to_bf16(v.data(), static_cast<int64_t>(v.size()), bits.data());
  return bits;
}

// forward_rounded against forward: the same outputs, and the bits of the saves where it rounds
// them (float); a double model's leaves the bits untouched.
template <typename T>
void check_forward_rounded() {
  OnTinyRow<T> t;
  Forward<T> plain(t), rounded(t);
  t.op.forward(plain.out.data(), plain.saved.data(), plain.lse.data(), t.qkv.data(), t.b);
  std::vector<uint16_t> bits(plain.saved.size(), 0xFFFF);
  EXPECT_EQ(t.op.forward_rounded(rounded.out.data(), rounded.saved.data(), bits.data(),
                                 rounded.lse.data(), t.qkv.data(), t.b),
            (std::is_same_v<T, float>));
  EXPECT_EQ(rounded.out, plain.out);
  EXPECT_EQ(rounded.saved, plain.saved);
  EXPECT_EQ(rounded.lse, plain.lse);
  if constexpr (std::is_same_v<T, float>) EXPECT_EQ(bits, rounding_of(plain.saved));
  else EXPECT_EQ(bits, std::vector<uint16_t>(bits.size(), 0xFFFF));
}

TEST(AttentionOp, ForwardRoundedIsTheForwardAndTheRoundingOfItsSaves) {
  check_forward_rounded<float>();
}

TEST(AttentionOp, ForwardRoundedOfADoubleModelOnlyRunsForward) { check_forward_rounded<double>(); }

TEST(AttentionOp, BackwardRoundedIsTheBackwardAndTheRoundingOfDqkv) {
  OnTinyRow<float> t;
  Forward<float> f(t);
  t.op.forward(f.out.data(), f.saved.data(), f.lse.data(), t.qkv.data(), t.b);
  const std::vector<float> dout = random_values<float>(t.N * t.op.out_features(), 6);
  std::vector<float> dqkv(t.qkv.size()), dqkv2(t.qkv.size()), scratch(f.saved.size());
  std::vector<float> scratch2(f.saved.size());
  t.op.backward(dqkv.data(), scratch.data(), dout.data(), f.saved.data(), f.out.data(),
                f.lse.data(), t.b);
  std::vector<uint16_t> bits(dqkv.size(), 0xFFFF);
  ASSERT_TRUE(t.op.backward_rounded(dqkv2.data(), bits.data(), scratch2.data(), dout.data(),
                                    f.saved.data(), f.out.data(), f.lse.data(), t.b));
  EXPECT_EQ(dqkv2, dqkv);
  EXPECT_EQ(bits, rounding_of(dqkv));
}

}  // namespace
}  // namespace longtron::model
