// Varlen attention: forward against an explicit masked softmax in double, backward against
// central finite differences in double, float against double, on the layouts the model uses
// (dense q/k/v and q/k/v strided inside one packed qkv buffer), MHA and GQA, one long document
// (several 64-token blocks), many short ones, length-1 and empty segments.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "bf16_here.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "fd_check.h"
#include "ops/attention_add_dq.h"
#include "ops/attention_bf16.h"
#include "ops/attention_plan.h"
#include "ops/bf16_tile_gemm.h"
#include "ops/compute_context.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"

namespace ops = longtron::ops;
using longtron::testing::dot;
using longtron::testing::expect_fd;
using longtron::testing::random_vector;
using Vec = std::vector<double>;

namespace {

struct Case {
  std::vector<int32_t> cu_seqlens;
  int64_t heads, kv_heads, d;
  bool packed;  // strided views: see q_stride / kv_stride
  std::vector<int32_t> cu_seqlens_k = {};  // empty: keys are the query segments
  int64_t window = 0;
  std::vector<int32_t> key_offsets = {};  // empty: bottom-right (Lk − Lq); needs cu_seqlens_k
  bool separate_keys() const { return !cu_seqlens_k.empty(); }
  const std::vector<int32_t>& cu_k() const { return separate_keys() ? cu_seqlens_k : cu_seqlens; }
  int64_t tokens() const { return cu_seqlens.back(); }
  int64_t kv_tokens() const { return cu_k().back(); }
  // Packed with shared segments: q, k, v inside one [N, (heads + 2·kv_heads)·d] buffer (the
  // model's qkv). Packed with separate keys: q strided in [N, heads·d + 3] (3 pad columns) and
  // k, v inside one [N_k, 2·kv_heads·d + 1] buffer (1 pad column).
  bool padded() const { return packed && separate_keys(); }
  int64_t q_stride() const {
    return !packed ? heads * d : padded() ? heads * d + 3 : (heads + 2 * kv_heads) * d;
  }
  int64_t kv_stride() const {
    return !packed ? kv_heads * d : padded() ? 2 * kv_heads * d + 1 : (heads + 2 * kv_heads) * d;
  }
  int64_t q_size() const { return tokens() * q_stride(); }
  int64_t k_size() const { return packed && !padded() ? 0 : kv_tokens() * kv_stride(); }
  int64_t v_size() const { return packed ? 0 : kv_tokens() * kv_stride(); }
  ops::AttentionShape shape() const {
    ops::AttentionShape s{tokens(), heads, kv_heads, d, q_stride(), kv_stride(),
                          cu_seqlens.data(), static_cast<int64_t>(cu_seqlens.size()) - 1,
                          1.0 / std::sqrt(static_cast<double>(d))};
    if (separate_keys()) {
      s.cu_seqlens_k = cu_seqlens_k.data();
      s.num_kv_tokens = kv_tokens();
      if (!key_offsets.empty()) s.key_offsets = key_offsets.data();
    }
    s.window = window;
    return s;
  }
  // Offsets of k and v inside the buffers that hold them (see the layouts above).
  int64_t k_offset() const { return packed && !padded() ? heads * d : 0; }
  int64_t v_offset() const {
    return packed ? (padded() ? kv_heads * d : (heads + kv_heads) * d) : 0;
  }
};

// Inputs (or gradients) of one case: k and v live in q's buffer (packed) or k's (padded) when the
// layout says so.
template <typename T>
struct Inputs {
  std::vector<T> q, k, v;
  T* qp() { return q.data(); }
  T* kp(const Case& c) { return (c.k_size() == 0 ? q.data() : k.data()) + c.k_offset(); }
  T* vp(const Case& c) {
    return (c.packed ? (c.padded() ? k.data() : q.data()) : v.data()) + c.v_offset();
  }
  const T* qp() const { return q.data(); }
  const T* kp(const Case& c) const { return const_cast<Inputs*>(this)->kp(c); }
  const T* vp(const Case& c) const { return const_cast<Inputs*>(this)->vp(c); }
};

Inputs<double> make_inputs(const Case& c, uint32_t seed) {
  return {random_vector(c.q_size(), seed), random_vector(c.k_size(), seed + 1),
          random_vector(c.v_size(), seed + 2)};
}

// Explicit masked softmax, one (token, head) at a time: the definition the kernel must meet.
// Query r of a segment with Lq queries and Lk keys sits at key position p = r + Lk − Lq and sees
// keys c with p − window < c <= p (every c <= p without a window); with key_offsets,
// p = r + key_offsets[segment], and a query that sees no key gives out 0 and lse −inf.
void naive_attention(Vec& out, Vec& lse, const Inputs<double>& in, const Case& c) {
  const ops::AttentionShape s = c.shape();
  const int64_t N = c.tokens(), G = c.heads / c.kv_heads, d = c.d;
  out.assign(N * c.heads * d, 0.0);
  lse.assign(c.heads * N, 0.0);
  for (size_t seg = 0; seg + 1 < c.cu_seqlens.size(); ++seg) {
    const int64_t q_begin = c.cu_seqlens[seg], k_begin = c.cu_k()[seg];
    const int64_t lq = c.cu_seqlens[seg + 1] - q_begin, lk = c.cu_k()[seg + 1] - k_begin;
    for (int64_t r = 0; r < lq; ++r) {
      const int64_t n = q_begin + r;
      const int64_t pos = r + (c.key_offsets.empty() ? lk - lq : c.key_offsets[seg]);
      const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
      const int64_t last = std::min(pos, lk - 1);
      for (int64_t h = 0; h < c.heads; ++h) {
        const double* qr = in.qp() + n * s.q_stride + h * d;
        std::vector<double> score;
        if (first > last) lse[h * N + n] = -std::numeric_limits<double>::infinity();
        if (first > last) continue;
        for (int64_t m = first; m <= last; ++m) {
          const double* kr = in.kp(c) + (k_begin + m) * s.kv_stride + (h / G) * d;
          double dotp = 0;
          for (int64_t x = 0; x < d; ++x) dotp += qr[x] * kr[x];
          score.push_back(dotp * s.scale);
        }
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (double v : score) mx = std::max(mx, v);
        for (double v : score) sum += std::exp(v - mx);
        lse[h * N + n] = mx + std::log(sum);
        for (size_t j = 0; j < score.size(); ++j) {
          const double p = std::exp(score[j] - mx) / sum;
          const double* vr = in.vp(c) + (k_begin + first + j) * s.kv_stride + (h / G) * d;
          for (int64_t x = 0; x < d; ++x) out[(n * c.heads + h) * d + x] += p * vr[x];
        }
      }
    }
  }
}

template <typename T>
void forward(std::vector<T>& out, std::vector<T>& lse, const Inputs<T>& in, const Case& c,
             const ops::ComputeContext& cc = ops::ComputeContext::fp32()) {
  out.assign(c.tokens() * c.heads * c.d, T(0));
  lse.assign(c.heads * c.tokens(), T(0));
  ops::varlen_attention_forward<T>(cc, out.data(), lse.data(), in.qp(), in.kp(c), in.vp(c),
                                   c.shape());
}

void expect_matches_naive(const Case& c, double tol) {
  const Inputs<double> in = make_inputs(c, 11);
  Vec out, lse, ref_out, ref_lse;
  forward(out, lse, in, c);
  naive_attention(ref_out, ref_lse, in, c);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref_out[i], tol) << "out " << i;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref_lse[i])) ASSERT_EQ(lse[i], ref_lse[i]) << "lse " << i;
    else ASSERT_NEAR(lse[i], ref_lse[i], tol) << "lse " << i;
  }
}

