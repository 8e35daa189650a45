// ops::lora_forward / lora_backward against the products computed in double, on shapes that cross
// the kernels' row blocks and chunks and the micro-GEMM's vector widths; the same bits at any
// thread count.
#include "ops/lora_kernels.h"

#include "core/bf16.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using longtron::ops::lora_backward;
using longtron::ops::lora_forward;

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

struct Case {
  int64_t N, in, out, r;
};

struct Data {
  std::vector<float> x, dy, A, B, y, dx, dA, dB;
  Data(const Case& c, unsigned seed)
      : x(random_values(c.N * c.in, seed)), dy(random_values(c.N * c.out, seed + 1)),
        A(random_values(c.r * c.in, seed + 2)), B(random_values(c.out * c.r, seed + 3)),
        y(random_values(c.N * c.out, seed + 4)), dx(random_values(c.N * c.in, seed + 5)),
        dA(random_values(c.r * c.in, seed + 6)), dB(random_values(c.out * c.r, seed + 7)) {}
};

/// |got − want| within fp32 rounding of a sum of `terms` products of unit normals.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, int64_t terms,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  const double tol = 4e-7 * std::sqrt(double(terms)) * 8.0 + 1e-6;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << "[" << i << "]";
}

const std::vector<Case> kCases = {{1, 16, 16, 16},   {7, 24, 40, 8},     {64, 384, 640, 16},
                                  {65, 100, 37, 13}, {300, 96, 160, 32}, {5000, 48, 80, 4}};

TEST(LoraKernels, ForwardMatchesDouble) {
  for (const Case& c : kCases) {
    Data d(c, unsigned(c.N + c.r));
    const float s = 0.75f;
    std::vector<double> want(d.y.begin(), d.y.end());
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t k = 0; k < c.r; ++k) {
        double u = 0;
        for (int64_t i = 0; i < c.in; ++i) u += double(d.x[n * c.in + i]) * d.A[k * c.in + i];
        for (int64_t o = 0; o < c.out; ++o) want[n * c.out + o] += double(s) * u * d.B[o * c.r + k];
      }
    lora_forward(d.y.data(), d.x.data(), d.A.data(), d.B.data(), s, c.N, c.in, c.out, c.r);
    expect_close(d.y, want, c.in * c.r, "y");
  }
}

TEST(LoraKernels, BackwardMatchesDouble) {
  for (const Case& c : kCases) {
    for (const bool accumulate : {true, false}) {
      Data d(c, unsigned(3 * c.N + c.r));
      const float s = 2.f;
      std::vector<double> u(c.N * c.r, 0.0), du(c.N * c.r, 0.0);
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t k = 0; k < c.r; ++k) {
          for (int64_t i = 0; i < c.in; ++i) u[n * c.r + k] += double(d.x[n * c.in + i]) * d.A[k * c.in + i];
          for (int64_t o = 0; o < c.out; ++o)
            du[n * c.r + k] += double(s) * d.dy[n * c.out + o] * d.B[o * c.r + k];
        }
      std::vector<double> dx(d.dx.begin(), d.dx.end()), dA(d.dA.begin(), d.dA.end()),
          dB(d.dB.begin(), d.dB.end());
      if (!accumulate) std::fill(dx.begin(), dx.end(), 0.0);
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t k = 0; k < c.r; ++k) {
          for (int64_t i = 0; i < c.in; ++i) {
            dx[n * c.in + i] += du[n * c.r + k] * d.A[k * c.in + i];
            dA[k * c.in + i] += du[n * c.r + k] * d.x[n * c.in + i];
          }
          for (int64_t o = 0; o < c.out; ++o)
            dB[o * c.r + k] += double(s) * d.dy[n * c.out + o] * u[n * c.r + k];
        }
      lora_backward(d.dx.data(), accumulate, d.dA.data(), d.dB.data(), d.dy.data(), d.x.data(),
                    d.A.data(), d.B.data(), s, c.N, c.in, c.out, c.r);
      // dA and dB sum over N rows of products that are themselves sums of in / out terms.
      expect_close(d.dx, dx, c.out * c.r, "dx");
      expect_close(d.dA, dA, c.N * c.out, "dA");
      expect_close(d.dB, dB, c.N * c.in, "dB");
    }
  }
}

