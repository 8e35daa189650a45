// The gate/up pair of TensorParallelLinear (PairRole) on a one-rank group: the second half reads
// what the first left in the shared buffers, so running it without the first is an Error.
#include <gtest/gtest.h>

#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
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

}  // namespace
}  // namespace longtron::parallel
