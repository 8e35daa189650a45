// Every kernel but attention: central finite differences in double for each backward, plus the
// forward values that have a closed form.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "core/error.h"
#include "fd_check.h"
#include "ops/ops.h"

namespace ops = longtron::ops;
using longtron::testing::dot;
using longtron::testing::expect_fd;
using longtron::testing::random_vector;
using Vec = std::vector<double>;

TEST(Gemm, MatchesNaiveForAllTransposes) {
  const int64_t M = 5, N = 4, K = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Vec A = random_vector(M * K, 1), B = random_vector(K * N, 2), C = random_vector(M * N, 3);
      Vec expect = C;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
          expect[i * N + j] = 2.0 * s + 0.5 * C[i * N + j];
        }
      ops::gemm<double>(ta, tb, M, N, K, 2.0, A.data(), B.data(), 0.5, C.data());
      for (int64_t i = 0; i < M * N; ++i) EXPECT_NEAR(C[i], expect[i], 1e-12);
    }
  }
}

TEST(Linear, BackwardMatchesFiniteDifferencesWithBias) {
  const int64_t N = 3, in = 4, out = 5;
  Vec x = random_vector(N * in, 1), W = random_vector(out * in, 2), b = random_vector(out, 3);
  const Vec dy = random_vector(N * out, 4);
  auto loss = [&] {
    Vec y(N * out);
    ops::linear_forward<double>(y.data(), x.data(), W.data(), b.data(), N, in, out);
    return dot(y, dy);
  };
  Vec dx(N * in), dW(out * in, 0.0), db(out, 0.0);
  ops::linear_backward<double>(dx.data(), dW.data(), db.data(), dy.data(), x.data(), W.data(), N,
                               in, out);
  expect_fd(x, dx, loss, "dx");
  expect_fd(W, dW, loss, "dW");
  expect_fd(b, db, loss, "dbias");
  // Parameter gradients accumulate.
  Vec dW2 = dW;
  ops::linear_backward<double>(nullptr, dW2.data(), nullptr, dy.data(), x.data(), W.data(), N, in,
                               out);
  for (size_t i = 0; i < dW.size(); ++i) EXPECT_NEAR(dW2[i], 2 * dW[i], 1e-12);
}

TEST(Embedding, GathersRowsAndScattersRepeatedIds) {
  const int64_t V = 4, H = 70, N = 5;  // H > 64 exercises two column blocks
  const std::vector<int32_t> ids = {2, 0, 2, 3, 2};
  Vec table = random_vector(V * H, 1);
  const Vec dout = random_vector(N * H, 2);
  Vec out(N * H);
  ops::embedding_forward<double>(out.data(), ids.data(), table.data(), N, H);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < H; ++i) EXPECT_EQ(out[n * H + i], table[ids[n] * H + i]);
  auto loss = [&] {
    Vec o(N * H);
    ops::embedding_forward<double>(o.data(), ids.data(), table.data(), N, H);
    return dot(o, dout);
  };
  Vec dtable(V * H, 0.0);
  ops::embedding_backward<double>(dtable.data(), dout.data(), ids.data(), N, H);
  expect_fd(table, dtable, loss, "dtable");
}

TEST(RmsNorm, ForwardValueAndBackwardFiniteDifferences) {
  const int64_t N = 3, H = 7;
  Vec x = random_vector(N * H, 1), w = random_vector(H, 2);
  const Vec dout = random_vector(N * H, 3);
  const double eps = 1e-5;
  Vec out(N * H), rstd(N);
  ops::rms_norm_forward<double>(out.data(), rstd.data(), x.data(), w.data(), N, H, eps);
  double ms = 0;
  for (int64_t i = 0; i < H; ++i) ms += x[i] * x[i] / H;
  EXPECT_NEAR(out[2], x[2] / std::sqrt(ms + eps) * w[2], 1e-12);
  auto loss = [&] {
    Vec o(N * H), r(N);
    ops::rms_norm_forward<double>(o.data(), r.data(), x.data(), w.data(), N, H, eps);
    return dot(o, dout);
  };
  Vec dx(N * H), dw(H, 0.0);
  ops::rms_norm_backward<double>(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                 rstd.data(), N, H);
  expect_fd(x, dx, loss, "dx");
  expect_fd(w, dw, loss, "dweight");
}

