// The GEMM entry point: fp32 (oneDNN sgemm) and bf16 × bf16 → fp32 (oneDNN matmul) against a
// double reference, with the rounding-error bounds written out; the backend report; and the error
// a CPU without a bf16 matmul gives.
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "bf16_here.h"
#include "core/safetensors.h"
#include "fd_check.h"
#include "ops/compute_context.h"
#include "ops/gemm_packing.h"
#include "ops/ops.h"

namespace ops = longtron::ops;
using longtron::safetensors::bf16_to_float;
using longtron::safetensors::float_to_bf16;
using longtron::testing::random_vector;

namespace {
struct Case {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
};

// exact[i] = alpha·Σ_k op(A)op(B) + beta·C0 in double, and mag[i] = |alpha|·Σ_k |op(A)||op(B)|
// (the scale of the rounding-error bounds).
void reference(const Case& c, const std::vector<float>& A, const std::vector<float>& B,
               const std::vector<float>& C0, std::vector<double>& exact, std::vector<double>& mag) {
  exact.assign(c.M * c.N, 0.0);
  mag.assign(c.M * c.N, 0.0);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.ta ? A[k * c.M + i] : A[i * c.K + k];
        const double b = c.tb ? B[j * c.K + k] : B[k * c.N + j];
        s += a * b;
        m += std::fabs(a * b);
      }
      exact[i * c.N + j] = c.alpha * s + c.beta * static_cast<double>(C0[i * c.N + j]);
      mag[i * c.N + j] = std::fabs(c.alpha) * m + std::fabs(c.beta * C0[i * c.N + j]);
    }
}

std::vector<float> floats(int64_t n, uint32_t seed) {
  const std::vector<double> d = random_vector(n, seed);
  return std::vector<float>(d.begin(), d.end());
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        v.push_back({37, 29, 53, ta, tb, 1.0f, 0.0f});
        v.push_back({64, 96, 300, ta, tb, 1.0f, 1.0f});  // gradient accumulation: beta = 1
        v.push_back({5, 7, 3, ta, tb, 2.0f, 0.5f});
        v.push_back({600, 40, 70, ta, tb, 1.0f, 1.0f});  // M >= 512: B packed once per call
      }
    return v;
  }();
  return all;
}
}  // namespace

// Floating-point summation of K products: |fl(s) − s| ≤ γ_K Σ|a||b|, γ_K ≈ K·u, u = 2⁻²⁴ for fp32
// (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1); +2u for the alpha and beta steps.
TEST(Gemm, FloatWithinTheFp32SummationBound) {
  for (const Case& c : cases()) {
    const auto A = floats(c.M * c.K, 1), B = floats(c.K * c.N, 2), C0 = floats(c.M * c.N, 3);
    std::vector<double> exact, mag;
    reference(c, A, B, C0, exact, mag);
    std::vector<float> C = C0;
    ops::gemm<float>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C.data());
    const double u = std::ldexp(1.0, -24);
    for (int64_t i = 0; i < c.M * c.N; ++i)
      ASSERT_LE(std::fabs(C[i] - exact[i]), (c.K + 2) * u * mag[i])
          << c.M << "x" << c.N << "x" << c.K << " ta " << c.ta << " tb " << c.tb << " at " << i;
  }
}

