// The 2D tensor-parallel linear of MindSpeed's high-dimensional TP (MindSpeed's
// ParallelLinear2D, mindspeed/core/tensor_parallel/tp_2d; docs/tp2d.md).
//
// A linear y = x·Wᵀ (+ b), W [out, in], on a tensor group factored as x × y (x-groups consecutive
// ranks, y-groups stride x; comm/process_grid.h). Each linear has an all-gather group A and a
// reduce-scatter group R, one of them X and the other Y:
//
//   weight  [out/|A|, in/|R|]     out-block = rank in A, in-block = rank in R
//   bias    [out/|A|]             added ONCE after the reduce-scatter; its gradient is the sum over
//                                 this rank's N/|R| rows, SUMMED over R by the engine's plan
//   input   [N/|A|, in/|R|]       rows [a·N/|A|, (a+1)·N/|A|) of the row, a = rank in A
//   output  [N/|R|, out/|A|]      rows [r·N/|R|, (r+1)·N/|R|), r = rank in R
//
// The roles alternate so layouts chain with no re-sharding (docs/tp2d.md):
//   wqkv, w1, w3:  A = X, R = Y   input = residual layout [N/x, H/y] → output [N/y, out/x]
//   wo, w2:        A = Y, R = X   input [N/y, in/x] → output = residual layout [N/x, H/y]
// With y = 1 this is exactly Megatron TP + sequence parallel (MSP) with t = x.
//
// Forward:  all-gather the input over A (rows) → GEMM [N, out/|A|] (partial over in) →
//           reduce-scatter over R (rows). The gathered input is KEPT for backward (as MSP keeps
//           it), so backward needs no second all-gather of the input (the reference's MindSpeed
//           path re-gathers it: one AG(A) more per linear and less memory).
// Backward: all-gather dy over R → dX = dY·W [N, in/|R|] (partial over out) → reduce-scatter
//           over A, overlapped (async Work) with dW += dYᵀ·X and db.
// Collectives per linear and step: fwd AG_A(N/|A|·in/|R|) + RS_R(N·out/|A|);
//                                  bwd AG_R(N/|R|·out/|A|) + RS_A(N·in/|R|) (payload as
//                                  comm/communicator.h counts it: AG the send chunk, RS the whole
//                                  send buffer).
//
// Overlap (forward only, one option at a time as MindSpeed requires; parallel.tensor_2d.overlap):
//   kAgWithMatmul  the input all-gather is issued in row chunks; chunk c+1's all-gather (async)
//                  runs while chunk c's GEMMs compute (one collective in flight at a time);
//   kMatmulWithRs  the GEMM is computed in row chunks (for every destination rank of R at
//                  once), and chunk c's reduce-scatter (async) runs while chunk c+1 computes.
// Each output element is the same dot product whatever the chunking, but oneDNN picks its GEMM
// kernel and blocking by matrix shape, so the rows of a chunk GEMM may round differently from
// the same rows of the whole GEMM: results equal kNone to float rounding, not bit for bit
// (measured ≤ 5e-8 absolute on step-1 gradients of the parity tests; bit-identical where the
// shapes select the same kernel). kNone with y = 1 is bit-identical to MSP.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/layers.h"
#include "model/params.h"
#include "parallel/tp2d_overlap.h"

namespace longtron::parallel {


/// Buffers shared by linears that read the same input (w1 then w3, Megatron's fused gate/up
/// projection): the gathered input and the summed partial input gradient.
struct Linear2DShared {
  std::shared_ptr<std::vector<float>> gathered = std::make_shared<std::vector<float>>();
  std::shared_ptr<std::vector<float>> dx_partial = std::make_shared<std::vector<float>>();
};

/// kFirst/kSecond: a pair that shares one gathered input (the second neither gathers nor, in
/// backward, reduces alone: it adds its partial input gradient to the first's and reduce-scatters
/// the sum once). The model must call first then second with the same input, forward and backward.
enum class Pair2D { kAlone, kFirst, kSecond };

/// The 2D linear as a model::LinearOp: N passed to forward/backward is the tokens of the whole
/// row (divisible by |A| and |R|, else Error naming both).
class Linear2D final : public model::LinearOp<float> {
 public:
  /// weight/bias: view indices in `local` (bias −1 = none); ag = A group, rs = R group.
  /// `chunks` = row chunks of the overlapped forms (clamped to the rows available).
  Linear2D(const model::ParamLayout& local, int weight, int bias, comm::CommPtr ag,
           comm::CommPtr rs, Overlap2D overlap, Linear2DShared shared, Pair2D role,
           int chunks = 4);
  int64_t in() const override { return in_; }
  int64_t out() const override { return out_; }
  /// y[N/|R|, out/|A|] (overwritten) from x[N/|A|, in/|R|].
  void forward(float* y, const float* x, int64_t N, const model::Params<float>& p) override;
  /// dx[N/|A|, in/|R|] from dy[N/|R|, out/|A|]; dW, db accumulate. `x` is not read (the gathered
  /// copy of the forward is used).
  void backward(float* dx, const float* dy, const float* x, int64_t N,
                const model::Params<float>& p, model::Params<float>* g,
                bool accumulate_dx) override;

 private:
  void gather_input(const float* x, int64_t N);
  void gather_input_overlapped(float* Y, const float* x, int64_t N, const float* W);
  void matmul_reduce_scatter_overlapped(float* y, const float* X, int64_t N, const float* W);
  int64_t rows(int64_t N, const comm::Communicator& c) const;

  int weight_, bias_;
  int64_t out_, in_;
  comm::CommPtr ag_, rs_;
  Overlap2D overlap_;
  Linear2DShared shared_;
  Pair2D role_;
  int chunks_;
  std::vector<float> partial_, recv_[2], send_[2], dy_full_, scratch_;
};

}  // namespace longtron::parallel