// Gemma's RMSNorm (offset 1): x · rsqrt(mean(x²) + eps) · (1 + w), Transformers' Gemma3RMSNorm;
// its backward the finite differences, and the same as offset 0 with the weight 1 + w.
TEST(RmsNorm, OnePlusWeightMatchesFiniteDifferencesAndTheShiftedWeight) {
  const int64_t N = 3, H = 7;
  Vec x = random_vector(N * H, 21), w = random_vector(H, 22, 0.2);
  const Vec dout = random_vector(N * H, 23);
  const double eps = 1e-6;
  Vec out(N * H), rstd(N);
  ops::rms_norm_forward<double>(out.data(), rstd.data(), x.data(), w.data(), N, H, eps, nullptr,
                                1.0);
  double ms = 0;
  for (int64_t i = 0; i < H; ++i) ms += x[H + i] * x[H + i] / H;
  EXPECT_NEAR(out[H + 4], x[H + 4] / std::sqrt(ms + eps) * (1.0 + w[4]), 1e-12);
  auto loss = [&] {
    Vec o(N * H), r(N);
    ops::rms_norm_forward<double>(o.data(), r.data(), x.data(), w.data(), N, H, eps, nullptr, 1.0);
    return dot(o, dout);
  };
  Vec dx(N * H), dw(H, 0.0);
  ops::rms_norm_backward<double>(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                 rstd.data(), N, H, 1.0);
  expect_fd(x, dx, loss, "dx");
  expect_fd(w, dw, loss, "dweight");
  // The same as Llama's form with the weight 1 + w (float, vectorised path included).
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), shifted(H);
  for (int64_t i = 0; i < H; ++i) shifted[i] = 1.0f + wf[i];
  std::vector<float> o1(N * H), o2(N * H), r1(N), r2(N);
  ops::rms_norm_forward<float>(o1.data(), r1.data(), xf.data(), wf.data(), N, H, 1e-6f, nullptr,
                               1.0f);
  ops::rms_norm_forward<float>(o2.data(), r2.data(), xf.data(), shifted.data(), N, H, 1e-6f);
  EXPECT_EQ(o1, o2);
}

TEST(Rope, RotatesPairsAndBackwardIsTheAdjoint) {
  const int64_t N = 4, heads = 2, d = 6, stride = 17;  // strided rows inside a wider buffer
  const std::vector<int32_t> indexes = {0, 1, 5, 0};
  Vec x = random_vector(N * stride, 1);
  const Vec dout = random_vector(N * stride, 2);
  Vec rotated = x;
  ops::rope_forward<double>(rotated.data(), indexes.data(), N, heads, d, stride, 10000.0);
  // Token 2, head 1, pair i = 1: angle 5 · 10000^(−2/6).
  const double angle = 5.0 * std::pow(10000.0, -2.0 / 6.0);
  const double a = x[2 * stride + 6 + 1], b = x[2 * stride + 6 + 4];
  EXPECT_NEAR(rotated[2 * stride + 6 + 1], a * std::cos(angle) - b * std::sin(angle), 1e-12);
  EXPECT_NEAR(rotated[2 * stride + 6 + 4], b * std::cos(angle) + a * std::sin(angle), 1e-12);
  EXPECT_EQ(rotated[12], x[12]);  // element 12 of token 0 is outside the heads: untouched
  auto loss = [&] {
    Vec y = x;
    ops::rope_forward<double>(y.data(), indexes.data(), N, heads, d, stride, 10000.0);
    double s = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < heads * d; ++i) s += y[n * stride + i] * dout[n * stride + i];
    return s;
  };
  Vec dx = dout;
  ops::rope_backward<double>(dx.data(), indexes.data(), N, heads, d, stride, 10000.0);
  for (int64_t n = 0; n < N; ++n)  // elements outside the heads do not enter the loss
    for (int64_t i = heads * d; i < stride; ++i) dx[n * stride + i] = 0;
  expect_fd(x, dx, loss, "dx");
  EXPECT_THROW(ops::rope_forward<double>(x.data(), indexes.data(), N, 1, 5, 17, 1e4),
               longtron::Error);
}