// bf16 inputs multiply exactly in fp32 (8 + 8 significant bits < 24), so on bf16-rounded inputs the
// only error is the fp32 accumulation: the same bound as the fp32 GEMM. Against the unrounded fp32
// inputs, each product also carries the two input roundings: ≤ (2·2⁻⁹ + 2⁻¹⁸)·|a||b| more.
TEST(Gemm, Bf16MatchesDoubleOnRoundedInputsAndFp32WithinBf16Rounding) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  for (const Case& c : cases()) {
    const auto A = floats(c.M * c.K, 4), B = floats(c.K * c.N, 5), C0 = floats(c.M * c.N, 6);
    std::vector<uint16_t> Ab(A.size()), Bb(B.size());
    std::vector<float> Ar(A.size()), Br(B.size());
    for (size_t i = 0; i < A.size(); ++i) Ab[i] = float_to_bf16(A[i]), Ar[i] = bf16_to_float(Ab[i]);
    for (size_t i = 0; i < B.size(); ++i) Bb[i] = float_to_bf16(B[i]), Br[i] = bf16_to_float(Bb[i]);
    std::vector<float> C = C0;
    ops::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, Ab.data(), Bb.data(), c.beta, C.data());
    std::vector<double> exact, mag, exact32, mag32;
    reference(c, Ar, Br, C0, exact, mag);
    reference(c, A, B, C0, exact32, mag32);
    const double u = std::ldexp(1.0, -24), ub = std::ldexp(1.0, -9);
    double worst_rel = 0;
    for (int64_t i = 0; i < c.M * c.N; ++i) {
      ASSERT_LE(std::fabs(C[i] - exact[i]), (c.K + 2) * u * mag[i]) << "bf16-rounded reference at " << i;
      ASSERT_LE(std::fabs(C[i] - exact32[i]), ((c.K + 2) * u + 2 * ub + ub * ub) * mag32[i] * 1.01)
          << "fp32 reference at " << i;
      worst_rel = std::max(worst_rel, std::fabs(C[i] - exact32[i]) / mag32[i]);
    }
    // The bf16 rounding is really there (≈ 2⁻⁹/√K of the scale; an fp32 GEMM in disguise would
    // stay near 2⁻²⁴): the test notices if the inputs were not taken as bf16.
    if (c.K >= 53) {
      EXPECT_GT(worst_rel, 1e-5);
    }
  }
}

// A bf16 C written by the kernel is gemm_bf16's fp32 C rounded to nearest even, bit for bit: both
// transposes, B packed (M >= 512) or not, and results that are NaN, infinite, or finite in fp32
// but past bf16's largest finite value (they round to infinity).
TEST(Gemm, Bf16OutIsGemmBf16Rounded) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  for (const Case& c : cases()) {
    auto A = floats(c.M * c.K, 14), B = floats(c.K * c.N, 15);
    const auto at = [&](int64_t i, int64_t k) -> float& {
      return c.ta ? A[k * c.M + i] : A[i * c.K + k];
    };
    at(0, 0) = std::numeric_limits<float>::quiet_NaN();
    at(1, 0) = std::numeric_limits<float>::infinity();
    // Row 2 of C: bf16's largest finite value + 2¹¹⁹·1.5 ≈ 3.3995e38, finite in fp32, beyond the
    // halfway point to bf16's infinity.
    const auto bt = [&](int64_t k, int64_t j) -> float& {
      return c.tb ? B[j * c.K + k] : B[k * c.N + j];
    };
    for (int64_t j = 0; j < c.N; ++j) bt(0, j) = 1.0f, bt(1, j) = 1.5f;
    for (int64_t k = 0; k < c.K; ++k) at(2, k) = 0.0f;
    at(2, 0) = bf16_to_float(0x7F7F), at(2, 1) = std::ldexp(1.0f, 119);
    std::vector<uint16_t> Ab(A.size()), Bb(B.size());
    for (size_t i = 0; i < A.size(); ++i) Ab[i] = float_to_bf16(A[i]);
    for (size_t i = 0; i < B.size(); ++i) Bb[i] = float_to_bf16(B[i]);
    std::vector<float> C(c.M * c.N);
    ops::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, 1.0f, Ab.data(), Bb.data(), 0.0f, C.data());
    std::vector<uint16_t> want(C.size()), got(C.size(), 0x1234);
    ops::round_to_bf16(C.data(), static_cast<int64_t>(C.size()), want.data());
    ops::gemm_bf16_out16(c.ta, c.tb, c.M, c.N, c.K, Ab.data(), Bb.data(), got.data());
    for (size_t i = 0; i < C.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << c.M << "x" << c.N << "x" << c.K << " ta " << c.ta << " tb "
                                 << c.tb << " at " << i << " (fp32 " << C[i] << ")";
    // The special rows are there: NaN, infinity, and a finite fp32 rounded to infinity.
    int64_t rounded_to_inf = 0;
    for (int64_t j = 0; j < c.N; ++j)
      rounded_to_inf +=
          std::isfinite(C[2 * c.N + j]) && std::isinf(bf16_to_float(got[2 * c.N + j]));
    EXPECT_TRUE(std::isnan(bf16_to_float(got[0])));
    EXPECT_FALSE(std::isfinite(bf16_to_float(got[c.N])));
    EXPECT_EQ(rounded_to_inf, c.N);
  }
  std::vector<uint16_t> C(4, 0x1234);
  ops::gemm_bf16_out16(false, false, 2, 2, 0, nullptr, nullptr, C.data());
  EXPECT_EQ(C, (std::vector<uint16_t>(4, 0)));
}

