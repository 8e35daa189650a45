// Varlen attention: forward against an explicit masked softmax in double, backward against
// central finite differences in double, float against double, on the layouts the model uses
// (dense q/k/v and q/k/v strided inside one packed qkv buffer), MHA and GQA, one long document
// (several 64-token blocks), many short ones, length-1 and empty segments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/threads.h"
#include "fd_check.h"
#include "ops/ops.h"

namespace ops = longtron::ops;
using longtron::testing::dot;
using longtron::testing::expect_fd;
using longtron::testing::random_vector;
using Vec = std::vector<double>;

namespace {

struct Case {
  std::vector<int32_t> cu_seqlens;
  int64_t heads, kv_heads, d;
  bool packed;  // q, k, v inside one [N, (heads + 2·kv_heads)·d] buffer
  int64_t tokens() const { return cu_seqlens.back(); }
  int64_t width() const { return packed ? (heads + 2 * kv_heads) * d : 0; }
  int64_t q_size() const { return tokens() * (packed ? width() : heads * d); }
  int64_t kv_size() const { return packed ? 0 : tokens() * kv_heads * d; }
  ops::AttentionShape shape() const {
    return {tokens(), heads, kv_heads, d,
            packed ? width() : heads * d, packed ? width() : kv_heads * d,
            cu_seqlens.data(), static_cast<int64_t>(cu_seqlens.size()) - 1,
            1.0 / std::sqrt(static_cast<double>(d))};
  }
};

// Inputs of one case: for a packed case everything lives in `q` and k, v are offsets into it.
template <typename T>
struct Inputs {
  std::vector<T> q, k, v;
  const T* qp() const { return q.data(); }
  const T* kp(const Case& c) const { return c.packed ? q.data() + c.heads * c.d : k.data(); }
  const T* vp(const Case& c) const {
    return c.packed ? q.data() + (c.heads + c.kv_heads) * c.d : v.data();
  }
};

Inputs<double> make_inputs(const Case& c, uint32_t seed) {
  return {random_vector(c.q_size(), seed), random_vector(c.kv_size(), seed + 1),
          random_vector(c.kv_size(), seed + 2)};
}

// Explicit masked softmax, one (token, head) at a time: the definition the kernel must meet.
void naive_attention(Vec& out, Vec& lse, const Inputs<double>& in, const Case& c) {
  const ops::AttentionShape s = c.shape();
  const int64_t N = c.tokens(), G = c.heads / c.kv_heads, d = c.d;
  out.assign(N * c.heads * d, 0.0);
  lse.assign(c.heads * N, 0.0);
  for (size_t seg = 0; seg + 1 < c.cu_seqlens.size(); ++seg) {
    for (int64_t n = c.cu_seqlens[seg]; n < c.cu_seqlens[seg + 1]; ++n) {
      for (int64_t h = 0; h < c.heads; ++h) {
        const double* qr = in.qp() + n * s.q_stride + h * d;
        std::vector<double> score;
        for (int64_t m = c.cu_seqlens[seg]; m <= n; ++m) {
          const double* kr = in.kp(c) + m * s.kv_stride + (h / G) * d;
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
          const double* vr = in.vp(c) + (c.cu_seqlens[seg] + j) * s.kv_stride + (h / G) * d;
          for (int64_t x = 0; x < d; ++x) out[(n * c.heads + h) * d + x] += p * vr[x];
        }
      }
    }
  }
}

template <typename T>
void forward(std::vector<T>& out, std::vector<T>& lse, const Inputs<T>& in, const Case& c) {
  out.assign(c.tokens() * c.heads * c.d, T(0));
  lse.assign(c.heads * c.tokens(), T(0));
  ops::varlen_attention_forward<T>(out.data(), lse.data(), in.qp(), in.kp(c), in.vp(c),
                                   c.shape());
}

void expect_matches_naive(const Case& c, double tol) {
  const Inputs<double> in = make_inputs(c, 11);
  Vec out, lse, ref_out, ref_lse;
  forward(out, lse, in, c);
  naive_attention(ref_out, ref_lse, in, c);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref_out[i], tol) << "out " << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref_lse[i], tol) << "lse " << i;
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
  Vec dq(c.q_size(), 123.0), dk(c.kv_size(), 123.0), dv(c.kv_size(), 123.0);
  double* dqp = dq.data();
  double* dkp = c.packed ? dq.data() + c.heads * c.d : dk.data();
  double* dvp = c.packed ? dq.data() + (c.heads + c.kv_heads) * c.d : dv.data();
  ops::varlen_attention_backward<double>(dqp, dkp, dvp, dout.data(), in.qp(), in.kp(c), in.vp(c),
                                         out.data(), lse.data(), s);
  expect_fd(in.q, dq, loss, c.packed ? "dqkv" : "dq", 1e-6, stride);
  if (!c.packed) {
    expect_fd(in.k, dk, loss, "dk", 1e-6, stride);
    expect_fd(in.v, dv, loss, "dv", 1e-6, stride);
  }
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
  Vec dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size());
  std::vector<float> dqf(c.q_size()), dkf(c.kv_size()), dvf(c.kv_size());
  auto grad_ptrs = [&](auto& q, auto& k, auto& v) {
    auto* base = q.data();
    return std::make_tuple(base, c.packed ? base + c.heads * c.d : k.data(),
                           c.packed ? base + (c.heads + c.kv_heads) * c.d : v.data());
  };
  auto [a, b, e] = grad_ptrs(dq, dk, dv);
  ops::varlen_attention_backward<double>(a, b, e, dout.data(), in.qp(), in.kp(c), in.vp(c),
                                         out.data(), lse.data(), s);
  auto [af, bf, ef] = grad_ptrs(dqf, dkf, dvf);
  ops::varlen_attention_backward<float>(af, bf, ef, doutf.data(), inf.qp(), inf.kp(c), inf.vp(c),
                                        outf.data(), lsef.data(), s);
  for (size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(dqf[i], dq[i], 1e-4) << "dq " << i;
  for (size_t i = 0; i < dk.size(); ++i) ASSERT_NEAR(dkf[i], dk[i], 1e-4) << "dk " << i;
  for (size_t i = 0; i < dv.size(); ++i) ASSERT_NEAR(dvf[i], dv[i], 1e-4) << "dv " << i;
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