// RoPE keeps a table of cos/sin per position and reads it instead of computing the angles per
// token; a call whose largest position is past the table's limit (2^20 values per table, so 2^18
// positions at d = 8) computes them per token as before. A token must come out bitwise the same
// either way, and whatever earlier calls grew the table to, forward and backward alike.
TEST(Rope, TableLookupMatchesPerTokenAngles) {
  const int64_t heads = 3, d = 8, width = heads * d;
  const std::vector<float> row = [&] {
    const Vec r = random_vector(width, 7);
    return std::vector<float>(r.begin(), r.end());
  }();
  for (bool backward : {false, true}) {
    // Row 0 (position 37) of a call on `positions` rotated in float.
    auto first_row = [&](const std::vector<int32_t>& positions) {
      const int64_t N = static_cast<int64_t>(positions.size());
      std::vector<float> x(static_cast<size_t>(N * width), 0.5f);
      std::copy(row.begin(), row.end(), x.begin());
      if (backward)
        ops::rope_backward<float>(x.data(), positions.data(), N, heads, d, width, 10000.0);
      else
        ops::rope_forward<float>(x.data(), positions.data(), N, heads, d, width, 10000.0);
      return std::vector<float>(x.begin(), x.begin() + width);
    };
    const std::vector<float> small = first_row({37});
    EXPECT_NE(small, row);
    EXPECT_EQ(first_row({37, 5, 900, 4000}), small) << "after the table grew";
    EXPECT_EQ(first_row({37, 1 << 21}), small) << "angles computed per token";
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t count = 40;
  Vec a = random_vector(count, 1, 3.0), b = random_vector(count, 2);
  const Vec dout = random_vector(count, 3);
  auto loss = [&] {
    Vec o(count);
    ops::swiglu_forward<double>(o.data(), a.data(), b.data(), count);
    return dot(o, dout);
  };
  Vec o(count);
  ops::swiglu_forward<double>(o.data(), a.data(), b.data(), count);
  EXPECT_NEAR(o[0], a[0] / (1 + std::exp(-a[0])) * b[0], 1e-12);
  Vec da(count), db(count);
  ops::swiglu_backward<double>(da.data(), db.data(), dout.data(), a.data(), b.data(), count);
  expect_fd(a, da, loss, "da");
  expect_fd(b, db, loss, "db");
  // Float agrees with double (the float path uses the vectorised exp).
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), of(count);
  ops::swiglu_forward<float>(of.data(), af.data(), bf.data(), count);
  for (int64_t i = 0; i < count; ++i) EXPECT_NEAR(of[i], o[i], 1e-5 * std::max(1.0, std::abs(o[i])));
}

// GeGLU's GELU is torch's gelu(x, approximate="tanh") (the values below are torch 1.13's in
// float64), its backward the finite differences of its forward, and float agrees with double.
TEST(GeGluTanh, MatchesTorchAndFiniteDifferences) {
  const Vec x = {-6.0, -2.5, -1.0, -0.3, 0.0, 0.2, 0.7, 1.5, 3.0, 8.0};
  const Vec torch_gelu = {-8.43964897967453e-11, -0.015084266089998577, -0.15880800939172329,
                          -0.11462907645724074,  0.0,                   0.11585142978210627,
                          0.53057013470511671,   1.3995715769802328,    2.9963626079182268,
                          8.0};
  const Vec ones(x.size(), 1.0);
  Vec gelu(x.size());
  ops::geglu_tanh_forward<double>(gelu.data(), x.data(), ones.data(), std::ssize(x));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(gelu[i], torch_gelu[i], 1e-15) << x[i];

  const int64_t count = 40;
  Vec a = random_vector(count, 11, 2.5), b = random_vector(count, 12);
  const Vec dout = random_vector(count, 13);
  auto loss = [&] {
    Vec o(count);
    ops::geglu_tanh_forward<double>(o.data(), a.data(), b.data(), count);
    return dot(o, dout);
  };
  Vec da(count), db(count);
  ops::geglu_tanh_backward<double>(da.data(), db.data(), dout.data(), a.data(), b.data(), count);
  expect_fd(a, da, loss, "da");
  expect_fd(b, db, loss, "db");

  Vec o(count);
  ops::geglu_tanh_forward<double>(o.data(), a.data(), b.data(), count);
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), df(dout.begin(), dout.end());
  std::vector<float> of(count), daf(count), dbf(count);
  ops::geglu_tanh_forward<float>(of.data(), af.data(), bf.data(), count);
  ops::geglu_tanh_backward<float>(daf.data(), dbf.data(), df.data(), af.data(), bf.data(), count);
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_NEAR(of[i], o[i], 1e-5 * std::max(1.0, std::abs(o[i]))) << i;
    EXPECT_NEAR(daf[i], da[i], 1e-5 * std::max(1.0, std::abs(da[i]))) << i;
    EXPECT_NEAR(dbf[i], db[i], 1e-5 * std::max(1.0, std::abs(db[i]))) << i;
  }
}