// Pad columns of a padded layout are no gradient: the kernel must leave them alone (they keep
// the garbage they were filled with), and they are zeroed so the FD comparison sees 0 there.
void clear_pad_columns(std::vector<double>& g, int64_t stride, int64_t used, double garbage) {
  for (size_t i = 0; i < g.size(); ++i) {
    if (static_cast<int64_t>(i) % stride < used) continue;
    ASSERT_EQ(g[i], garbage) << "pad column written at " << i;
    g[i] = 0;
  }
}

// Backward of L = Σ dout ∘ attention(q, k, v) against central differences of L.
void expect_backward_matches_fd(const Case& c, int64_t stride) {
  // Thousands of tiny forward calls: one thread avoids OpenMP barrier costs on a shared machine
  // (the threaded paths are covered by the forward and float-vs-double tests).
  longtron::set_num_threads(1);
  Inputs<double> in = make_inputs(c, 21);
  const Vec dout = random_vector(c.tokens() * c.heads * c.d, 99);
  auto loss = [&] {
    Vec out, lse;
    forward(out, lse, in, c);
    return dot(out, dout);
  };
  Vec out, lse;
  forward(out, lse, in, c);
  const ops::AttentionShape s = c.shape();
  // Gradients share the inputs' layout; fill with garbage to prove they are overwritten.
  Inputs<double> grad{Vec(c.q_size(), 123.0), Vec(c.k_size(), 123.0), Vec(c.v_size(), 123.0)};
  ops::varlen_attention_backward<double>(grad.qp(), grad.kp(c), grad.vp(c), dout.data(), in.qp(),
                                         in.kp(c), in.vp(c), out.data(), lse.data(), s);
  if (c.padded()) {
    clear_pad_columns(grad.q, c.q_stride(), c.heads * c.d, 123.0);
    clear_pad_columns(grad.k, c.kv_stride(), 2 * c.kv_heads * c.d, 123.0);
  }
  expect_fd(in.q, grad.q, loss, c.packed && !c.padded() ? "dqkv" : "dq", 1e-6, stride);
  if (c.k_size() > 0) expect_fd(in.k, grad.k, loss, c.padded() ? "dkv" : "dk", 1e-6, stride);
  if (c.v_size() > 0) expect_fd(in.v, grad.v, loss, "dv", 1e-6, stride);
}

// Float forward and backward against double on the same inputs.
void expect_float_matches_double(const Case& c) {
  const Inputs<double> in = make_inputs(c, 31);
  Inputs<float> inf{{in.q.begin(), in.q.end()}, {in.k.begin(), in.k.end()},
                    {in.v.begin(), in.v.end()}};
  const Vec dout = random_vector(c.tokens() * c.heads * c.d, 98);
  const std::vector<float> doutf(dout.begin(), dout.end());
  Vec out, lse;
  std::vector<float> outf, lsef;
  forward(out, lse, in, c);
  forward(outf, lsef, inf, c);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(outf[i], out[i], 2e-5) << "out " << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lsef[i], lse[i], 2e-5) << "lse " << i;
  const ops::AttentionShape s = c.shape();
  Inputs<double> g{Vec(c.q_size()), Vec(c.k_size()), Vec(c.v_size())};
  Inputs<float> gf{std::vector<float>(c.q_size()), std::vector<float>(c.k_size()),
                   std::vector<float>(c.v_size())};
  ops::varlen_attention_backward<double>(g.qp(), g.kp(c), g.vp(c), dout.data(), in.qp(),
                                         in.kp(c), in.vp(c), out.data(), lse.data(), s);
  ops::varlen_attention_backward<float>(gf.qp(), gf.kp(c), gf.vp(c), doutf.data(), inf.qp(),
                                        inf.kp(c), inf.vp(c), outf.data(), lsef.data(), s);
  for (size_t i = 0; i < g.q.size(); ++i) ASSERT_NEAR(gf.q[i], g.q[i], 1e-4) << "dq " << i;
  for (size_t i = 0; i < g.k.size(); ++i) ASSERT_NEAR(gf.k[i], g.k[i], 1e-4) << "dk " << i;
  for (size_t i = 0; i < g.v.size(); ++i) ASSERT_NEAR(gf.v[i], g.v[i], 1e-4) << "dv " << i;
}

