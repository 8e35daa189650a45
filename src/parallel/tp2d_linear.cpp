// The 2D tensor-parallel linear (see tp2d_linear.h).
#include "parallel/tp2d_linear.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/scratch.h"

namespace longtron::parallel {
namespace {

// Chunk c of k over [0, n): [n·c/k, n·(c+1)/k) (the same on every rank: n and k are).
int64_t chunk_start(int64_t n, int64_t k, int64_t c) { return n * c / k; }

}  // namespace

Linear2D::Linear2D(const model::ParamLayout& local, int weight, int bias, comm::CommPtr ag,
                   comm::CommPtr rs, Overlap2D overlap, Linear2DShared shared, Pair2D role,
                   int chunks)
    : weight_(weight), bias_(bias), out_(local.view(weight).shape[0]),
      in_(local.view(weight).shape[1]), ag_(std::move(ag)), rs_(std::move(rs)),
      overlap_(overlap), shared_(std::move(shared)), role_(role), chunks_(std::max(1, chunks)) {}

int64_t Linear2D::rows(int64_t N, const comm::Communicator& c) const {
  check(N % c.size() == 0,
        "2D tensor parallel: the row's {} tokens are not divisible by the group size {} "
        "(parallel.tensor_2d.x and .y must divide the packed row length)",
        N, c.size());
  return N / c.size();
}

void Linear2D::gather_input(const float* x, int64_t N) {
  float* X = ensure(*shared_.gathered, N * in_);
  ag_->all_gather(X, x, rows(N, *ag_) * in_);
}

// Row chunks of the local input are gathered one at a time (async) while the previous chunk's
// GEMMs run; each gathered block also lands in the kept copy for backward.
void Linear2D::gather_input_overlapped(float* Y, const float* x, int64_t N, const float* W) {
  const int64_t nA = rows(N, *ag_), A = ag_->size();
  const int64_t k = std::min<int64_t>(chunks_, nA);
  const int64_t m_max = (nA + k - 1) / k;
  float* G = ensure(*shared_.gathered, N * in_);
  float* recv[2] = {ensure(recv_[0], A * m_max * in_), ensure(recv_[1], A * m_max * in_)};
  comm::Work work = ag_->all_gather_async(recv[0], x, chunk_start(nA, k, 1) * in_);
  for (int64_t c = 0; c < k; ++c) {
    const int64_t s = chunk_start(nA, k, c), m = chunk_start(nA, k, c + 1) - s;
    work.wait();
    if (c + 1 < k) {
      const int64_t s1 = chunk_start(nA, k, c + 1), m1 = chunk_start(nA, k, c + 2) - s1;
      work = ag_->all_gather_async(recv[(c + 1) % 2], x + s1 * in_, m1 * in_);
    }
    const float* cur = recv[c % 2];
    for (int64_t a = 0; a < A; ++a) {
      float* dst = G + (a * nA + s) * in_;
      std::memcpy(dst, cur + a * m * in_, size_t(m * in_) * sizeof(float));
      ops::linear_forward(Y + (a * nA + s) * out_, dst, W, static_cast<const float*>(nullptr), m,
                          in_, out_);
    }
  }
}

// The GEMM in row chunks: chunk c holds rows [s, s+m) of every destination's block, so its
// reduce-scatter (async, one in flight) gives this rank rows [s, s+m) of its output while the
// next chunk computes.
void Linear2D::matmul_reduce_scatter_overlapped(float* y, const float* X, int64_t N,
                                                const float* W) {
  const int64_t nR = rows(N, *rs_), R = rs_->size();
  const int64_t k = std::min<int64_t>(chunks_, nR);
  const int64_t m_max = (nR + k - 1) / k;
  float* send[2] = {ensure(send_[0], R * m_max * out_), ensure(send_[1], R * m_max * out_)};
  comm::Work work;
  for (int64_t c = 0; c < k; ++c) {
    const int64_t s = chunk_start(nR, k, c), m = chunk_start(nR, k, c + 1) - s;
    float* buf = send[c % 2];
    for (int64_t j = 0; j < R; ++j)
      ops::linear_forward(buf + j * m * out_, X + (j * nR + s) * in_, W,
                          static_cast<const float*>(nullptr), m, in_, out_);
    work.wait();
    work = rs_->reduce_scatter_async(y + s * out_, buf, m * out_);
  }
  work.wait();
}

void Linear2D::forward(float* y, const float* x, int64_t N, const model::Params<float>& p) {
  const int64_t nR = rows(N, *rs_);
  rows(N, *ag_);
  const float* W = p.ptr(weight_);
  // The partial product [N, out/|A|]; with |R| = 1 it is the output itself.
  float* Y = rs_->size() == 1 ? y : ensure(partial_, N * out_);
  const float* X = x;
  bool computed = false;
  if (ag_->size() > 1) {
    if (role_ == Pair2D::kSecond) {
      X = shared_.gathered->data();
    } else if (overlap_ == Overlap2D::kAgWithMatmul) {
      gather_input_overlapped(Y, x, N, W);
      computed = true;
    } else {
      gather_input(x, N);
      X = shared_.gathered->data();
    }
  }
  if (!computed && overlap_ == Overlap2D::kMatmulWithRs && rs_->size() > 1) {
    matmul_reduce_scatter_overlapped(y, X, N, W);
  } else {
    if (!computed) ops::linear_forward(Y, X, W, static_cast<const float*>(nullptr), N, in_, out_);
    if (rs_->size() > 1) rs_->reduce_scatter(y, Y, nR * out_);
  }
  // The bias once, after the reduction (before it, it would count |R| times).
  if (bias_ >= 0) {
    const float* b = p.ptr(bias_);
    for (int64_t n = 0; n < nR; ++n)
      for (int64_t o = 0; o < out_; ++o) y[n * out_ + o] += b[o];
  }
}

void Linear2D::backward(float* dx, const float* dy, const float* x, int64_t N,
                        const model::Params<float>& p, model::Params<float>* g,
                        bool accumulate_dx) {
  const int64_t nA = rows(N, *ag_), nR = rows(N, *rs_);
  const float* W = p.ptr(weight_);
  const float* X = ag_->size() == 1 ? x : shared_.gathered->data();
  const float* dY = dy;
  if (rs_->size() > 1) {
    float* full = ensure(dy_full_, N * out_);
    rs_->all_gather(full, dy, nR * out_);
    dY = full;
  }
  comm::Work reduce;
  float* reduced = nullptr;  // where this rank's input gradient lands
  if (dx != nullptr) {
    float* part = ensure(*shared_.dx_partial, N * in_);
    ops::gemm<float>(false, false, N, in_, out_, 1.0f, dY, W,
                     role_ == Pair2D::kSecond ? 1.0f : 0.0f, part);
    if (role_ != Pair2D::kFirst) {
      if (ag_->size() == 1) {
        reduced = part;
      } else {
        reduced = ensure(scratch_, nA * in_);
        reduce = ag_->reduce_scatter_async(reduced, part, nA * in_);
      }
    }
  }
  if (g != nullptr) {  // overlapped with the input-gradient reduce-scatter
    ops::linear_weight_grad(g->ptr(weight_), dY, X, N, in_, out_);
    if (bias_ >= 0) ops::bias_grad(g->ptr(bias_), dy, nR, out_);
  }
  reduce.wait();
  if (reduced == nullptr) return;
  // The second of a pair carries both partial sums: it overwrites dx (the first wrote none).
  if (accumulate_dx && role_ == Pair2D::kAlone) {
    for (int64_t i = 0; i < nA * in_; ++i) dx[i] += reduced[i];
  } else {
    std::memcpy(dx, reduced, size_t(nA * in_) * sizeof(float));
  }
}

}  // namespace longtron::parallel