// GeGLU's bf16-input kernels are its float kernel on the widened a, b, also when da and db
// overwrite dout; the saving forward rounds a and b as round_to_bf16 does and writes out's bits.
TEST(GeGluTanh, Bf16InputsAreTheFloatKernelOnWidenedValues) {
  const int64_t count = 1000;
  const Vec a = random_vector(count, 16, 4.0), b = random_vector(count, 17),
            dout = random_vector(count, 18);
  const std::vector<float> a0(a.begin(), a.end()), b0(b.begin(), b.end());
  std::vector<float> af = a0, bf = b0;
  std::vector<uint16_t> a16(count), b16(count);
  ops::round_to_bf16(af.data(), count, a16.data());
  ops::round_to_bf16(bf.data(), count, b16.data());
  ops::widen_bf16(a16.data(), count, af.data());
  ops::widen_bf16(b16.data(), count, bf.data());
  std::vector<float> df(dout.begin(), dout.end());
  std::vector<float> o(count), o16(count), da(count), db(count), da16(count), db16 = df;
  ops::geglu_tanh_forward<float>(o.data(), af.data(), bf.data(), count);
  ops::geglu_tanh_forward_bf16(o16.data(), a16.data(), b16.data(), count);
  ops::geglu_tanh_backward<float>(da.data(), db.data(), df.data(), af.data(), bf.data(), count);
  ops::geglu_tanh_backward_bf16(da16.data(), db16.data(), db16.data(), a16.data(), b16.data(),
                                count);
  const auto near = [](float x, float y) {
    return std::abs(x - y) <= 1e-6f * std::max(1.0f, std::abs(y));
  };
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(near(o16[i], o[i])) << i << ": " << o16[i] << " vs " << o[i];
    ASSERT_TRUE(near(da16[i], da[i])) << i << ": " << da16[i] << " vs " << da[i];
    ASSERT_TRUE(near(db16[i], db[i])) << i << ": " << db16[i] << " vs " << db[i];
  }
  std::vector<uint16_t> s16a(count), s16b(count), out16(count), expect16(count);
  std::vector<float> o2(count);
  ops::geglu_tanh_forward_saving_bf16(o2.data(), a0.data(), b0.data(), s16a.data(), s16b.data(),
                                      count, out16.data());
  EXPECT_EQ(s16a, a16);
  EXPECT_EQ(s16b, b16);
  EXPECT_EQ(o2, o16);
  ops::round_to_bf16(o16.data(), count, expect16.data());
  EXPECT_EQ(out16, expect16);
}

// Soft-capping bounds the logits to (−cap, cap), is the identity near 0, and its backward is the
// finite differences of Σ dout ∘ cap · tanh(x / cap).
TEST(LogitSoftcap, BoundsAndMatchesFiniteDifferences) {
  const double cap = 30.0;
  const int64_t count = 40;
  Vec x = random_vector(count, 14, 40.0);
  x[0] = 1e-6, x[1] = 1e6, x[2] = -1e6;
  const Vec dout = random_vector(count, 15);
  Vec c = x;
  ops::logit_softcap_forward<double>(c.data(), count, cap);
  EXPECT_NEAR(c[0], 1e-6, 1e-18);
  EXPECT_EQ(c[1], cap);
  EXPECT_EQ(c[2], -cap);
  for (int64_t i = 3; i < count; ++i) EXPECT_NEAR(c[i], cap * std::tanh(x[i] / cap), 1e-12);
  auto loss = [&] {
    Vec y = x;
    ops::logit_softcap_forward<double>(y.data(), count, cap);
    return dot(y, dout);
  };
  Vec dx = dout;
  ops::logit_softcap_backward<double>(dx.data(), c.data(), count, cap);
  expect_fd(x, dx, loss, "dx");
  std::vector<float> xf(x.begin(), x.end());
  ops::logit_softcap_forward<float>(xf.data(), count, static_cast<float>(cap));
  for (int64_t i = 0; i < count; ++i)
    EXPECT_NEAR(xf[i], c[i], 1e-5 * std::max(1.0, std::abs(c[i])));
  EXPECT_THROW(ops::logit_softcap_forward<double>(c.data(), count, 0.0), longtron::Error);
}