class Attention : public ::testing::Test {
 protected:
  void SetUp() override { longtron::set_num_threads(2); }  // dynamic schedule and dq locks
};

}  // namespace

TEST_F(Attention, ForwardMatchesNaiveOneLongDocumentGqa) {
  expect_matches_naive({{0, 200}, 4, 2, 64, false}, 1e-10);
}
TEST_F(Attention, ForwardMatchesNaiveManyShortPackedMha) {
  expect_matches_naive({{0, 1, 3, 3, 70, 71, 150, 157}, 3, 3, 7, true}, 1e-10);
}
TEST_F(Attention, ForwardOfLengthOneSegmentsIsV) {
  const Case c{{0, 1, 2, 3}, 4, 1, 5, false};
  const Inputs<double> in = make_inputs(c, 3);
  Vec out, lse;
  forward(out, lse, in, c);
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t x = 0; x < 5; ++x) EXPECT_NEAR(out[(n * 4 + h) * 5 + x], in.v[n * 5 + x], 1e-14);
}

TEST_F(Attention, BackwardFdOneLongDocumentSeveralBlocks) {
  expect_backward_matches_fd({{0, 150}, 2, 1, 3, false}, 3);
}
TEST_F(Attention, BackwardFdManyShortDocumentsGqaPacked) {
  expect_backward_matches_fd({{0, 3, 4, 9, 9, 17, 18}, 4, 2, 5, true}, 1);
}
TEST_F(Attention, BackwardFdLengthOneSegmentsSeveralGroups) {
  expect_backward_matches_fd({{0, 1, 2, 3, 4, 6}, 6, 3, 2, false}, 1);
}
TEST_F(Attention, BackwardFdMhaHeadDim64AcrossBlockEdge) {
  expect_backward_matches_fd({{0, 5, 75}, 2, 2, 64, true}, 37);
}
TEST_F(Attention, BackwardFdGqaSingleKvHead) {
  expect_backward_matches_fd({{0, 66, 130}, 4, 1, 16, false}, 23);
}

TEST_F(Attention, FloatAgreesWithDouble) {
  expect_float_matches_double({{0, 100, 101, 300}, 8, 2, 64, false});
  expect_float_matches_double({{0, 7, 140}, 4, 2, 13, true});
}

// ---- Separate key segments (bottom-right aligned) and sliding windows ------------------------

namespace {

// Random cases: 1–4 segments of 0–150 queries (empty and length-1 segments included), keys
// Lq + 0–100, windows shorter and longer than the segments, MHA/GQA, dense or strided views.
Case random_case(std::mt19937& rng, bool separate_keys) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t segments = pick(1, 4);
  static constexpr int64_t kLengths[] = {0, 1, 2, 5, 63, 64, 65, 100, 150};
  static constexpr int64_t kWindows[] = {0, 1, 3, 17, 64, 70, 1000};
  static constexpr int64_t kHeads[][2] = {{2, 2}, {4, 2}, {3, 1}, {4, 1}};
  Case c{{0}, 0, 0, pick(1, 2) == 1 ? 8 : 5, pick(0, 1) == 1};
  const int64_t* hk = kHeads[pick(0, 3)];
  c.heads = hk[0];
  c.kv_heads = hk[1];
  c.window = kWindows[pick(0, 6)];
  if (separate_keys) c.cu_seqlens_k = {0};
  for (int64_t i = 0; i < segments; ++i) {
    const int64_t lq = kLengths[pick(0, 8)];
    c.cu_seqlens.push_back(c.cu_seqlens.back() + static_cast<int32_t>(lq));
    if (separate_keys) {
      const int64_t extra = pick(0, 1) == 1 ? 0 : pick(1, 100);
      c.cu_seqlens_k.push_back(c.cu_seqlens_k.back() + static_cast<int32_t>(lq + extra));
    }
  }
  if (c.tokens() == 0) {  // at least one query somewhere
    c.cu_seqlens.back() += 3;
    if (separate_keys) c.cu_seqlens_k.back() += 3;
  }
  return c;
}

std::string describe(const Case& c) {
  // Appends only: GCC 12 warns falsely (-Wrestrict) on `" " + std::to_string(x)` (GCC bug 105651).
  std::string t = "cu_q";
  for (int32_t x : c.cu_seqlens) t.append(" ").append(std::to_string(x));
  t += " cu_k";
  for (int32_t x : c.cu_k()) t.append(" ").append(std::to_string(x));
  t.append(" heads ").append(std::to_string(c.heads)).append("/").append(std::to_string(c.kv_heads));
  t.append(" d ").append(std::to_string(c.d)).append(c.packed ? " strided" : " dense");
  return t.append(" window ").append(std::to_string(c.window));
}

}  // namespace

TEST_F(Attention, ForwardMatchesNaiveWindowsRandomShapes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    const Case c = random_case(rng, false);
    SCOPED_TRACE(describe(c));
    expect_matches_naive(c, 1e-10);
  }
}
TEST_F(Attention, ForwardMatchesNaiveSeparateKeysRandomShapes) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 16; ++trial) {
    const Case c = random_case(rng, true);
    SCOPED_TRACE(describe(c));
    expect_matches_naive(c, 1e-10);
  }
}
TEST_F(Attention, FloatAgreesWithDoubleKeysAndWindows) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 6; ++trial) {
    const Case c = random_case(rng, trial % 2 == 0);
    SCOPED_TRACE(describe(c));
    expect_float_matches_double(c);
  }
}