// Mixed precision as the trainer runs it: ops::gemm<float> under a bf16 compute context rounds A
// and B to bf16 itself. Against double on the bf16-rounded inputs the error bound is the fp32
// summation bound above, |C − exact| ≤ (K + 2)·2⁻²⁴·Σ|a||b| (the products are exact); it must
// also equal gemm_bf16 on the same rounded inputs bit for bit (one primitive per shape), and the
// context-free form (and an fp32 context) stay the fp32 GEMM.
TEST(Gemm, FloatUnderBf16ContextIsTheBf16GemmOfRoundedInputs) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  const ops::ComputeContext bf16(ops::ComputeType::kBFloat16), fp32;
  for (const Case& c : cases()) {
    const auto A = floats(c.M * c.K, 7), B = floats(c.K * c.N, 8), C0 = floats(c.M * c.N, 9);
    std::vector<uint16_t> Ab(A.size()), Bb(B.size());
    std::vector<float> Ar(A.size()), Br(B.size());
    for (size_t i = 0; i < A.size(); ++i) Ab[i] = float_to_bf16(A[i]), Ar[i] = bf16_to_float(Ab[i]);
    for (size_t i = 0; i < B.size(); ++i) Bb[i] = float_to_bf16(B[i]), Br[i] = bf16_to_float(Bb[i]);
    std::vector<float> C = C0, Cb = C0, C32 = C0, Cfp32 = C0;
    ops::gemm<float>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C32.data());
    ops::gemm<float>(bf16, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta,
                     C.data());
    ops::gemm<float>(fp32, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta,
                     Cfp32.data());
    EXPECT_EQ(Cfp32, C32) << "an fp32 context is not the context-free fp32 GEMM";
    ops::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, Ab.data(), Bb.data(), c.beta, Cb.data());
    EXPECT_EQ(C, Cb);
    std::vector<double> exact, mag;
    reference(c, Ar, Br, C0, exact, mag);
    const double u = std::ldexp(1.0, -24);
    for (int64_t i = 0; i < c.M * c.N; ++i)
      ASSERT_LE(std::fabs(C[i] - exact[i]), (c.K + 2) * u * mag[i]) << "at " << i;
    if (c.K >= 53) {
      EXPECT_NE(C, C32) << "the bf16 context did not change the result";
    }
  }
}

// The context's bf16 weight copy: a GEMM whose B lies inside the mirrored weights gives bit for
// bit the result of rounding per call, and reads the copy made at its first use: a weight changed
// without invalidate() is not seen (the proof that the copy is used), one changed with it is.
// Under an fp32 context the copy is never read.
TEST(Gemm, Bf16WeightCopyRoundsTheWeightsOnceUntilInvalidated) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  const int64_t M = 48, N = 40, K = 64, offset = 100;
  const auto A = floats(M * K, 11);
  std::vector<float> W = floats(offset + N * K + 50, 12);  // B = W[offset..], as a layer's view
  const float* B = W.data() + offset;
  const auto gemm = [&](const ops::ComputeContext& cc) {
    std::vector<float> C(M * N, 0.f);
    ops::gemm<float>(cc, false, true, M, N, K, 1.0f, A.data(), B, 0.0f, C.data());
    return C;
  };
  const ops::ComputeContext per_call_context(ops::ComputeType::kBFloat16);  // mirrors nothing
  const auto per_call = gemm(per_call_context);
  ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  bf16.weights().attach(W.data(), static_cast<int64_t>(W.size()));
  EXPECT_EQ(bf16.weight_copy_bytes(), 0) << "made before its first use";
  const auto cached = gemm(bf16);
  EXPECT_EQ(bf16.weight_copy_bytes(), static_cast<int64_t>(2 * W.size()));
  for (int64_t i = 0; i < N * K; ++i) W[offset + i] *= 2.0f;  // a write that does not tell
  const auto stale = gemm(bf16);
  bf16.weights().invalidate();
  const auto fresh = gemm(bf16);
  EXPECT_EQ(cached, per_call);
  EXPECT_EQ(stale, cached) << "the GEMM did not read the bf16 copy";
  EXPECT_EQ(fresh, gemm(per_call_context));
  EXPECT_NE(fresh, cached);
  ops::ComputeContext fp32;
  fp32.weights().attach(W.data(), static_cast<int64_t>(W.size()));
  std::vector<float> plain(M * N, 0.f);
  ops::gemm<float>(false, true, M, N, K, 1.0f, A.data(), B, 0.0f, plain.data());
  EXPECT_EQ(gemm(fp32), plain) << "the copy changed a float32 GEMM";
  EXPECT_EQ(fp32.weight_copy_bytes(), 0);
}