double rounded(double v) { return longtron::bf16_to_float(longtron::float_to_bf16(float(v))); }

// Under bf16 every product reads rounded operands: the reference rounds x, dy, A, B, u and du the
// same way and sums in double, so only the fp32 accumulation (and a rare tie of u or du's rounding)
// separates them.
// Cases: AVX512-BF16 dot products where the CPU has them (even widths; 301 rows end in an odd
// block), the fp32 tiles on rounded values otherwise (odd in), and x's and dy's bits given.
struct Bf16Case {
  Case shape;
  bool bits;
};
class LoraKernelsBf16 : public ::testing::TestWithParam<Bf16Case> {};

TEST_P(LoraKernelsBf16, OperandsMatchRoundedDouble) {
  const Case c = GetParam().shape;
  Data d(c, 5);
  const float s = 2.f;
  auto r = [](const std::vector<float>& v) {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = rounded(v[i]);
    return out;
  };
  const std::vector<double> x = r(d.x), dy = r(d.dy), A = r(d.A), B = r(d.B);
  std::vector<double> u(c.N * c.r, 0.0), du(c.N * c.r, 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.r; ++k) {
      for (int64_t i = 0; i < c.in; ++i) u[n * c.r + k] += x[n * c.in + i] * A[k * c.in + i];
      for (int64_t o = 0; o < c.out; ++o) du[n * c.r + k] += s * dy[n * c.out + o] * B[o * c.r + k];
      u[n * c.r + k] = rounded(u[n * c.r + k]);
      du[n * c.r + k] = rounded(du[n * c.r + k]);
    }
  std::vector<double> y(d.y.begin(), d.y.end()), dx(d.dx.begin(), d.dx.end()),
      dA(d.dA.begin(), d.dA.end()), dB(d.dB.begin(), d.dB.end());
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.r; ++k) {
      for (int64_t o = 0; o < c.out; ++o) {
        y[n * c.out + o] += s * u[n * c.r + k] * B[o * c.r + k];
        dB[o * c.r + k] += s * dy[n * c.out + o] * u[n * c.r + k];
      }
      for (int64_t i = 0; i < c.in; ++i) {
        dx[n * c.in + i] += du[n * c.r + k] * A[k * c.in + i];
        dA[k * c.in + i] += du[n * c.r + k] * x[n * c.in + i];
      }
    }
  std::vector<uint16_t> x16(d.x.size()), dy16(d.dy.size());
  for (size_t i = 0; i < x16.size(); ++i) x16[i] = longtron::float_to_bf16(d.x[i]);
  for (size_t i = 0; i < dy16.size(); ++i) dy16[i] = longtron::float_to_bf16(d.dy[i]);
  const bool bits = GetParam().bits;
  lora_forward(d.y.data(), d.x.data(), d.A.data(), d.B.data(), s, c.N, c.in, c.out, c.r, true,
               bits ? x16.data() : nullptr);
  lora_backward(d.dx.data(), true, d.dA.data(), d.dB.data(), d.dy.data(), d.x.data(), d.A.data(),
                d.B.data(), s, c.N, c.in, c.out, c.r, true, bits ? x16.data() : nullptr,
                bits ? dy16.data() : nullptr);
  // Where fp32 and double accumulation put u or du on either side of a bf16 rounding boundary,
  // that value moves by a bf16 ulp (2⁻⁸ relative): a few elements may differ by that much, the
  // rest only by fp32 accumulation. Unrounded operands would miss the tight bound almost everywhere.
  const double ulp = 1.0 / 256;
  auto near = [&](const std::vector<float>& got, const std::vector<double>& want, int64_t terms,
                  const char* what) {
    size_t loose = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double scale = 1.0 + std::fabs(want[i]), err = std::fabs(got[i] - want[i]);
      ASSERT_LE(err, (ulp * 4 + 1e-5 * std::sqrt(double(terms))) * scale) << what << "[" << i << "]";
      if (err > 1e-5 * std::sqrt(double(terms)) * scale) ++loose;
    }
    EXPECT_LE(loose, got.size() / 100) << what;
  };
  near(d.y, y, c.r, "y");
  near(d.dx, dx, c.r, "dx");
  near(d.dA, dA, c.N, "dA");
  near(d.dB, dB, c.N, "dB");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LoraKernelsBf16,
                         ::testing::Values(Bf16Case{{301, 96, 160, 16}, false},
                                           Bf16Case{{301, 96, 160, 16}, true},
                                           Bf16Case{{70, 33, 48, 16}, false},
                                           Bf16Case{{70, 33, 48, 16}, true},
                                           Bf16Case{{9, 64, 64, 8}, true}));