// head_dim 16 and 32: the fp32 register-block path (attention_f32_blocks.h: head_dim a multiple
// of 16; AVX-512 or, in a build for AVX2 + FMA, attention_f32_avx2.h) on windows, separate keys,
// key offsets and odd segment lengths.
TEST_F(Attention, FloatAgreesWithDoubleRegisterBlockPath) {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 6; ++trial) {
    Case c = random_case(rng, trial % 2 == 0);
    c.d = trial < 3 ? 16 : 32;
    SCOPED_TRACE(describe(c));
    expect_float_matches_double(c);
  }
  Case c{{0, 70, 150, 154}, 4, 2, 16, true, {0, 130, 230, 240}};
  c.key_offsets = {130, 70, 5};
  c.window = 80;
  expect_float_matches_double(c);
}

TEST_F(Attention, BackwardFdWindowAcrossBlocks) {
  Case c{{0, 150, 160}, 2, 1, 3, false};
  c.window = 40;  // 150 > W: the window slides over three blocks; 10 < W: untouched
  expect_backward_matches_fd(c, 3);
}
TEST_F(Attention, BackwardFdWindowOfOneGqaStrided) {
  Case c{{0, 4, 5, 12}, 4, 2, 3, true};
  c.window = 1;  // every query sees only itself
  expect_backward_matches_fd(c, 1);
}
TEST_F(Attention, BackwardFdSeparateKeysStridedGqaEmptySegment) {
  // An empty query segment with 10 keys (zero gradients), Lk = Lq, and Lk > Lq across blocks.
  Case c{{0, 0, 5, 75}, 4, 2, 3, true, {0, 10, 15, 150}};
  expect_backward_matches_fd(c, 3);
}
TEST_F(Attention, BackwardFdSeparateKeysAndWindow) {
  // Window 30 with Lk − Lq = 90: keys before the window of the first query get no gradient.
  Case c{{0, 3, 73}, 2, 1, 4, false, {0, 3, 163}};
  c.window = 30;
  expect_backward_matches_fd(c, 3);
}

// Explicit key offsets (ring attention's partial blocks): a query run that sees a whole earlier
// block (offset >= Lk − 1), part of it through a window, more queries than keys, queries that
// see no key (offset < 0, or before the window), random shapes against the naive definition.
TEST_F(Attention, ForwardMatchesNaiveKeyOffsetsRandomShapes) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 16; ++trial) {
    Case c = random_case(rng, true);
    for (size_t i = 0; i + 1 < c.cu_seqlens_k.size(); ++i) {
      const int32_t lk = c.cu_seqlens_k[i + 1] - c.cu_seqlens_k[i];
      c.key_offsets.push_back(std::uniform_int_distribution<int32_t>(-3, lk + 80)(rng));
    }
    if (trial % 3 == 0) c.cu_seqlens.back() += 40;  // more queries than keys in the last segment
    SCOPED_TRACE(describe(c) + " offsets " + std::to_string(c.key_offsets[0]));
    expect_matches_naive(c, 1e-10);
  }
}
TEST_F(Attention, BackwardFdKeyOffsets) {
  // A whole earlier block (offset 200 >= Lk), a block seen from 70 positions later through a
  // window of 90 (keys before it get no gradient), and 4 queries with offset −2 (two see nothing).
  Case c{{0, 70, 150, 154}, 4, 2, 3, true, {0, 130, 230, 240}};
  c.key_offsets = {200, 70, -2};
  expect_backward_matches_fd(c, 3);
  c.window = 90;
  expect_backward_matches_fd(c, 3);
}
TEST_F(Attention, FloatAgreesWithDoubleKeyOffsets) {
  Case c{{0, 70, 150, 154}, 4, 2, 8, false, {0, 130, 230, 240}};
  c.key_offsets = {130, 70, 5};  // every query sees a key (the comparison is of finite lse)
  c.window = 80;
  expect_float_matches_double(c);
}

// A window at least as long as every segment's keys changes nothing: exactly the same tiles and
// arithmetic, so the results are bitwise equal, forward and backward, float and double.
template <typename T>
void expect_long_window_is_exact(Case c) {
  const Inputs<double> ind = make_inputs(c, 41);
  const Inputs<T> in{{ind.q.begin(), ind.q.end()}, {ind.k.begin(), ind.k.end()},
                     {ind.v.begin(), ind.v.end()}};
  const Vec doutd = random_vector(c.tokens() * c.heads * c.d, 42);
  const std::vector<T> dout(doutd.begin(), doutd.end());
  auto run = [&](const Case& cc, std::vector<T>& out, std::vector<T>& lse, Inputs<T>& g) {
    forward(out, lse, in, cc);
    g = {std::vector<T>(cc.q_size()), std::vector<T>(cc.k_size()), std::vector<T>(cc.v_size())};
    ops::varlen_attention_backward<T>(g.qp(), g.kp(cc), g.vp(cc), dout.data(), in.qp(),
                                      in.kp(cc), in.vp(cc), out.data(), lse.data(), cc.shape());
  };
  std::vector<T> out0, lse0, out1, lse1;
  Inputs<T> g0, g1;
  run(c, out0, lse0, g0);
  int64_t longest = 0;
  for (size_t i = 0; i + 1 < c.cu_k().size(); ++i)
    longest = std::max<int64_t>(longest, c.cu_k()[i + 1] - c.cu_k()[i]);
  for (int64_t w : {longest, longest + 1, int64_t{100000}}) {
    c.window = w;
    run(c, out1, lse1, g1);
    EXPECT_EQ(out1, out0) << "window " << w;
    EXPECT_EQ(lse1, lse0) << "window " << w;
    EXPECT_EQ(g1.q, g0.q) << "window " << w;
    EXPECT_EQ(g1.k, g0.k) << "window " << w;
    EXPECT_EQ(g1.v, g0.v) << "window " << w;
  }
}
TEST_F(Attention, WindowLongerThanEveryDocumentIsExact) {
  expect_long_window_is_exact<double>({{0, 100, 101, 230}, 4, 2, 16, true});
  expect_long_window_is_exact<float>({{0, 100, 101, 230}, 4, 2, 16, true});
  expect_long_window_is_exact<float>({{0, 30, 90}, 4, 1, 8, false, {0, 70, 200}});
}