// gemm_bf16_weight on a weight rounded once (ISP's gathered bf16 weights) is bitwise gemm<float>
// under kBFloat16 on the float weight, in both transposes and with beta; the copy's of() hands
// out the bits of a range inside its weights and nothing outside them or when detached.
TEST(Gemm, Bf16WeightGemmIsTheFloatGemmOnTheRoundedWeight) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  const int64_t M = 24, N = 40, K = 56;
  const auto A = floats(M * K, 21);
  std::vector<float> W = floats(N * K + 8, 22);
  std::vector<uint16_t> W16(static_cast<size_t>(N * K));
  ops::round_to_bf16(W.data(), N * K, W16.data());
  ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  EXPECT_EQ(bf16.weights().of(W.data(), N * K), nullptr);
  for (const bool tb : {true, false}) {
    for (const float beta : {0.f, 1.f}) {
      std::vector<float> want = floats(M * N, 23), got = want;
      ops::gemm<float>(bf16, false, tb, M, N, K, 1.f, A.data(), W.data(), beta, want.data());
      ops::gemm_bf16_weight(false, tb, M, N, K, 1.f, A.data(), W16.data(), beta, got.data());
      EXPECT_EQ(got, want) << "trans_b " << tb << " beta " << beta;
    }
  }
  bf16.weights().attach(W.data(), N * K);
  const uint16_t* copy = bf16.weights().of(W.data() + 8, 16);
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(std::equal(copy, copy + 16, W16.begin() + 8));
  EXPECT_EQ(bf16.weights().of(W.data() + N * K - 4, 8), nullptr);  // runs past the weights
  bf16.weights().attach(nullptr, 0);
  EXPECT_EQ(bf16.weights().of(W.data() + 8, 16), nullptr);
}

// widen_bf16 is exact: it inverts round_to_bf16 on its outputs.
// A B packed once for a run of GEMMs (the head's chunks) gives gemm_bf16's bits on B as given,
// for the packed row count and (unpacked) for another one, in both layouts the head uses.
TEST(Gemm, SharedPackedBGivesGemmBf16sBits) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  for (const bool tb : {false, true}) {
    const int64_t M = 256, N = 96, K = 200;
    const auto A = floats(M * K, 11), B = floats(K * N, 12);
    std::vector<uint16_t> Ab(A.size()), Bb(B.size());
    for (size_t i = 0; i < A.size(); ++i) Ab[i] = float_to_bf16(A[i]);
    for (size_t i = 0; i < B.size(); ++i) Bb[i] = float_to_bf16(B[i]);
    longtron::GrowBuffer<ops::PackedLine> buffer;
    const ops::SharedBf16B shared(buffer, false, tb, M, N, K, 1.f, 0.f, Bb.data());
    for (const int64_t rows : {M, int64_t{100}}) {
      std::vector<float> want(size_t(rows * N)), got(size_t(rows * N), -1.f);
      ops::gemm_bf16(false, tb, rows, N, K, 1.f, Ab.data(), Bb.data(), 0.f, want.data());
      shared.gemm(rows, Ab.data(), Bb.data(), got.data());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << "tb " << tb << " rows " << rows << " at " << i;
    }
  }
}