// The bf16-input SwiGLU (a, b saved as bf16 under mixed precision) is the float kernel on the
// widened a, b — to the last bits of the vectorised exp — also when da and db overwrite dout.
TEST(SwiGlu, Bf16InputsAreTheFloatKernelOnWidenedValues) {
  const int64_t count = 1000;
  const Vec a = random_vector(count, 4, 4.0), b = random_vector(count, 5), dout = random_vector(count, 6);
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
  std::vector<uint16_t> a16(count), b16(count);
  ops::round_to_bf16(af.data(), count, a16.data());
  ops::round_to_bf16(bf.data(), count, b16.data());
  ops::widen_bf16(a16.data(), count, af.data());
  ops::widen_bf16(b16.data(), count, bf.data());
  std::vector<float> df(dout.begin(), dout.end());
  std::vector<float> o(count), o16(count), da(count), db(count), da16(count), db16 = df;
  ops::swiglu_forward<float>(o.data(), af.data(), bf.data(), count);
  ops::swiglu_forward_bf16(o16.data(), a16.data(), b16.data(), count);
  ops::swiglu_backward<float>(da.data(), db.data(), df.data(), af.data(), bf.data(), count);
  ops::swiglu_backward_bf16(da16.data(), db16.data(), db16.data(), a16.data(), b16.data(), count);
  const auto near = [](float x, float y) { return std::abs(x - y) <= 1e-6f * std::max(1.0f, std::abs(y)); };
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(near(o16[i], o[i])) << i << ": " << o16[i] << " vs " << o[i];
    ASSERT_TRUE(near(da16[i], da[i])) << i << ": " << da16[i] << " vs " << da[i];
    ASSERT_TRUE(near(db16[i], db[i])) << i << ": " << db16[i] << " vs " << db[i];
  }
}

// The forms that also write their output's bf16 bits (for the GEMM that reads it next) give
// the same float output, bit for bit, and the bits are round_to_bf16 of it: RMSNorm per row,
// SwiGLU forward and backward per block of 4096 (counts below, at and across the block).
TEST(BitsForTheNextGemm, NormAndSwiGluWriteTheRoundingOfTheirOutput) {
  const auto bits_of = [](const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    ops::round_to_bf16(v.data(), static_cast<int64_t>(v.size()), b.data());
    return b;
  };
  const int64_t N = 37, H = 200;
  const Vec xd = random_vector(N * H, 7, 3.0), wd = random_vector(H, 8);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  std::vector<float> out(N * H), out2(N * H), rstd(N), rstd2(N);
  std::vector<uint16_t> out16(N * H, 0xFFFF);
  ops::rms_norm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), N, H, 1e-6f);
  ops::rms_norm_forward<float>(out2.data(), rstd2.data(), x.data(), w.data(), N, H, 1e-6f,
                               out16.data());
  EXPECT_EQ(out2, out);
  EXPECT_EQ(rstd2, rstd);
  EXPECT_EQ(out16, bits_of(out));
  for (const int64_t count : {int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{20000}}) {
    const Vec a = random_vector(count, 9, 4.0), b = random_vector(count, 10);
    std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
    std::vector<uint16_t> a16(count), b16(count), g16(count, 0xFFFF);
    ops::round_to_bf16(af.data(), count, a16.data());
    ops::round_to_bf16(bf.data(), count, b16.data());
    std::vector<float> g(count), g2(count);
    ops::swiglu_forward_bf16(g.data(), a16.data(), b16.data(), count);
    ops::swiglu_forward_bf16(g2.data(), a16.data(), b16.data(), count, g16.data());
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(g2[i]), std::bit_cast<uint32_t>(g[i])) << count << " " << i;
    EXPECT_EQ(g16, bits_of(g)) << count;
    // The bits alone (no float output): the same bits.
    std::vector<uint16_t> g16_only(count, 0xFFFF);
    ops::swiglu_forward_bf16(nullptr, a16.data(), b16.data(), count, g16_only.data());
    EXPECT_EQ(g16_only, g16) << count;
    // Saving a and b on the way, with g written over a (the model's pool does).
    std::vector<float> g3 = af;
    std::vector<uint16_t> a16s(count, 0xFFFF), b16s(count, 0xFFFF), g16s(count, 0xFFFF);
    ops::swiglu_forward_saving_bf16(g3.data(), g3.data(), bf.data(), a16s.data(), b16s.data(),
                                    count, g16s.data());
    EXPECT_EQ(a16s, a16) << count;
    EXPECT_EQ(b16s, b16) << count;
    EXPECT_EQ(g16s, g16) << count;
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(g3[i]), std::bit_cast<uint32_t>(g[i])) << count << " " << i;
    // The backward writes da's and db's bits over a and b (their last reader), db over dout.
    const Vec dd = random_vector(count, 11);
    std::vector<float> da(count), db(dd.begin(), dd.end()), da2(count), db2 = db;
    ops::swiglu_backward_bf16(da.data(), db.data(), db.data(), a16.data(), b16.data(), count);
    ops::swiglu_backward_bf16(da2.data(), db2.data(), db2.data(), a16.data(), b16.data(), count,
                              a16.data(), b16.data());
    EXPECT_EQ(da2, da) << count;
    EXPECT_EQ(db2, db) << count;
    EXPECT_EQ(a16, bits_of(da)) << count;
    EXPECT_EQ(b16, bits_of(db)) << count;
  }
  EXPECT_THROW(ops::swiglu_forward_bf16(nullptr, nullptr, nullptr, 5, nullptr), longtron::Error);
}