// The inputs of a backward check: q, k, v from make_inputs(c, seed) and dO from seed + 1, in T,
// and the forward's out and lse under the compute type (bf16 or fp32).
template <typename T>
struct BackwardCase {
  ops::ComputeContext cc;
  Inputs<T> in;
  std::vector<T> dout, out, lse;
  BackwardCase(const Case& c, bool bf16, uint32_t seed)
      : cc(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32) {
    const Inputs<double> ind = make_inputs(c, seed);
    in = {{ind.q.begin(), ind.q.end()}, {ind.k.begin(), ind.k.end()},
          {ind.v.begin(), ind.v.end()}};
    const Vec doutd = random_vector(c.tokens() * c.heads * c.d, seed + 1);
    dout.assign(doutd.begin(), doutd.end());
    forward(out, lse, in, c, cc);
  }
};

// The backward adds the dQ tiles of the key blocks in key-block order whatever thread runs which
// block, so its results are bitwise the same for 1 to 4 threads and from one run to the next
// (with adds in arrival order, two runs with 2 threads differed in the last bits).
template <typename T>
void expect_backward_independent_of_threads(const Case& c, bool bf16) {
  longtron::set_num_threads(1);
  const BackwardCase<T> b(c, bf16, 71);
  const auto& [cc, in, dout, out, lse] = b;
  auto run = [&] {
    Inputs<T> g{std::vector<T>(c.q_size()), std::vector<T>(c.k_size()), std::vector<T>(c.v_size())};
    ops::varlen_attention_backward<T>(cc, g.qp(), g.kp(c), g.vp(c), dout.data(), in.qp(), in.kp(c),
                                      in.vp(c), out.data(), lse.data(), c.shape());
    return g;
  };
  const Inputs<T> one = run();
  for (int threads : {2, 3, 4, 4}) {
    longtron::set_num_threads(threads);
    const Inputs<T> g = run();
    EXPECT_EQ(g.q, one.q) << threads << " threads: dq";
    EXPECT_EQ(g.k, one.k) << threads << " threads: dk";
    EXPECT_EQ(g.v, one.v) << threads << " threads: dv";
  }
}
TEST_F(Attention, BackwardIsBitwiseTheSameForAnyThreadCount) {
  // One long GQA document (many key blocks add into every query tile), several documents, and
  // separate keys with a window (a later key block may cost more than an earlier one).
  const Case gqa{{0, 700}, 4, 1, 16, true};
  const Case docs{{0, 300, 301, 650}, 4, 2, 8, false};
  Case window{{0, 40, 400}, 2, 1, 8, false, {0, 40, 900}};
  window.window = 200;
  const longtron::testing::Bf16Here bf16;
  for (const Case& c : {gqa, docs, window}) {
    SCOPED_TRACE(describe(c));
    expect_backward_independent_of_threads<double>(c, false);
    expect_backward_independent_of_threads<float>(c, false);
    if (bf16.runs()) expect_backward_independent_of_threads<float>(c, true);
  }
}

// varlen_attention_backward_add_dq (ring attention's later blocks) adds to dq exactly what the
// overwriting backward writes, as dq + scratch would in T: bitwise the same head columns, the pad
// columns and k/v's columns of a strided q untouched, dk and dv the same; float, double, bf16.
template <typename T>
void expect_add_dq_adds(const Case& c, bool bf16) {
  const BackwardCase<T> b(c, bf16, 51);
  const auto& [cc, in, dout, out, lse] = b;
  const Vec initd = random_vector(c.q_size(), 53);
  Inputs<T> over{std::vector<T>(c.q_size()), std::vector<T>(c.k_size()),
                 std::vector<T>(c.v_size())};
  Inputs<T> add{{initd.begin(), initd.end()}, std::vector<T>(c.k_size()),
                std::vector<T>(c.v_size())};
  ops::varlen_attention_backward<T>(cc, over.qp(), over.kp(c), over.vp(c), dout.data(), in.qp(),
                                    in.kp(c), in.vp(c), out.data(), lse.data(), c.shape());
  ops::varlen_attention_backward_add_dq<T>(cc, add.qp(), add.kp(c), add.vp(c), dout.data(), in.qp(),
                                           in.kp(c), in.vp(c), out.data(), lse.data(), c.shape());
  const int64_t w = c.heads * c.d;
  for (int64_t n = 0; n < c.tokens(); ++n)
    for (int64_t x = 0; x < c.q_stride(); ++x) {
      const size_t i = static_cast<size_t>(n * c.q_stride() + x);
      const T init = static_cast<T>(initd[i]);
      if (x < w) {
        ASSERT_EQ(add.q[i], static_cast<T>(init + over.q[i])) << n << " " << x;
      } else if (c.k_size() != 0) {  // q's pad columns: nobody writes them
        ASSERT_EQ(add.q[i], init) << n << " " << x;
      }
    }
  if (c.k_size() != 0) {
    for (size_t i = 0; i < over.k.size(); ++i) ASSERT_EQ(add.k[i], over.k[i]) << i;
  }
  if (c.v_size() != 0) {
    for (size_t i = 0; i < over.v.size(); ++i) ASSERT_EQ(add.v[i], over.v[i]) << i;
  }
}

TEST_F(Attention, BackwardAddDqAddsWhatBackwardWrites) {
  Case offsets{{0, 70, 150, 154}, 4, 2, 8, true, {0, 130, 230, 240}};  // strided q with pad columns
  offsets.key_offsets = {200, 70, -2};  // two queries see nothing: nothing is added to theirs
  const Case docs{{0, 300, 301, 650}, 4, 2, 8, false};
  const longtron::testing::Bf16Here bf16;
  for (const Case& c : {offsets, docs}) {
    SCOPED_TRACE(describe(c));
    expect_add_dq_adds<double>(c, false);
    expect_add_dq_adds<float>(c, false);
    if (bf16.runs()) expect_add_dq_adds<float>(c, true);
  }
}

