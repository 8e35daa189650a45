// Varlen attention over groups of whole documents (ops/attention_groups.h): each group's call
// gives every query and key the values of one call over the row, also with dq, dk, dv written in
// place over q, k, v (one packed qkv buffer, as the model's chunked recomputation passes it).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "bf16_here.h"
#include "ops/attention_groups.h"
#include "ops/compute_context.h"
#include "ops/ops.h"

namespace longtron::ops {
namespace {

struct Row {
  std::vector<int32_t> cu;
  std::vector<double> qkv, dout;
  int64_t N = 0, Hq = 4, Hkv = 2, d = 8;
  int64_t Q() const { return (Hq + 2 * Hkv) * d; }
  AttentionShape shape(int64_t window) const {
    AttentionShape s{N, Hq, Hkv, d, Q(), Q(), cu.data(), static_cast<int64_t>(cu.size()) - 1,
                     0.3};
    s.window = window;
    return s;
  }
};

/// Documents of 70, 1, 130, 5, 0 (empty) and 64 tokens: longer and shorter than a 64-query block.
Row make_row(int64_t head_dim = 8) {
  Row r;
  r.d = head_dim;
  r.cu = {0};
  for (int len : {70, 1, 130, 5, 0, 64}) r.cu.push_back(r.cu.back() + len);
  r.N = r.cu.back();
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  r.qkv.resize(static_cast<size_t>(r.N * r.Q()));
  r.dout.resize(static_cast<size_t>(r.N * r.Hq * r.d));
  for (double& x : r.qkv) x = normal(rng);
  for (double& x : r.dout) x = normal(rng);
  return r;
}

TEST(AttentionGroups, EveryGroupingGivesTheOneCallValues) {
  const Row r = make_row();
  const int64_t qo = 0, ko = r.Hq * r.d, vo = (r.Hq + r.Hkv) * r.d;
  for (int64_t window : {0, 17}) {
    const AttentionShape s = r.shape(window);
    std::vector<double> out(r.dout.size()), lse(static_cast<size_t>(r.Hq * r.N));
    std::vector<double> dqkv(r.qkv.size());
    const double* x = r.qkv.data();
    varlen_attention_forward(out.data(), lse.data(), x + qo, x + ko, x + vo, s);
    varlen_attention_backward(dqkv.data() + qo, dqkv.data() + ko, dqkv.data() + vo,
                              r.dout.data(), x + qo, x + ko, x + vo, out.data(), lse.data(), s);
    for (int64_t group : {1, 64, 71, 100, 200, 0}) {
      std::vector<double> out_g(out.size()), lse_g(lse.size());
      const ComputeContext& fp32 = ComputeContext::fp32();
      varlen_attention_forward_groups(fp32, out_g.data(), lse_g.data(), x + qo, x + ko, x + vo, s,
                                      group);
      EXPECT_EQ(out_g, out) << "group " << group << " window " << window;
      EXPECT_EQ(lse_g, lse) << "group " << group << " window " << window;
      // In place: the packed qkv buffer becomes dqkv.
      std::vector<double> inplace = r.qkv;
      double* y = inplace.data();
      varlen_attention_backward_groups(fp32, y + qo, y + ko, y + vo, r.dout.data(), y + qo, y + ko,
                                       y + vo, out.data(), lse.data(), s, group);
      EXPECT_EQ(inplace, dqkv) << "group " << group << " window " << window;
    }
  }
}

// The bf16-output variants (the model's attention output under bf16): the forward stores the
// output rounded, the backward reads it widened, and both equal the float calls on the rounded
// output bit for bit, in place too; under a bf16 context the kernel itself rounds each row as it
// stores it and widens it as it reads it (head_dim 80: a row stored in two pieces).
void expect_bf16_output_is_the_rounded_output(const ComputeContext& cc, int64_t head_dim) {
  const Row r = make_row(head_dim);
  const std::vector<float> qkv(r.qkv.begin(), r.qkv.end()), dout(r.dout.begin(), r.dout.end());
  const int64_t qo = 0, ko = r.Hq * r.d, vo = (r.Hq + r.Hkv) * r.d;
  const int64_t n_out = static_cast<int64_t>(dout.size());
  for (int64_t window : {0, 17}) {
    const AttentionShape s = r.shape(window);
    const float* x = qkv.data();
    for (int64_t group : {1, 71, 200, 0}) {
      const std::string where = "group " + std::to_string(group) + " window " +
                                std::to_string(window) + " head_dim " + std::to_string(head_dim);
      std::vector<float> out(dout.size()), lse(static_cast<size_t>(r.Hq * r.N));
      varlen_attention_forward_groups(cc, out.data(), lse.data(), x + qo, x + ko, x + vo, s,
                                      group);
      std::vector<uint16_t> want16(out.size()), out16(out.size());
      round_to_bf16(out.data(), n_out, want16.data());
      std::vector<float> lse16(lse.size());
      varlen_attention_forward_groups_bf16_out(cc, out16.data(), lse16.data(), x + qo, x + ko,
                                               x + vo, s, group);
      EXPECT_EQ(out16, want16) << where;
      EXPECT_EQ(lse16, lse) << where;
      std::vector<float> rounded(out.size());
      widen_bf16(want16.data(), n_out, rounded.data());
      std::vector<float> want = qkv, got = qkv;
      float* w = want.data();
      varlen_attention_backward_groups(cc, w + qo, w + ko, w + vo, dout.data(), w + qo, w + ko,
                                       w + vo, rounded.data(), lse.data(), s, group);
      float* g = got.data();
      varlen_attention_backward_groups_bf16_out(cc, g + qo, g + ko, g + vo, dout.data(), g + qo,
                                                g + ko, g + vo, out16.data(), lse.data(), s,
                                                group);
      EXPECT_EQ(got, want) << where;
    }
  }
}

TEST(AttentionGroups, Bf16OutputIsTheRoundedOutput) {
  expect_bf16_output_is_the_rounded_output(ComputeContext::fp32(), 8);
}

TEST(AttentionGroups, Bf16KernelStoresAndReadsTheRoundedOutput) {
  const testing::Bf16Here here;
  if (!here.runs()) GTEST_SKIP() << "no AVX-512 for the bf16 kernel or its emulation";
  ASSERT_TRUE(attention_bf16_runs());
  const ComputeContext bf16(ComputeType::kBFloat16);
  for (int64_t head_dim : {8, 80}) expect_bf16_output_is_the_rounded_output(bf16, head_dim);
}

}  // namespace
}  // namespace longtron::ops
