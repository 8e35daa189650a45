// The gate/up pair of TensorParallelLinear (PairRole) on a one-rank group: the second half reads
// what the first left in the shared buffers, so running it without the first is an Error; and
// the bf16 forms of its forward (outputs written as bits by the GEMM, inputs read as bits).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "bf16_here.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "ops/compute_context.h"
#include "ops/ops.h"
#include "parallel/tp_linear.h"

namespace longtron::parallel {
namespace {

TEST(TpPair, SecondWithoutFirstIsAnError) {
  const int64_t N = 4, in = 3, out = 2;
  const TpLinearSpec spec{comm::make_local_communicator(), SequenceParallel::kKeepGathered,
                          nullptr};
  LinearShared shared;
  TensorParallelLinear first(in, out, spec, shared, PairRole::kFirst);
  TensorParallelLinear second(in, out, spec, shared, PairRole::kSecond);
  const std::vector<float> x(N * in, 0.5f), W(out * in, 0.25f), dy(N * out, 1.0f);
  std::vector<float> y(N * out), dx(N * in), dW(out * in, 0.f);
  EXPECT_THROW(second.forward(y.data(), x.data(), W.data(), nullptr, N), Error);
  first.forward(y.data(), x.data(), W.data(), nullptr, N);
  second.forward(y.data(), x.data(), W.data(), nullptr, N);
  EXPECT_THROW(second.forward(y.data(), x.data(), W.data(), nullptr, N), Error);  // consumed
  first.forward(y.data(), x.data(), W.data(), nullptr, N);
  EXPECT_THROW(second.forward(y.data(), x.data(), W.data(), nullptr, N - 1), Error);  // other rows
  EXPECT_THROW(second.backward(dx.data(), dW.data(), nullptr, dy.data(), x.data(), W.data(), N,
                               false),
               Error);
  first.backward(dx.data(), dW.data(), nullptr, dy.data(), x.data(), W.data(), N, false);
  second.backward(dx.data(), dW.data(), nullptr, dy.data(), x.data(), W.data(), N, false);
  // dx = dy · (W_first + W_second): every element 2 · (0.25 + 0.25).
  for (float v : dx) EXPECT_FLOAT_EQ(v, 1.0f);
}

// A linear whose input gradient needs no reduction writes it in place (no staging buffer is
// grown) with the values of the staged path, and adds to dx when asked.
TEST(TpPair, UnreducedInputGradientIsWrittenInPlace) {
  const int64_t N = 5, in = 7, out = 3;
  std::vector<float> W(out * in), dy(N * out), x(N * in, 0.5f);
  for (size_t i = 0; i < W.size(); ++i) W[i] = 0.1f * static_cast<float>(i % 11) - 0.4f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.2f * static_cast<float>(i % 5) - 0.3f;
  LinearShared shared;
  TensorParallelLinear row(in, out, TpLinearSpec{nullptr, SequenceParallel::kNone, nullptr},
                           shared);
  std::vector<float> dx(N * in, 9.f), want(N * in), dW(out * in, 0.f);
  row.backward(dx.data(), dW.data(), nullptr, dy.data(), x.data(), W.data(), N, false);
  EXPECT_EQ(shared.dx_partial->capacity(), 0u);
  ops::linear_input_grad<float>(want.data(), dy.data(), W.data(), N, in, out);
  EXPECT_EQ(dx, want);
  row.backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), W.data(), N, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(dx[i], want[i] + want[i]);
}

// forward_out16 writes round_to_bf16 of forward's output, only under a bf16 context holding the
// weight's copy, with no bias and no overlapped form, and keeps the pair's order check.
TEST(TpPair, Out16IsTheRoundedForward) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  const int64_t N = 6, in = 40, out = 24;
  std::vector<float> params(2 * out * in + out), x(N * in);
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.01f * static_cast<float>(i % 37) - 0.2f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.03f * static_cast<float>(i % 29) - 0.4f;
  const float *W1 = params.data(), *W3 = W1 + out * in, *bias = W3 + out * in;
  ops::ComputeContext fp32, bf16(ops::ComputeType::kBFloat16), copy(ops::ComputeType::kBFloat16);
  copy.weights().attach(params.data(), static_cast<int64_t>(params.size()));
  TpLinearSpec spec{comm::make_local_communicator(), SequenceParallel::kKeepGathered, nullptr};
  for (const ops::ComputeContext* cc : {&fp32, &bf16, &copy}) {
    spec.compute = cc;
    LinearShared shared;
    TensorParallelLinear first(in, out, spec, shared, PairRole::kFirst);
    TensorParallelLinear second(in, out, spec, shared, PairRole::kSecond);
    EXPECT_EQ(first.writes_out16(W1, nullptr), cc == &copy);
    EXPECT_FALSE(first.writes_out16(W1, bias));
    EXPECT_EQ(first.reads_input_bits_only(*cc), cc->bf16());
    EXPECT_FALSE(first.reads_input_bits_only(cc == &copy ? bf16 : copy)) << "another context";
    std::vector<uint16_t> a16(N * out, 7);
    if (cc != &copy) {
      EXPECT_THROW(first.forward_out16(a16.data(), x.data(), W1, N), Error);
      EXPECT_EQ(a16, std::vector<uint16_t>(N * out, 7));
      continue;
    }
    std::vector<uint16_t> b16(N * out), want_a(N * out), want_b(N * out);
    EXPECT_THROW(second.forward_out16(b16.data(), x.data(), W3, N), Error) << "second first";
    first.forward_out16(a16.data(), x.data(), W1, N);
    second.forward_out16(b16.data(), x.data(), W3, N);
    std::vector<float> a(N * out), b(N * out);
    first.forward(a.data(), x.data(), W1, nullptr, N);
    second.forward(b.data(), x.data(), W3, nullptr, N);
    ops::round_to_bf16(a.data(), N * out, want_a.data());
    ops::round_to_bf16(b.data(), N * out, want_b.data());
    EXPECT_EQ(a16, want_a);
    EXPECT_EQ(b16, want_b);
  }
  spec.compute = &copy;
  spec.overlap = Overlap2D::kAgWithMatmul;
  TensorParallelLinear overlapped(in, out, spec);
  EXPECT_FALSE(overlapped.writes_out16(W1, nullptr));
  EXPECT_FALSE(overlapped.reads_input_bits_only(copy));
}

}  // namespace
}  // namespace longtron::parallel