// The overwriting backward writes every element of dq it owns, also where a segment has queries
// and no key at all (no key block: no work item writes its tiles) or where its queries see none
// of its keys: dq filled with NaN beforehand comes out as with zeros, and 0 there.
template <typename T>
void expect_dq_overwritten(const Case& c, bool bf16) {
  const BackwardCase<T> b(c, bf16, 61);
  const auto& [cc, in, dout, out, lse] = b;
  std::vector<std::vector<T>> dq;
  for (const T fill : {T(0), std::numeric_limits<T>::quiet_NaN()}) {
    Inputs<T> g{std::vector<T>(c.q_size(), fill), std::vector<T>(c.k_size()),
                std::vector<T>(c.v_size())};
    ops::varlen_attention_backward<T>(cc, g.qp(), g.kp(c), g.vp(c), dout.data(), in.qp(),
                                      in.kp(c), in.vp(c), out.data(), lse.data(), c.shape());
    dq.push_back(g.q);
  }
  const int64_t w = c.heads * c.d;
  for (int64_t n = 0; n < c.tokens(); ++n)
    for (int64_t x = 0; x < w; ++x) {
      const size_t i = static_cast<size_t>(n * c.q_stride() + x);
      const auto bits = [](T v) { return std::bit_cast<uint64_t>(double(v)); };
      ASSERT_EQ(bits(dq[1][i]), bits(dq[0][i])) << n << " " << x;
      if (n < c.cu_seqlens[2]) {
        ASSERT_EQ(dq[1][i], T(0)) << n << " " << x;
      }
    }
}

TEST_F(Attention, BackwardOverwritesTheDqOfQueriesWithoutKeys) {
  // Segment 0: 5 queries and no key; segment 1: 3 queries that see none of their 10 keys
  // (offset −3); segment 2: 70 queries that see keys.
  Case c{{0, 5, 8, 78}, 4, 2, 8, false, {0, 0, 10, 100}};
  c.key_offsets = {0, -3, 20};
  const longtron::testing::Bf16Here bf16;
  expect_dq_overwritten<double>(c, false);
  expect_dq_overwritten<float>(c, false);
  if (bf16.runs()) expect_dq_overwritten<float>(c, true);
}

// The pair count the FLOP and cost models use, against counting the mask pair by pair.
TEST(AttentionPairs, VisiblePairsCountsTheMask) {
  for (int64_t len : {0, 1, 2, 7, 64, 100}) {
    for (int64_t w : {0, 1, 3, 64, 99, 100, 500}) {
      int64_t pairs = 0;
      for (int64_t r = 0; r < len; ++r)
        for (int64_t c = 0; c <= r; ++c) pairs += (w == 0 || r - w < c) ? 1 : 0;
      EXPECT_EQ(ops::visible_pairs(len, w), pairs) << "len " << len << " window " << w;
    }
  }
}