TEST(LoraKernels, NoRowsLeaveEverythingButAnOverwrittenDx) {
  std::vector<float> dA = {1.f, 2.f}, dB = {3.f, 4.f};
  lora_backward(nullptr, false, dA.data(), dB.data(), nullptr, nullptr, nullptr, nullptr, 1.f, 0,
                2, 2, 1);
  EXPECT_EQ(dA, (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(dB, (std::vector<float>{3.f, 4.f}));
}

}  // namespace

namespace {

// An adapter covering some of its linear's output columns (Llama's q/k/v in the fused qkv
// projection): B's rows land in y's and dy's columns where the segments say, fp32 and bf16.
TEST(LoraKernels, SegmentsLandInTheirColumns) {
  const int64_t N = 150, in = 48, r = 16, ldy = 56, out = 32;
  longtron::ops::LoraOutputs outputs;
  outputs.ldy = ldy;
  // B rows 0..32 out of order; the odd counts take the bf16 fallback (fp32 tiles, rounded values).
  for (const auto& segments : {std::vector<longtron::ops::LoraOutputs::Segment>{
                                   {40, 0, 16}, {0, 16, 8}, {16, 24, 8}},
                               std::vector<longtron::ops::LoraOutputs::Segment>{
                                   {40, 0, 15}, {0, 15, 9}, {16, 24, 8}}})
  for (const bool bf16 : {false, true}) {
    outputs.segments = segments;
    auto op = [&](float v) { return bf16 ? rounded(v) : double(v); };
    const std::vector<float> x = random_values(N * in, 1), dy = random_values(N * ldy, 2),
                             A = random_values(r * in, 3), B = random_values(out * r, 4);
    std::vector<float> y = random_values(N * ldy, 5), dx = random_values(N * in, 6),
                       dA(r * in, 0.f), dB(out * r, 0.f);
    const float s = 0.5f;
    std::vector<double> wy(y.begin(), y.end()), wdx(dx.begin(), dx.end()), wdA(r * in, 0.0),
        wdB(out * r, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> u(r, 0.0), du(r, 0.0);
      for (int64_t k = 0; k < r; ++k) {
        for (int64_t i = 0; i < in; ++i) u[k] += op(x[n * in + i]) * op(A[k * in + i]);
        for (const auto& g : outputs.segments)
          for (int64_t j = 0; j < g.count; ++j)
            du[k] += op(dy[n * ldy + g.y_col + j]) * op(s * op(B[(g.b_row + j) * r + k]));
        u[k] = bf16 ? rounded(u[k]) : u[k];
        du[k] = bf16 ? rounded(du[k]) : du[k];
      }
      for (const auto& g : outputs.segments)
        for (int64_t j = 0; j < g.count; ++j)
          for (int64_t k = 0; k < r; ++k) {
            wy[n * ldy + g.y_col + j] += s * u[k] * op(B[(g.b_row + j) * r + k]);
            wdB[(g.b_row + j) * r + k] += s * op(dy[n * ldy + g.y_col + j]) * u[k];
          }
      for (int64_t k = 0; k < r; ++k)
        for (int64_t i = 0; i < in; ++i) {
          wdx[n * in + i] += du[k] * op(A[k * in + i]);
          wdA[k * in + i] += du[k] * op(x[n * in + i]);
        }
    }
    lora_forward(y.data(), x.data(), A.data(), B.data(), s, N, in, out, r, bf16, nullptr, outputs);
    lora_backward(dx.data(), true, dA.data(), dB.data(), dy.data(), x.data(), A.data(), B.data(),
                  s, N, in, out, r, bf16, nullptr, nullptr, outputs);
    // Columns of y outside every segment ([24, 40)) keep their values exactly.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 24; c < 40; ++c) ASSERT_EQ(double(y[n * ldy + c]), wy[n * ldy + c]);
    const double tight = 2e-4, loose = bf16 ? 4.0 / 256 : tight;  // bf16: rare rounding ties
    auto near = [&](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
      size_t off = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double scale = 1.0 + std::fabs(want[i]), err = std::fabs(got[i] - want[i]);
        ASSERT_LE(err, (loose + tight) * scale) << what << "[" << i << "], bf16 " << bf16;
        if (err > tight * scale) ++off;
      }
      EXPECT_LE(off, got.size() / 100) << what << ", bf16 " << bf16;
    };
    near(y, wy, "y");
    near(dx, wdx, "dx");
    near(dA, wdA, "dA");
    near(dB, wdB, "dB");
  }
}

}  // namespace