TEST(CrossEntropy, IgnoresMinus100AndBackwardMatchesFiniteDifferences) {
  const int64_t N = 4, V = 6;
  Vec logits = random_vector(N * V, 1, 2.0);
  logits[7] = 800.0;  // a huge logit must not overflow (stable log-sum-exp)
  const std::vector<int32_t> labels = {3, -100, 0, 5};
  Vec lse(N);
  int64_t count = 0;
  const double loss_sum =
      ops::cross_entropy_forward<double>(lse.data(), &count, logits.data(), labels.data(), N, V);
  EXPECT_EQ(count, 3);
  double expect = 0;
  for (int64_t n : {0, 2, 3}) {
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[n * V + v] - mx);
    expect += mx + std::log(s) - logits[n * V + labels[n]];
  }
  EXPECT_NEAR(loss_sum, expect, 1e-10);
  EXPECT_NEAR(lse[1], 800.0, 1e-9);
  const double scale = 0.25;
  auto loss = [&] {
    Vec l(N);
    return scale * ops::cross_entropy_forward<double>(l.data(), nullptr, logits.data(),
                                                      labels.data(), N, V);
  };
  Vec dlogits(N * V, 7.0);
  ops::cross_entropy_backward<double>(dlogits.data(), logits.data(), lse.data(), labels.data(), N,
                                      V, scale);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[1 * V + v], 0.0);
  expect_fd(logits, dlogits, loss, "dlogits");
  // Float agrees with double.
  std::vector<float> lf(logits.begin(), logits.end()), lsef(N);
  EXPECT_NEAR(ops::cross_entropy_forward<float>(lsef.data(), nullptr, lf.data(), labels.data(), N,
                                                V),
              loss_sum, 1e-4 * std::abs(loss_sum));
  const std::vector<int32_t> bad = {3, 6, 0, 0};
  EXPECT_THROW(ops::cross_entropy_forward<double>(lse.data(), nullptr, logits.data(), bad.data(),
                                                  N, V),
               longtron::Error);
}

TEST(AdamW, MatchesHandComputedSteps) {
  float p[2] = {1.0f, -2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  const float g1[2] = {0.5f, -1.0f}, g2[2] = {0.1f, 0.3f};
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  ops::adamw_update(p, m, v, g1, 2, lr, b1, b2, eps, wd, 1);
  // Step 1: m̂ = g, v̂ = g², so the update is lr·sign(g) after decay p·(1 − lr·wd).
  EXPECT_NEAR(p[0], 1.0 * (1 - 0.001) - 0.01, 1e-6);
  EXPECT_NEAR(p[1], -2.0 * (1 - 0.001) + 0.01, 1e-6);
  ops::adamw_update(p, m, v, g2, 2, lr, b1, b2, eps, wd, 2);
  for (int i = 0; i < 2; ++i) {
    const double p1 = i == 0 ? 1.0 * 0.999 - 0.01 : -2.0 * 0.999 + 0.01;
    const double m2 = 0.9 * 0.1 * g1[i] + 0.1 * g2[i];
    const double v2 = 0.95 * 0.05 * g1[i] * g1[i] + 0.05 * g2[i] * g2[i];
    const double mhat = m2 / (1 - 0.81), vhat = v2 / (1 - 0.9025);
    const double expect = p1 * 0.999 - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(p[i], expect, 1e-6) << i;
    EXPECT_NEAR(m[i], m2, 1e-7);
    EXPECT_NEAR(v[i], v2, 1e-7);
  }
  EXPECT_THROW(ops::adamw_update(p, m, v, g1, 2, lr, b1, b2, eps, wd, 0), longtron::Error);
}