TEST(Gemm, WidenBf16InvertsRounding) {
  const auto x = floats(100003, 13);
  std::vector<uint16_t> bits(x.size()), again(x.size());
  std::vector<float> wide(x.size());
  ops::round_to_bf16(x.data(), static_cast<int64_t>(x.size()), bits.data());
  ops::widen_bf16(bits.data(), static_cast<int64_t>(x.size()), wide.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(wide[i], bf16_to_float(bits[i])) << "at " << i;
  ops::round_to_bf16(wide.data(), static_cast<int64_t>(x.size()), again.data());
  EXPECT_EQ(again, bits);
}

// round_to_bf16 (the GEMMs' conversion) rounds as core/bf16.h's float_to_bf16 (the safetensors
// writer's): ordinary values, ties, overflow to infinity, infinities and NaN, and subnormals kept
// (PyTorch's rule, not VCVTNEPS2BF16's flush). The special values sit both in the vector body and
// in the scalar tail.
// The rounding's special values, ties and edges, in the vector body (first) and in the scalar
// tail (last) of a run of random floats long enough for several threads' chunks.
namespace {
const std::vector<uint32_t> kSpecials = {0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x00000001u,
                                         0x80400000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                         0x7F800001u, 0x00000000u, 0x80000000u, 0x00800000u};
std::vector<float> specials_around(int64_t middle_count, uint32_t seed) {
  std::vector<float> x;
  for (uint32_t bits : kSpecials) x.push_back(std::bit_cast<float>(bits));
  const std::vector<float> middle = floats(middle_count, seed);
  x.insert(x.end(), middle.begin(), middle.end());
  for (uint32_t bits : kSpecials) x.push_back(std::bit_cast<float>(bits));
  return x;
}
}  // namespace

TEST(Gemm, RoundToBf16IsRoundToNearestEven) {
  const std::vector<uint32_t>& specials = kSpecials;
  const std::vector<float> x = specials_around(200000, 10);
  std::vector<uint16_t> out(x.size());
  ops::round_to_bf16(x.data(), static_cast<int64_t>(x.size()), out.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(out[i], float_to_bf16(x[i])) << "at " << i << " (" << x[i] << ")";
  }
  for (size_t base : {size_t{0}, x.size() - specials.size()}) {
    EXPECT_EQ(out[base + 0], 0x3F80);  // tie, even kept bit: rounds down
    EXPECT_EQ(out[base + 1], 0x3F82);  // tie, odd kept bit: rounds up
    EXPECT_EQ(out[base + 2], 0x7F80);  // largest float rounds to infinity
    EXPECT_EQ(out[base + 3], 0x0000);  // smallest subnormal rounds to +0 (below half an ulp)
    EXPECT_EQ(out[base + 4], 0x8040);  // negative subnormal kept: −2^-127
    EXPECT_EQ(out[base + 8], 0x7FC0);  // signalling NaN: quiet NaN
  }
}

// round_to_bf16_widened writes round_to_bf16's bits and their widening in one pass, in place
// too, on the special values (vector body and scalar tail) and several threads' chunks.
TEST(Gemm, RoundToBf16WidenedIsRoundThenWiden) {
  std::vector<float> x = specials_around(200003, 14);
  x.push_back(std::bit_cast<float>(0xFFC00001u));  // a negative quiet NaN with payload, last
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> want(x.size()), got(x.size()), in_place(x.size());
  std::vector<float> want_wide(x.size()), got_wide(x.size(), -1.f), v = x;
  ops::round_to_bf16(x.data(), n, want.data());
  ops::widen_bf16(want.data(), n, want_wide.data());
  ops::round_to_bf16_widened(x.data(), n, got.data(), got_wide.data());
  ops::round_to_bf16_widened(v.data(), n, in_place.data(), v.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(in_place, want);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got_wide[i]), std::bit_cast<uint32_t>(want_wide[i])) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(v[i]), std::bit_cast<uint32_t>(want_wide[i])) << i;
  }
}