namespace {

// More shapes (r = 1, odd r, odd widths, N around the block and chunk sizes, N > 16·256 so chunks
// grow), overwritten dx, bf16 with and without bits, against one double reference (rounded
// operands under bf16).
struct Ref {
  std::vector<double> y, dx, dA, dB;
};

/// The double reference of lora_forward then lora_backward on d (under bf16: x, dy, A, B, u, du
/// rounded; s applied to the fp32 accumulator).
Ref reference(const Case& c, const Data& d, float s, bool accumulate, bool bf16) {
  auto op = [&](float v) { return bf16 ? rounded(v) : double(v); };
  Ref ref;
  ref.y.assign(d.y.begin(), d.y.end());
  ref.dx.assign(d.dx.begin(), d.dx.end());
  if (!accumulate) std::fill(ref.dx.begin(), ref.dx.end(), 0.0);
  ref.dA.assign(d.dA.begin(), d.dA.end());
  ref.dB.assign(d.dB.begin(), d.dB.end());
  std::vector<double> A(d.A.size()), B(d.B.size());
  for (size_t i = 0; i < A.size(); ++i) A[i] = op(d.A[i]);
  for (size_t i = 0; i < B.size(); ++i) B[i] = op(d.B[i]);
  std::vector<double> x(size_t(c.in)), dy(size_t(c.out)), u(size_t(c.r)), du(size_t(c.r));
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t i = 0; i < c.in; ++i) x[i] = op(d.x[n * c.in + i]);
    for (int64_t o = 0; o < c.out; ++o) dy[o] = op(d.dy[n * c.out + o]);
    for (int64_t k = 0; k < c.r; ++k) {
      double a = 0, b = 0;
      for (int64_t i = 0; i < c.in; ++i) a += x[i] * A[k * c.in + i];
      for (int64_t o = 0; o < c.out; ++o) b += dy[o] * B[o * c.r + k];
      u[k] = bf16 ? rounded(a) : a;
      du[k] = bf16 ? rounded(double(s) * b) : double(s) * b;
    }
    for (int64_t k = 0; k < c.r; ++k) {
      for (int64_t o = 0; o < c.out; ++o) {
        ref.y[n * c.out + o] += double(s) * u[k] * B[o * c.r + k];
        ref.dB[o * c.r + k] += double(s) * dy[o] * u[k];
      }
      for (int64_t i = 0; i < c.in; ++i) {
        ref.dx[n * c.in + i] += du[k] * A[k * c.in + i];
        ref.dA[k * c.in + i] += du[k] * x[i];
      }
    }
  }
  return ref;
}

struct ShapeCase {
  Case shape;
  bool bf16, bits, accumulate;
  float s;
};

std::string case_name(const ::testing::TestParamInfo<ShapeCase>& info) {
  const ShapeCase& c = info.param;
  std::ostringstream name;
  name << "N" << c.shape.N << "_in" << c.shape.in << "_out" << c.shape.out << "_r" << c.shape.r
       << (c.bf16 ? (c.bits ? "_bf16bits" : "_bf16") : "_fp32") << (c.accumulate ? "_acc" : "_over")
       << "_s" << int(c.s * 100);
  return name.str();
}

class LoraKernelsShapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(LoraKernelsShapes, MatchesDoubleReference) {
  const ShapeCase rc = GetParam();
  const Case c = rc.shape;
  Data d(c, unsigned(7 * c.N + 3 * c.r + c.in));
  const Ref ref = reference(c, d, rc.s, rc.accumulate, rc.bf16);
  std::vector<uint16_t> x16(d.x.size()), dy16(d.dy.size());
  for (size_t i = 0; i < x16.size(); ++i) x16[i] = longtron::float_to_bf16(d.x[i]);
  for (size_t i = 0; i < dy16.size(); ++i) dy16[i] = longtron::float_to_bf16(d.dy[i]);
  // Poison the bf16 inputs' floats where bits are given: the kernels must read the bits only.
  std::vector<float> x = d.x, dy = d.dy;
  if (rc.bits) {
    for (float& v : x) v = std::nanf("");
    for (float& v : dy) v = std::nanf("");
  }
  lora_forward(d.y.data(), x.data(), d.A.data(), d.B.data(), rc.s, c.N, c.in, c.out, c.r, rc.bf16,
               rc.bits ? x16.data() : nullptr);
  lora_backward(d.dx.data(), rc.accumulate, d.dA.data(), d.dB.data(), dy.data(), x.data(),
                d.A.data(), d.B.data(), rc.s, c.N, c.in, c.out, c.r, rc.bf16,
                rc.bits ? x16.data() : nullptr, rc.bits ? dy16.data() : nullptr);
  // Magnitudes: u ~ sqrt(in), du ~ s·sqrt(out); dA sums N of du·x, dB N of s·dy·u.
  const double su = std::sqrt(double(c.in)), sdu = std::fabs(rc.s) * std::sqrt(double(c.out));
  const double sr = std::sqrt(double(c.r)), sn = std::sqrt(double(c.N));
  const double rel = rc.bf16 ? 1.0 / 256 : 2e-6;  // bf16: one ulp of u or du now and then
  // flip: what one bf16 ulp of one row's u or du moves a sum over rows by (dA, dB: every element
  // sums all N rows, so some flips land in most elements; they only count as loose past a few).
  auto check = [&](const std::vector<float>& got, const std::vector<double>& want, double scale,
                   const char* what, double flip = 0) {
    size_t bad = 0, loose = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(double(got[i]) - want[i]);
      if (!(err <= 4 * rel * scale + 1e-5 * (1 + std::fabs(want[i])))) ++bad;
      if (err > 1e-5 * scale + 8 * flip) ++loose;
      worst = std::max(worst, err / scale);
    }
    EXPECT_EQ(bad, 0u) << what << " worst rel " << worst;
    if (rc.bf16) {
      EXPECT_LE(loose, got.size() / 50 + 2) << what << " worst rel " << worst;
    }
  };
  check(d.y, ref.y, std::fabs(rc.s) * su * sr + 1, "y");
  check(d.dx, ref.dx, sdu * sr + 1, "dx");
  check(d.dA, ref.dA, sdu * sn + 1, "dA", sdu / 256);
  check(d.dB, ref.dB, std::fabs(rc.s) * su * sn + 1, "dB", std::fabs(rc.s) * su / 256);
}

std::vector<ShapeCase> shape_cases() {
  std::vector<ShapeCase> out;
  const std::vector<Case> shapes = {
      {1, 16, 16, 1},    {1, 7, 5, 3},      {63, 33, 17, 1},   {65, 32, 48, 3},
      {64, 64, 64, 8},   {63, 130, 150, 8}, {65, 31, 45, 64},  {4097, 48, 32, 8},
      {5000, 34, 66, 2}, {5000, 17, 9, 3},  {129, 160, 96, 64}, {2, 32, 32, 32},
      {97, 64, 96, 16},  {4100, 64, 64, 64}};
  for (const Case& c : shapes)
    for (const int mode : {0, 1, 2})  // fp32, bf16 rounded here, bf16 with bits
      for (const bool acc : {true, false})
        out.push_back({c, mode > 0, mode == 2, acc, mode == 0 ? 0.75f : 2.f});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LoraKernelsShapes, ::testing::ValuesIn(shape_cases()),
                         case_name);