TEST_F(Attention, RejectsBadKeySegmentsAndWindows) {
  const Case c{{0, 2, 4}, 2, 1, 4, false, {0, 3, 6}};
  const Inputs<double> in = make_inputs(c, 1);
  Vec out(4 * 2 * 4), lse(2 * 4);
  auto fails = [&](const ops::AttentionShape& s, const std::string& message) {
    try {
      ops::varlen_attention_forward<double>(out.data(), lse.data(), in.q.data(), in.k.data(),
                                            in.v.data(), s);
      ADD_FAILURE() << "no error, expected: " << message;
    } catch (const longtron::Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  ops::AttentionShape s = c.shape();
  s.num_kv_tokens = 5;
  fails(s, "cu_seqlens_k ends at 6 but there are 5");
  s = c.shape();
  const std::vector<int32_t> not_zero = {1, 3, 6};
  s.cu_seqlens_k = not_zero.data();
  fails(s, "cu_seqlens_k[0] must be 0");
  const std::vector<int32_t> decreasing = {0, 4, 3};
  s.cu_seqlens_k = decreasing.data();
  s.num_kv_tokens = 3;
  fails(s, "non-decreasing");
  const std::vector<int32_t> short_keys = {0, 1, 6};  // segment 0: 2 queries, 1 key
  s.cu_seqlens_k = short_keys.data();
  s.num_kv_tokens = 6;
  fails(s, "segment 0 has 2 queries but only 1 keys");
  s = c.shape();
  s.window = -1;
  fails(s, "window must be >= 0");
  // The backward validates the same way.
  Vec dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  EXPECT_THROW(ops::varlen_attention_backward<double>(dq.data(), dk.data(), dv.data(), out.data(),
                                                      in.q.data(), in.k.data(), in.v.data(),
                                                      out.data(), lse.data(), s),
               longtron::Error);
}

// ---- bf16 kernel (AVX512-BF16, or its emulation) ----------------------------------------------

namespace {

double round_bf16(double x) {
  using longtron::safetensors::bf16_to_float;
  using longtron::safetensors::float_to_bf16;
  return bf16_to_float(float_to_bf16(static_cast<float>(x)));
}

struct MaxError {
  double worst = 0;
  void add(const std::vector<float>& got, const Vec& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // Equal values (an lse of −inf for a query that sees no key) agree; a NaN never does.
      const double e = got[i] == want[i] ? 0.0 : std::abs(got[i] - want[i]);
      worst = std::max(worst, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
    }
  }
};

// The float kernel under a kBFloat16 compute type against the double kernel on the same inputs
// rounded to bf16 (q, k, v, dout): what remains is the bf16 rounding of P and dS as product
// inputs (relative 2⁻⁹ each) and fp32 accumulation. Inputs are N(0, 1), so out, dq, dk, dv are
// O(1). Largest errors measured on these cases: 2.9e-3 (out, lse) and 1.1e-2 (gradients, which
// sum up to G·L products of rounded dS); the bounds are about 3× that.
void expect_bf16_matches_double(const Case& c, double* out_err, double* grad_err) {
  Inputs<double> in = make_inputs(c, 51);
  for (auto* v : {&in.q, &in.k, &in.v})
    for (double& x : *v) x = round_bf16(x);
  Vec dout = random_vector(c.tokens() * c.heads * c.d, 52);
  for (double& x : dout) x = round_bf16(x);
  const Inputs<float> inf{{in.q.begin(), in.q.end()}, {in.k.begin(), in.k.end()},
                          {in.v.begin(), in.v.end()}};
  const std::vector<float> doutf(dout.begin(), dout.end());
  Vec out, lse;
  forward(out, lse, in, c);
  Inputs<double> g{Vec(c.q_size()), Vec(c.k_size()), Vec(c.v_size())};
  ops::varlen_attention_backward<double>(g.qp(), g.kp(c), g.vp(c), dout.data(), in.qp(),
                                         in.kp(c), in.vp(c), out.data(), lse.data(), c.shape());
  std::vector<float> outf, lsef;
  Inputs<float> gf{std::vector<float>(c.q_size()), std::vector<float>(c.k_size()),
                   std::vector<float>(c.v_size())};
  {
    const ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
    forward(outf, lsef, inf, c, bf16);
    ops::varlen_attention_backward<float>(bf16, gf.qp(), gf.kp(c), gf.vp(c), doutf.data(), inf.qp(),
                                          inf.kp(c), inf.vp(c), outf.data(), lsef.data(),
                                          c.shape());
  }
  MaxError fwd, bwd;
  fwd.add(outf, out);
  fwd.add(lsef, lse);
  bwd.add(gf.q, g.q);
  bwd.add(gf.k, g.k);
  bwd.add(gf.v, g.v);
  *out_err = std::max(*out_err, fwd.worst);
  *grad_err = std::max(*grad_err, bwd.worst);
}

}  // namespace

TEST_F(Attention, Bf16KernelMatchesDoubleOnRoundedInputs) {
  const longtron::testing::Bf16Here bf16;
  if (!bf16.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  ASSERT_EQ(ops::attention_bf16_native(), bf16.native());
  double out_err = 0, grad_err = 0;
  expect_bf16_matches_double({{0, 200, 330}, 8, 2, 64, true}, &out_err, &grad_err);
  expect_bf16_matches_double({{0, 150}, 4, 2, 128, false}, &out_err, &grad_err);
  // 128-key backward blocks: a query block meeting the causal edge in either half, a window
  // ending inside a block, more keys than queries (bottom-right aligned).
  expect_bf16_matches_double({{0, 130, 390}, 4, 1, 64, false, {0, 200, 460}, 70}, &out_err,
                             &grad_err);
  expect_bf16_matches_double({{0, 257}, 6, 3, 64, true, {}, 100}, &out_err, &grad_err);
  // An odd row count per tile (3 query heads, 65 and 65 queries: the last row pairs with zeros),
  // and key offsets as ring attention passes them: a segment whose queries see no key at all
  // (out 0, lse −inf, dq 0), one that starts seeing keys inside its first query block.
  expect_bf16_matches_double({{0, 65, 130}, 3, 1, 64, false}, &out_err, &grad_err);
  expect_bf16_matches_double({{0, 4, 134}, 4, 2, 64, false, {0, 10, 150}, 0, {-5, -20}},
                             &out_err, &grad_err);
  std::mt19937 rng(10);
  for (int trial = 0; trial < 24; ++trial) {
    const Case c = random_case(rng, trial % 2 == 0);
    SCOPED_TRACE(describe(c));
    expect_bf16_matches_double(c, &out_err, &grad_err);
  }
  std::printf("bf16 attention vs double on rounded inputs: max |error| out/lse %.2e, grads %.2e\n",
              out_err, grad_err);
  EXPECT_LT(out_err, 1e-2);
  EXPECT_LT(grad_err, 3e-2);
  EXPECT_GT(out_err, 1e-4);  // the bf16 products really ran (fp32 agrees to ~1e-6 here)
}

namespace {

// Everything one kernel computes on a case: out, lse, then dq, dk, dv of the overwriting backward
// and the dq of the adding one (into a dq of ones).
using Bf16Forward = void (*)(float*, float*, const float*, const float*, const float*,
                             const ops::AttentionShape&);
using Bf16Backward = void (*)(float*, float*, float*, const float*, const float*, const float*,
                              const float*, const float*, const float*,
                              const ops::AttentionShape&, bool);
std::vector<std::vector<float>> bf16_results(const Case& c, Bf16Forward fwd, Bf16Backward bwd) {
  const Inputs<double> ind = make_inputs(c, 81);
  const Inputs<float> in{{ind.q.begin(), ind.q.end()}, {ind.k.begin(), ind.k.end()},
                         {ind.v.begin(), ind.v.end()}};
  const Vec doutd = random_vector(c.tokens() * c.heads * c.d, 82);
  const std::vector<float> dout(doutd.begin(), doutd.end());
  std::vector<float> out(c.tokens() * c.heads * c.d), lse(c.heads * c.tokens());
  fwd(out.data(), lse.data(), in.qp(), in.kp(c), in.vp(c), c.shape());
  std::vector<std::vector<float>> all = {out, lse};
  for (const bool add : {false, true}) {
    Inputs<float> g{std::vector<float>(c.q_size(), add ? 1.0f : 0.0f),
                    std::vector<float>(c.k_size()), std::vector<float>(c.v_size())};
    bwd(g.qp(), g.kp(c), g.vp(c), dout.data(), in.qp(), in.kp(c), in.vp(c), out.data(),
        lse.data(), c.shape(), add);
    for (auto* x : {&g.q, &g.k, &g.v}) all.push_back(*x);
  }
  return all;
}

}  // namespace

// The kernel with its bf16 instructions emulated in AVX-512F (the path of a CPU without
// AVX512-BF16) gives the native kernel's bits on vdpbf16ps: outputs, lse and gradients, on shapes
// that reach every tile path (odd row counts, causal edges in either half of a key block, windows,
// separate keys with offsets, strided views, head_dim 64, 128 and odd ones). AMX tiles sum in
// another order, so there the comparison needs them hidden (a ctest entry runs it so).
TEST_F(Attention, Bf16EmulationGivesTheNativeKernelsBits) {
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "no AVX512-BF16 to compare with";
  if (longtron::ops::detail::native::amx_available())
    GTEST_SKIP() << "AMX tiles run: compare under LONGTRON_CPU_FEATURES_MASK=amx_bf16";
  std::vector<Case> cases = {{{0, 200, 330}, 8, 2, 64, true},
                             {{0, 150}, 4, 2, 128, false},
                             {{0, 130, 390}, 4, 1, 64, false, {0, 200, 460}, 70},
                             {{0, 257}, 6, 3, 64, true, {}, 100},
                             {{0, 65, 130}, 3, 1, 64, false},
                             {{0, 4, 134}, 4, 2, 64, false, {0, 10, 150}, 0, {-5, -20}}};
  std::mt19937 rng(12);
  for (int trial = 0; trial < 12; ++trial) cases.push_back(random_case(rng, trial % 2 == 0));
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    namespace d = longtron::ops::detail;
    const auto native = bf16_results(c, d::native::varlen_attention_forward_bf16,
                                     d::native::varlen_attention_backward_bf16);
    const auto emulated = bf16_results(c, d::emulated::varlen_attention_forward_bf16,
                                       d::emulated::varlen_attention_backward_bf16);
    const char* names[] = {"out", "lse", "dq", "dk", "dv", "dq (add)", "dk (add)", "dv (add)"};
    for (size_t i = 0; i < native.size(); ++i) {
      ASSERT_EQ(native[i].size(), emulated[i].size());
      for (size_t j = 0; j < native[i].size(); ++j)
        ASSERT_EQ(std::bit_cast<uint32_t>(native[i][j]), std::bit_cast<uint32_t>(emulated[i][j]))
            << names[i] << " element " << j;
    }
  }
}

TEST_F(Attention, FloatStaysFp32WithoutBf16ComputeType) {
  // The default compute type is float32: results equal the fp32 kernel's, bit for bit, whatever
  // the CPU; under kBFloat16 on a CPU without AVX512-BF16 the fp32 kernel runs too.
  const Case c{{0, 100, 170}, 4, 2, 16, true};
  const Inputs<double> in = make_inputs(c, 61);
  const Inputs<float> inf{{in.q.begin(), in.q.end()}, {}, {}};
  std::vector<float> out0, lse0, out1, lse1;
  forward(out0, lse0, inf, c);
  const ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  forward(out1, lse1, inf, c, bf16);
  if (ops::attention_bf16_runs()) {
    EXPECT_NE(out1, out0);
  } else {
    EXPECT_EQ(out1, out0);
  }
  forward(out1, lse1, inf, c);  // the context-free form: fp32 again
  EXPECT_EQ(out1, out0);
}

TEST_F(Attention, RejectsInconsistentShapes) {
  const Case c{{0, 5, 4}, 2, 1, 4, false};
  const Inputs<double> in = make_inputs({{0, 4}, 2, 1, 4, false}, 1);
  Vec out(4 * 2 * 4), lse(2 * 4);
  ops::AttentionShape s = c.shape();
  EXPECT_THROW(ops::varlen_attention_forward<double>(out.data(), lse.data(), in.q.data(),
                                                     in.k.data(), in.v.data(), s),
               longtron::Error);  // decreasing cu_seqlens
  const std::vector<int32_t> cu = {0, 3};
  s.cu_seqlens = cu.data();
  s.num_segments = 1;
  EXPECT_THROW(ops::varlen_attention_forward<double>(out.data(), lse.data(), in.q.data(),
                                                     in.k.data(), in.v.data(), s),
               longtron::Error);  // ends at 3 of 4 tokens
  s.num_tokens = 3;
  s.num_kv_heads = 3;
  EXPECT_THROW(ops::varlen_attention_forward<double>(out.data(), lse.data(), in.q.data(),
                                                     in.k.data(), in.v.data(), s),
               longtron::Error);  // 2 heads not a multiple of 3 kv heads
}

// The attention arenas grow to the largest call and are reused: attention_arena_bytes() holds at
// least the packed keys of a float forward, and a second call of the same shape allocates nothing.
TEST_F(Attention, ArenasGrowOnceAndAreCounted) {
  // One thread: with more, a worker that ran no item in the first call may grow its tiles later.
  const int threads = longtron::num_threads();
  longtron::set_num_threads(1);
  const Case c{{0, 300, 700}, 4, 2, 32, false};
  const Inputs<double> in = make_inputs(c, 3);
  const std::vector<float> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()),
      v(in.v.begin(), in.v.end());
  std::vector<float> out(static_cast<size_t>(c.tokens() * c.heads * c.d));
  std::vector<float> lse(static_cast<size_t>(c.tokens() * c.heads));
  const ops::AttentionShape s = c.shape();
  ops::varlen_attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  const int64_t after_first = ops::detail::attention_arena_bytes();
  // Packed Kᵀ and V: 2 · (key blocks · kv heads · head_dim · 64) floats at least.
  const int64_t key_blocks = (300 + 63) / 64 + (400 + 63) / 64;
  EXPECT_GE(after_first, int64_t(2 * key_blocks * c.kv_heads * c.d * 64 * sizeof(float)));
  ops::varlen_attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  EXPECT_EQ(ops::detail::attention_arena_bytes(), after_first);
  longtron::set_num_threads(threads);
}