// A shared activation's bits are what the bf16 GEMMs read for it while the sharing lives (the
// poisoned float is never rounded), for a sub-range too, and nothing after it ends; up to
// kMax sharings live at once, one more is refused; under float32 the sharing changes nothing.
TEST(Gemm, SharedRoundingsAreReadWhileShared) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  const int64_t M = 40, N = 24, K = 32;
  const auto A = floats(2 * M * K, 31), B = floats(N * K, 32);
  std::vector<uint16_t> A16(A.size());
  ops::round_to_bf16(A.data(), static_cast<int64_t>(A.size()), A16.data());
  std::vector<float> poisoned(A.size(), 1e30f);
  ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  const auto gemm = [&](const ops::ComputeContext& cc, const float* a) {
    std::vector<float> C(M * N, 0.f);
    ops::gemm<float>(cc, false, true, M, N, K, 1.f, a, B.data(), 0.f, C.data());
    return C;
  };
  const auto want_first = gemm(bf16, A.data()), want_second = gemm(bf16, A.data() + M * K);
  {
    const auto sharing = bf16.shared().share(poisoned.data(), 2 * M * K, A16.data());
    EXPECT_EQ(gemm(bf16, poisoned.data()), want_first);
    EXPECT_EQ(gemm(bf16, poisoned.data() + M * K), want_second) << "a range inside the shared one";
    const auto r = ops::bf16_operands(bf16, {ops::Bf16Operand{poisoned.data() + 8, 16}, {}, {}});
    EXPECT_EQ(r[0], A16.data() + 8);
    {
      std::vector<ops::SharedRoundings::Sharing> more;
      for (int i = 1; i < ops::SharedRoundings::kMax; ++i)
        more.push_back(bf16.shared().share(A.data() + i, 1, A16.data() + i));
      EXPECT_EQ(bf16.shared().of(A.data() + 2, 1), A16.data() + 2);
      EXPECT_THROW((void)bf16.shared().share(A.data(), 4, A16.data()), longtron::Error);
    }
    EXPECT_EQ(bf16.shared().of(A.data() + 2, 1), nullptr) << "the others ended";
    std::vector<float> C(M * N, 0.f);
    ops::gemm<float>(ops::ComputeContext::fp32(), false, true, M, N, K, 1.f, A.data(), B.data(),
                     0.f, C.data());
    std::vector<float> plain(M * N, 0.f);
    ops::gemm<float>(false, true, M, N, K, 1.f, A.data(), B.data(), 0.f, plain.data());
    EXPECT_EQ(C, plain);
  }
  EXPECT_EQ(bf16.shared().of(poisoned.data(), 1), nullptr) << "ended with its scope";
  EXPECT_NE(gemm(bf16, poisoned.data()), want_first) << "the poison is read again";
  const auto again = bf16.shared().share(A.data(), 4, A16.data());  // free to share once more
  EXPECT_EQ(bf16.shared().of(A.data() + 1, 3), A16.data() + 1);
  EXPECT_EQ(bf16.shared().of(A.data() + 1, 4), nullptr) << "runs past the shared range";
}