// Under bf16 with s not a power of two (alpha / rank = 16 / 12, rsLoRA's alpha / sqrt(r)), the
// products read round(B) and apply s in fp32 (as the GEMM path's alpha and the fp32 tiles do):
// y and du = s·dy·B match the reference within fp32 accumulation except for rare u/du rounding
// ties. Counts elements off by more than fp32 accumulation.
TEST(LoraKernelsScale, Bf16ScaleNotPowerOfTwoMatchesTiles) {
  const float s = 16.f / 12.f;
  // in = 64: AVX512-BF16 dot products where the CPU has them; in = 63: the fp32 tiles.
  for (const Case c : {Case{256, 64, 96, 16}, Case{256, 63, 96, 16}}) {
    Data d(c, 21);
    const Ref ref = reference(c, d, s, true, true);
    lora_forward(d.y.data(), d.x.data(), d.A.data(), d.B.data(), s, c.N, c.in, c.out, c.r, true);
    lora_backward(d.dx.data(), true, d.dA.data(), d.dB.data(), d.dy.data(), d.x.data(),
                  d.A.data(), d.B.data(), s, c.N, c.in, c.out, c.r, true);
    // Errors relative to the typical magnitude of the adapter's term in each output.
    auto loose = [](const std::vector<float>& got, const std::vector<double>& want, double scale,
                    double* worst) {
      size_t n = 0;
      *worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(got[i] - want[i]) / scale;
        *worst = std::max(*worst, e);
        if (e > 2e-5) ++n;
      }
      return n;
    };
    double wy, wdx;
    const size_t ly = loose(d.y, ref.y, s * std::sqrt(double(c.in * c.r)), &wy);
    const size_t ldx = loose(d.dx, ref.dx, s * std::sqrt(double(c.out * c.r)), &wdx);
    EXPECT_LE(ly, d.y.size() / 50) << "in " << c.in << ": y elements off by more than fp32 "
                                   << "accumulation; worst relative " << wy;
    EXPECT_LE(ldx, d.dx.size() / 50) << "in " << c.in << ": dx elements off by more than fp32 "
                                     << "accumulation; worst relative " << wdx;
  }
}

TEST(LoraKernelsThreads, SameBitsForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  for (const Case c : {Case{3000, 96, 160, 16}, Case{4097, 33, 17, 3}, Case{5000, 64, 96, 8},
                       Case{1000, 48, 30, 1}})
    for (const bool bf16 : {false, true}) {
      std::vector<std::vector<float>> first;
      for (const int threads : {1, 2, 3, 7, 16}) {
        omp_set_num_threads(threads);
        Data d(c, 13);
        lora_forward(d.y.data(), d.x.data(), d.A.data(), d.B.data(), 0.5f, c.N, c.in, c.out, c.r,
                     bf16);
        lora_backward(d.dx.data(), false, d.dA.data(), d.dB.data(), d.dy.data(), d.x.data(),
                      d.A.data(), d.B.data(), 0.5f, c.N, c.in, c.out, c.r, bf16);
        const std::vector<std::vector<float>> got = {d.y, d.dx, d.dA, d.dB};
        if (first.empty()) first = got;
        for (size_t t = 0; t < got.size(); ++t)
          EXPECT_EQ(got[t], first[t]) << threads << " threads, tensor " << t << ", bf16 " << bf16
                                      << ", N " << c.N;
      }
    }
  omp_set_num_threads(saved);
}

// Called from several threads at once (each its own adapter call): per-thread arenas.
TEST(LoraKernelsThreads, CallsFromInsideAParallelRegion) {
  const Case c{300, 64, 48, 8};
  for (const bool bf16 : {false, true}) {
    Data d0(c, 17);
    lora_backward(d0.dx.data(), true, d0.dA.data(), d0.dB.data(), d0.dy.data(), d0.x.data(),
                  d0.A.data(), d0.B.data(), 0.5f, c.N, c.in, c.out, c.r, bf16);
    std::vector<Data> ds(4, Data(c, 17));
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&, t] {
        lora_backward(ds[t].dx.data(), true, ds[t].dA.data(), ds[t].dB.data(), ds[t].dy.data(),
                      ds[t].x.data(), ds[t].A.data(), ds[t].B.data(), 0.5f, c.N, c.in, c.out,
                      c.r, bf16);
      });
    for (std::thread& th : pool) th.join();
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(ds[t].dx, d0.dx);
      EXPECT_EQ(ds[t].dA, d0.dA);
      EXPECT_EQ(ds[t].dB, d0.dB);
    }
  }
}

}  // namespace
