// The compute context (ops/compute_context.h): its type, its bf16 weight copy (made on first
// read, stale after invalidate, refreshed by an update that writes it) and the fused AdamW update
// that writes the copy in the same pass.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/bf16.h"
#include "ops/compute_context.h"
#include "ops/ops.h"

namespace longtron {
namespace {

std::vector<float> floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint16_t> rounded(const float* x, size_t n) {
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
  return out;
}

TEST(ComputeContext, TypeIsFloat32UnlessSet) {
  ops::ComputeContext cc;
  EXPECT_EQ(cc.type(), ops::ComputeType::kFloat32);
  EXPECT_FALSE(cc.bf16());
  cc.set_type(ops::ComputeType::kBFloat16);
  EXPECT_TRUE(cc.bf16());
  EXPECT_FALSE(ops::ComputeContext::fp32().bf16());
  EXPECT_EQ(&ops::ComputeContext::fp32(), &ops::ComputeContext::fp32());
}

// The copy is made on its first read, holds float_to_bf16 of each weight, and is remade after
// invalidate() or a new type (set_type drops it), never before.
TEST(ComputeContext, WeightCopyIsMadeOnFirstReadAndRemadeWhenStale) {
  std::vector<float> w = floats(1000, 1);
  ops::ComputeContext cc(ops::ComputeType::kBFloat16);
  cc.weights().attach(w.data(), static_cast<int64_t>(w.size()));
  EXPECT_FALSE(cc.weights().valid());
  const uint16_t* bits = cc.weights().of(w.data() + 10, 20);
  ASSERT_NE(bits, nullptr);
  EXPECT_TRUE(cc.weights().valid());
  EXPECT_EQ(std::vector<uint16_t>(bits, bits + 20), rounded(w.data() + 10, 20));
  w[10] = 1234.5f;
  EXPECT_NE(cc.weights().of(w.data() + 10, 1)[0], float_to_bf16(1234.5f)) << "read stale as asked";
  cc.weights().invalidate();
  EXPECT_EQ(cc.weights().of(w.data() + 10, 1)[0], float_to_bf16(1234.5f));
  w[11] = -7.25f;
  cc.set_type(ops::ComputeType::kBFloat16);
  EXPECT_EQ(cc.weights().of(w.data() + 11, 1)[0], float_to_bf16(-7.25f));
  EXPECT_EQ(cc.weights().of(w.data() + 990, 11), nullptr) << "past the end";
  EXPECT_EQ(cc.weights().of(w.data() - 1, 2), nullptr) << "before the start";
}

// begin_update hands out the bits of the mirrored buffer only once the copy is in use, marks the
// copy stale until
// end_update (a throw in between leaves it to be remade), and another buffer leaves it alone.
TEST(ComputeContext, UpdateProtocolKeepsTheCopyHonest) {
  std::vector<float> w = floats(64, 2), other = floats(64, 3);
  ops::ComputeContext cc(ops::ComputeType::kBFloat16);
  cc.weights().attach(w.data(), 64);
  EXPECT_EQ(cc.weights().begin_update(w.data(), 64), nullptr) << "a copy nobody read was made";
  ASSERT_NE(cc.weights().of(w.data(), 64), nullptr);
  EXPECT_EQ(cc.weights().begin_update(other.data(), 64), nullptr);
  EXPECT_TRUE(cc.weights().valid()) << "an update of another buffer made the copy stale";
  EXPECT_EQ(cc.weights().begin_update(w.data(), 63), nullptr) << "a part is not the buffer";
  uint16_t* bits = cc.weights().begin_update(w.data(), 64);
  ASSERT_NE(bits, nullptr);
  EXPECT_FALSE(cc.weights().valid());
  for (int i = 0; i < 64; ++i) w[i] += 1.f, bits[i] = float_to_bf16(w[i]);
  cc.weights().end_update();
  EXPECT_TRUE(cc.weights().valid());
  EXPECT_EQ(std::vector<uint16_t>(bits, bits + 64), rounded(w.data(), 64));
  ops::ComputeContext detached(ops::ComputeType::kBFloat16);
  EXPECT_EQ(detached.weights().begin_update(w.data(), 64), nullptr);
}

// The fused update writes the same parameters and moments as the plain one, bit for bit, and the
// bf16 rounding of each new parameter.
TEST(ComputeContext, FusedAdamWWritesTheRoundingOfTheNewWeights) {
  const size_t n = 100003;  // an odd tail after the vector lanes
  const std::vector<float> p0 = floats(n, 4), g = floats(n, 5), m0 = floats(n, 6);
  std::vector<float> v0 = floats(n, 7);
  for (float& x : v0) x = x * x;
  std::vector<float> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
  std::vector<uint16_t> bits(n);
  ops::adamw_update(p1.data(), m1.data(), v1.data(), g.data(), int64_t(n), 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.1f, 3);
  ops::adamw_update(p2.data(), m2.data(), v2.data(), g.data(), int64_t(n), 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.1f, 3, bits.data());
  EXPECT_EQ(p2, p1);
  EXPECT_EQ(m2, m1);
  EXPECT_EQ(v2, v1);
  EXPECT_EQ(bits, rounded(p1.data(), n));
  EXPECT_NE(p1, p0);
}

}  // namespace
}  // namespace longtron
