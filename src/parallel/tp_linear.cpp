// The one tensor-parallel linear (see tp_linear.h).
#include "parallel/tp_linear.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/scratch.h"

namespace longtron::parallel {
namespace {

// Chunk c of k over [0, n): [n·c/k, n·(c+1)/k) (the same on every rank: n and k are).
int64_t chunk_start(int64_t n, int64_t k, int64_t c) { return n * c / k; }

int size_of(const comm::CommPtr& c) { return c ? c->size() : 1; }

}  // namespace

TensorParallelLinear::TensorParallelLinear(int64_t in, int64_t out, TpLinearSpec spec,
                                           LinearShared shared, PairRole role)
    : in_(in), out_(out), spec_(std::move(spec)), shared_(std::move(shared)), role_(role) {
  spec_.chunks = std::max(1, spec_.chunks);
}

bool TensorParallelLinear::sharded_input() const {
  return size_of(spec_.gather) > 1 && spec_.input != SequenceParallel::kNone;
}

bool TensorParallelLinear::scattered_output() const {
  return size_of(spec_.reduce) > 1 && spec_.scatter_output;
}

int64_t TensorParallelLinear::rows(int64_t N, const comm::Communicator& c) const {
  check(N % c.size() == 0,
        "tensor parallel: the row's {} tokens are not divisible by the group size {} (the "
        "tensor-parallel size, or parallel.tensor_2d.x and .y, must divide the packed row length)",
        N, c.size());
  return N / c.size();
}

// Row chunks of the local input are gathered one at a time (async) while the previous chunk's
// GEMMs run; each gathered block also lands in the kept copy for backward.
void TensorParallelLinear::gather_input_overlapped(float* Y, const float* x, int64_t N,
                                                   const float* W) {
  comm::Communicator& ag = *spec_.gather;
  const int64_t nA = rows(N, ag), A = ag.size();
  const int64_t k = std::min<int64_t>(spec_.chunks, nA);
  const int64_t m_max = (nA + k - 1) / k;
  float* G = shared_.gathered->get(N * in_);
  float* recv[2] = {recv_[0].get(A * m_max * in_), recv_[1].get(A * m_max * in_)};
  comm::Work work = ag.all_gather_async(recv[0], x, chunk_start(nA, k, 1) * in_);
  for (int64_t c = 0; c < k; ++c) {
    const int64_t s = chunk_start(nA, k, c), m = chunk_start(nA, k, c + 1) - s;
    work.wait();
    if (c + 1 < k) {
      const int64_t s1 = chunk_start(nA, k, c + 1), m1 = chunk_start(nA, k, c + 2) - s1;
      work = ag.all_gather_async(recv[(c + 1) % 2], x + s1 * in_, m1 * in_);
    }
    const float* cur = recv[c % 2];
    for (int64_t a = 0; a < A; ++a) {
      float* dst = G + (a * nA + s) * in_;
      std::memcpy(dst, cur + a * m * in_, size_t(m * in_) * sizeof(float));
      ops::linear_forward(*spec_.compute, Y + (a * nA + s) * out_, dst, W,
                          static_cast<const float*>(nullptr), m,
                          in_, out_);
    }
  }
}

// The GEMM in row chunks: chunk c holds rows [s, s+m) of every destination's block, so its
// reduce-scatter (async, one in flight) gives this rank rows [s, s+m) of its output while the
// next chunk computes.
void TensorParallelLinear::matmul_reduce_scatter_overlapped(float* y, const float* X, int64_t N,
                                                            const float* W) {
  comm::Communicator& rs = *spec_.reduce;
  const int64_t nR = rows(N, rs), R = rs.size();
  const int64_t k = std::min<int64_t>(spec_.chunks, nR);
  const int64_t m_max = (nR + k - 1) / k;
  float* send[2] = {send_[0].get(R * m_max * out_), send_[1].get(R * m_max * out_)};
  comm::Work work;
  for (int64_t c = 0; c < k; ++c) {
    const int64_t s = chunk_start(nR, k, c), m = chunk_start(nR, k, c + 1) - s;
    float* buf = send[c % 2];
    for (int64_t j = 0; j < R; ++j)
      ops::linear_forward(*spec_.compute, buf + j * m * out_, X + (j * nR + s) * in_, W,
                          static_cast<const float*>(nullptr), m, in_, out_);
    work.wait();
    work = rs.reduce_scatter_async(y + s * out_, buf, m * out_);
  }
  work.wait();
}

void TensorParallelLinear::forward(float* y, const float* x, const float* W, const float* bias,
                                   int64_t N) {
  pair_order(shared_.pair->forward_rows, N, "forward");
  const bool gather = sharded_input(), scatter = scattered_output();
  const int64_t nR = scatter ? rows(N, *spec_.reduce) : N;
  if (gather) rows(N, *spec_.gather);
  // The product [N, out]: partial over `in` when |R| > 1; reduce-scattered from a scratch copy,
  // all-reduced (or, with no R, kept) in place.
  float* Y = scatter ? shared_.partial->get(N * out_) : y;
  const float* X = x;
  bool computed = false;
  if (gather && role_ != PairRole::kSecond && spec_.overlap == Overlap2D::kAgWithMatmul) {
    gather_input_overlapped(Y, x, N, W);
    computed = true;
  } else {
    X = gathered_input(x, N);
  }
  if (!computed && spec_.overlap == Overlap2D::kMatmulWithRs && scatter) {
    matmul_reduce_scatter_overlapped(y, X, N, W);
  } else {
    if (!computed)
      ops::linear_forward(*spec_.compute, Y, X, W, static_cast<const float*>(nullptr), N, in_, out_);
    if (scatter) spec_.reduce->reduce_scatter(y, Y, nR * out_);
    else if (size_of(spec_.reduce) > 1) spec_.reduce->all_reduce(y, N * out_);
  }
  // The bias once, after the reduction (before it, it would count |R| times).
  if (bias != nullptr)
    for (int64_t n = 0; n < nR; ++n)
      for (int64_t o = 0; o < out_; ++o) y[n * out_ + o] += bias[o];
}

bool TensorParallelLinear::writes_out16(const float* W, const float* bias) const {
  const ops::ComputeContext& cc = *spec_.compute;
  return bias == nullptr && cc.bf16() && size_of(spec_.reduce) <= 1 &&
         spec_.overlap == Overlap2D::kNone && cc.weights().of(W, out_ * in_) != nullptr;
}

void TensorParallelLinear::forward_out16(uint16_t* y16, const float* x, const float* W,
                                         int64_t N) {
  check(writes_out16(W, nullptr), "tensor parallel: forward_out16 on a linear whose output "
        "is not its own bf16 GEMM's (a bias, a reduction, an overlapped form or an fp32 context)");
  pair_order(shared_.pair->forward_rows, N, "forward");
  if (sharded_input()) rows(N, *spec_.gather);
  ops::linear_forward_out16(*spec_.compute, y16, gathered_input(x, N), W, N, in_, out_);
}

bool TensorParallelLinear::reads_input_bits_only(const ops::ComputeContext& cc) const {
  return &cc == spec_.compute && cc.bf16() && !sharded_input() &&
         spec_.overlap == Overlap2D::kNone;
}

const float* TensorParallelLinear::gathered_input(const float* x, int64_t N) {
  if (!sharded_input()) return x;
  if (role_ == PairRole::kSecond) return shared_.gathered->data();
  float* full = shared_.gathered->get(N * in_);
  spec_.gather->all_gather(full, x, rows(N, *spec_.gather) * in_);
  return full;
}

void TensorParallelLinear::pair_order(int64_t& pending, int64_t N, const char* pass) const {
  // The second of a pair reads what the first left in the shared buffers (the gathered input;
  // in backward, the partial input gradient it adds to and reduces): the first must have run
  // just before it with the same rows.
  if (role_ == PairRole::kFirst) {
    pending = N;
  } else if (role_ == PairRole::kSecond) {
    check(pending == N, "TensorParallelLinear: the second of a gate/up pair ran {} ({} rows) "
          "without the first just before it", pass, N);
    pending = -1;
  }
}

void TensorParallelLinear::backward(float* dx, float* dW, float* dbias, const float* dy,
                                    const float* x, const float* W, int64_t N,
                                    bool accumulate_dx) {
  pair_order(shared_.pair->backward_rows, N, "backward");
  const bool gather = sharded_input(), scatter = scattered_output();
  const int64_t nA = gather ? rows(N, *spec_.gather) : N;
  const int64_t nR = scatter ? rows(N, *spec_.reduce) : N;
  const float* X = x;
  if (gather) {
    float* full = shared_.gathered->get(N * in_);
    // FSP kept only the shard: gather it again (the second of a pair reuses the first's).
    if (spec_.input == SequenceParallel::kRegather && role_ != PairRole::kSecond)
      spec_.gather->all_gather(full, x, nA * in_);
    X = full;
  }
  const float* dY = dy;
  if (scatter) {
    float* full = shared_.dy_full->get(N * out_);
    spec_.reduce->all_gather(full, dy, nR * out_);
    dY = full;
  }
  comm::Work reduce;
  float* reduced = nullptr;  // where this rank's input gradient lands
  // A row linear's dX (no A) is this rank's whole input gradient: written in place, with no
  // staging buffer held for the run and no copy.
  const bool direct = role_ == PairRole::kAlone && size_of(spec_.gather) <= 1 && !accumulate_dx;
  if (dx != nullptr && direct) {
    ops::linear_input_grad(*spec_.compute, dx, dY, W, N, in_, out_, 0.0f);
  } else if (dx != nullptr) {
    // dX = dY·W is a partial sum over the output features each rank of A holds.
    float* part = shared_.dx_partial->get(N * in_);
    ops::linear_input_grad(*spec_.compute, part, dY, W, N, in_, out_,
                           role_ == PairRole::kSecond ? 1.0f : 0.0f);
    if (role_ != PairRole::kFirst) {
      reduced = part;
      if (gather) {
        reduced = shared_.reduced->get(nA * in_);
        reduce = spec_.gather->reduce_scatter_async(reduced, part, nA * in_);
      } else if (size_of(spec_.gather) > 1) {
        reduce = spec_.gather->all_reduce_async(part, N * in_);
      }
    }
  }
  // Overlapped with the input-gradient reduction.
  if (dW != nullptr) ops::linear_weight_grad(*spec_.compute, dW, dY, X, N, in_, out_);
  ops::bias_grad(dbias, dy, nR, out_);
  reduce.wait();
  if (reduced == nullptr) return;
  // The second of a pair carries both partial sums: it overwrites dx (the first wrote none).
  if (accumulate_dx && role_ == PairRole::kAlone) {
    for (int64_t i = 0; i < nA * in_; ++i) dx[i] += reduced[i];
  } else {
    std::memcpy(dx, reduced, size_t(nA * in_) * sizeof(float));
  }
}

TensorParallelLinearOp::TensorParallelLinearOp(const model::ParamTable& local, int weight,
                                               int bias, TpLinearSpec spec, LinearShared shared,
                                               PairRole role)
    : weight_(weight), bias_(bias),
      linear_(local.view(weight).shape[1], local.view(weight).shape[0], std::move(spec),
              std::move(shared), role) {}

void TensorParallelLinearOp::forward(float* y, const float* x, int64_t N,
                                     const model::Params<float>& p) {
  linear_.forward(y, x, p.ptr(weight_), p.ptr(bias_), N);
}

void TensorParallelLinearOp::backward(float* dx, const float* dy, const float* x, int64_t N,
                                      const model::Params<float>& p, model::Params<float>* g,
                                      bool accumulate_dx) {
  linear_.backward(dx, g != nullptr ? g->ptr(weight_) : nullptr,
                   g != nullptr ? g->ptr(bias_) : nullptr, dy, x, p.ptr(weight_), N,
                   accumulate_dx);
}

TensorParallelGateUp::TensorParallelGateUp(const model::ParamTable& local, int w1, int w3,
                                           int b1, int b3, const TpLinearSpec& spec,
                                           LinearShared shared)
    : w1_(w1), w3_(w3), b1_(b1), b3_(b3),
      gate_(local.view(w1).shape[1], local.view(w1).shape[0], spec, shared, PairRole::kFirst),
      up_(local.view(w3).shape[1], local.view(w3).shape[0], spec, shared, PairRole::kSecond) {}

void TensorParallelGateUp::forward(float* a, float* b, const float* x, int64_t N,
                                   const model::Params<float>& p) {
  gate_.forward(a, x, p.ptr(w1_), p.ptr(b1_), N);
  up_.forward(b, x, p.ptr(w3_), p.ptr(b3_), N);  // reuses the gate's gathered input
}

bool TensorParallelGateUp::forward_out16(uint16_t* a16, uint16_t* b16, const float* x,
                                         int64_t N, const model::Params<float>& p) {
  if (!gate_.writes_out16(p.ptr(w1_), p.ptr(b1_)) || !up_.writes_out16(p.ptr(w3_), p.ptr(b3_)))
    return false;
  gate_.forward_out16(a16, x, p.ptr(w1_), N);
  up_.forward_out16(b16, x, p.ptr(w3_), N);  // reuses the gate's gathered input
  return true;
}

void TensorParallelGateUp::backward(float* dx, const float* da, const float* db, const float* x,
                                    int64_t N, const model::Params<float>& p,
                                    model::Params<float>* g) {
  // The gate leaves its partial dX in the shared buffer; the up projection adds its own and
  // reduces the sum once into dx.
  gate_.backward(dx, g != nullptr ? g->ptr(w1_) : nullptr, g != nullptr ? g->ptr(b1_) : nullptr,
                 da, x, p.ptr(w1_), N, false);
  up_.backward(dx, g != nullptr ? g->ptr(w3_) : nullptr, g != nullptr ? g->ptr(b3_) : nullptr, db,
               x, p.ptr(w3_), N, false);
}

}  // namespace longtron::parallel