// The gate/up pair is bitwise two linears on the same input (forward; backward with dx
// overwritten by W1's part and accumulated by W3's, weight and bias gradients accumulated):
// float32, bf16 with the weights in the context's copy (x rounded once) and without it.
TEST(Gemm, LinearPairIsTwoLinearsBitwise) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  const int64_t N = 70, in = 48, out = 80;
  std::vector<float> params = floats(2 * out * in + 2 * out, 41);
  const float* W1 = params.data();
  const float* W3 = W1 + out * in;
  const float* b1 = W3 + out * in;
  const float* b3 = b1 + out;
  const auto x = floats(N * in, 42), da = floats(N * out, 43), db = floats(N * out, 44);
  ops::ComputeContext fp32, bf16(ops::ComputeType::kBFloat16), bf16_copy(ops::ComputeType::kBFloat16);
  bf16_copy.weights().attach(params.data(), static_cast<int64_t>(params.size()));
  for (const ops::ComputeContext* cc : {&fp32, &bf16, &bf16_copy}) {
    std::vector<float> a(N * out), b(N * out), a2(N * out), b2(N * out);
    ops::linear_forward<float>(*cc, a.data(), x.data(), W1, b1, N, in, out);
    ops::linear_forward<float>(*cc, b.data(), x.data(), W3, b3, N, in, out);
    ops::linear_pair_forward<float>(*cc, a2.data(), b2.data(), x.data(), W1, b1, W3, b3, N, in,
                                    out);
    EXPECT_EQ(a2, a);
    EXPECT_EQ(b2, b);
    // Straight into bf16: a and b rounded, where the weights have their bf16 copy and there is no
    // bias; nothing written otherwise.
    std::vector<uint16_t> a16(N * out, 7), b16(N * out, 7), want_a(N * out), want_b(N * out);
    EXPECT_FALSE(ops::linear_pair_forward_out16(*cc, a16.data(), b16.data(), x.data(), W1, b1,
                                                W3, b3, N, in, out));
    const bool copy = cc == &bf16_copy;
    EXPECT_EQ(ops::linear_pair_forward_out16(*cc, a16.data(), b16.data(), x.data(), W1, nullptr,
                                             W3, nullptr, N, in, out),
              copy);
    if (copy) {  // the float path's a and b, rounded
      ops::linear_pair_forward<float>(*cc, a2.data(), b2.data(), x.data(), W1, nullptr, W3,
                                      nullptr, N, in, out);
      ops::round_to_bf16(a2.data(), N * out, want_a.data());
      ops::round_to_bf16(b2.data(), N * out, want_b.data());
      EXPECT_EQ(a16, want_a);
      EXPECT_EQ(b16, want_b);
      std::vector<uint16_t> y16(N * out, 7);  // one linear alone
      EXPECT_TRUE(ops::linear_forward_out16(*cc, y16.data(), x.data(), W3, N, in, out));
      EXPECT_EQ(y16, want_b);
    } else {
      EXPECT_EQ(a16, std::vector<uint16_t>(N * out, 7));
      EXPECT_FALSE(ops::linear_forward_out16(*cc, a16.data(), x.data(), W1, N, in, out));
      EXPECT_EQ(a16, std::vector<uint16_t>(N * out, 7));
    }
    auto grads = floats(2 * out * in + 2 * out, 45), grads2 = grads;  // accumulated into
    std::vector<float> dx(N * in), dx2(N * in, 7.f);
    float* g = grads.data();
    ops::linear_backward<float>(*cc, dx.data(), g, g + 2 * out * in, da.data(), x.data(), W1, N,
                                in, out, 0.f, 1.f);
    ops::linear_backward<float>(*cc, dx.data(), g + out * in, g + 2 * out * in + out, db.data(),
                                x.data(), W3, N, in, out, 1.f, 1.f);
    float* g2 = grads2.data();
    ops::linear_pair_backward<float>(*cc, dx2.data(), g2, g2 + 2 * out * in, g2 + out * in,
                                     g2 + 2 * out * in + out, da.data(), db.data(), x.data(), W1,
                                     W3, N, in, out);
    EXPECT_EQ(dx2, dx);
    EXPECT_EQ(grads2, grads);
    if (!cc->bf16()) continue;
    // da and db shared as bits (the model's SwiGLU backward writes them): poisoned floats are
    // not read by the GEMMs, only by the bias gradients, so the biases are left out here.
    std::vector<uint16_t> da16(N * out), db16(N * out);
    ops::round_to_bf16(da.data(), N * out, da16.data());
    ops::round_to_bf16(db.data(), N * out, db16.data());
    std::vector<float> pa(N * out, 1e30f), pb(N * out, -1e30f), dx3(N * in);
    auto grads3 = floats(2 * out * in + 2 * out, 45);
    {
      const auto sa = cc->shared().share(pa.data(), N * out, da16.data());
      const auto sb = cc->shared().share(pb.data(), N * out, db16.data());
      float* g3 = grads3.data();
      ops::linear_pair_backward<float>(*cc, dx3.data(), g3, nullptr, g3 + out * in, nullptr,
                                       pa.data(), pb.data(), x.data(), W1, W3, N, in, out);
    }
    EXPECT_EQ(dx3, dx);
    EXPECT_TRUE(std::equal(grads3.begin(), grads3.begin() + 2 * out * in, grads.begin()));
  }
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  std::vector<float> C = {1, 2, 3, 4};
  ops::gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.5f, C.data());
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  ops::gemm_bf16(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.0f, C.data());
  EXPECT_EQ(C, (std::vector<float>{0, 0, 0, 0}));
}

TEST(Gemm, BackendNamesLibraryAndIsa) {
  const ops::GemmBackend b = ops::gemm_backend();
  EXPECT_EQ(b.library.rfind("oneDNN ", 0), 0u) << b.library;
  EXPECT_NE(b.isa, "unknown");
  EXPECT_FALSE(b.isa.empty());
}

// oneDNN's ISA can be capped once per process, before its first use: in a fresh child (the
// threadsafe death-test style re-executes the binary), cap it at AVX2, which has no bf16 matmul.
TEST(GemmDeathTest, Bf16WithoutAvx512IsAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2) != dnnl_success) std::exit(4);
        if (ops::gemm_backend().native_bf16 || ops::gemm_backend().isa != "avx2") std::exit(5);
        std::vector<uint16_t> A(4, float_to_bf16(1.0f));
        std::vector<float> C(4);
        try {
          ops::gemm_bf16(false, false, 2, 2, 2, 1.0f, A.data(), A.data(), 0.0f, C.data());
        } catch (const longtron::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(3);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(3), "no bf16 matmul on this CPU \\(ISA avx2");
}
