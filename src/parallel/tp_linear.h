// The one tensor-parallel linear of the engine: y = x·Wᵀ (+ b), W [out, in], parameterised by the
// group its input rows are gathered over, the group its partial outputs are reduced over and
// whether the gathered input is kept for backward. Megatron-LM's column and row parallel linears
// (megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication) and
// MindSpeed's 2D ParallelLinear2D (mindspeed/core/tensor_parallel/tp_2d; docs/tp2d.md) are all
// instances of it:
//
//   mode     linear              gather group A, input policy     reduce group R, output
//   MTP      column (wqkv,w1,w3)  TENSOR, kNone (replicated)       none
//            row (wo, w2)         none                             TENSOR, all-reduce
//   MSP/FSP  column               TENSOR, kKeepGathered/kRegather  none
//            row                  none                             TENSOR, reduce-scatter
//   2D x×y   wqkv, w1, w3         X, kKeepGathered                 Y, reduce-scatter
//            wo, w2               Y, kKeepGathered                 X, reduce-scatter
//
// Shapes (N = tokens of the whole row, |G| = 1 for an absent group):
//   weight  [out/|A|, in/|R|] shard (the plan cuts it), bias [out shard] added ONCE after the
//           reduction (its gradient is the sum over this rank's output rows; when those rows are
//           a shard the engine's plan SUMS it over R, Megatron's sequence_parallel params)
//   input   [N/|A|, in] rows block a = rank in A when the input is sharded, else [N, in]
//   output  [N/|R|, out] rows block r = rank in R when reduce-scattered, else [N, out]
//
// Forward:  all-gather the input over A (sharded input) → GEMM (partial over in when |R| > 1) →
//           reduce-scatter or all-reduce over R → + bias.
// Backward: all-gather dy over R (reduce-scattered output) → dX = dY·W (partial over out when
//           |A| > 1) → reduce-scatter (sharded input) or all-reduce (replicated input) over A,
//           issued asynchronously and overlapped with dW += dYᵀ·X and db (Megatron's
//           async allreduce_dgrad). kKeepGathered reuses the forward's gathered input; kRegather
//           (FSP) gathers the shard again (less memory, one all-gather more).
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
// shapes select the same kernel). 2D at x×1 is therefore MSP op for op.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layers.h"
#include "model/params.h"
#include "parallel/scratch.h"
#include "parallel/tp2d_overlap.h"
#include "parallel/vocab_parallel.h"

namespace longtron::parallel {

/// The groups and policies of one tensor-parallel linear (see the table above).
struct TpLinearSpec {
  comm::CommPtr gather;  ///< A: the input's rows (or, under kNone, its dX) over it; null = none
  /// kNone: input replicated over A (backward all-reduces dX); kKeepGathered / kRegather: input
  /// rows sharded over A, the gathered copy kept for backward / gathered again in backward.
  SequenceParallel input = SequenceParallel::kKeepGathered;
  comm::CommPtr reduce;         ///< R: sums the partial outputs; null = none
  bool scatter_output = true;   ///< reduce-scatter the output rows over R (else all-reduce)
  Overlap2D overlap = Overlap2D::kNone;
  int chunks = 4;  ///< row chunks of the overlapped forms (clamped to the rows available)
  /// The precision of the GEMMs (the engine's context; it must outlive the linear).
  const ops::ComputeContext* compute = &ops::ComputeContext::fp32();
};

/// Buffers of a tensor-parallel linear that others may share, owned by the caller so that it can
/// choose the sharing: the gathered input (kept for backward; one for the halves of a gate/up op,
/// Megatron's fused gate/up projection, or for all column linears under FSP), the partial input
/// gradient (which the halves of a gate/up op add into) and three buffers that hold data only
/// inside one call. A model shares all but the gathered input among its linears.
struct LinearShared {
  std::shared_ptr<Scratch> gathered = std::make_shared<Scratch>();
  std::shared_ptr<Scratch> dx_partial = std::make_shared<Scratch>();
  std::shared_ptr<Scratch> partial = std::make_shared<Scratch>();  ///< y before reduce-scatter
  std::shared_ptr<Scratch> dy_full = std::make_shared<Scratch>();  ///< backward: gathered dy
  std::shared_ptr<Scratch> reduced = std::make_shared<Scratch>();  ///< backward: reduced dx
  /// The rows the first of a pair last ran forward / backward with and the second has not yet
  /// consumed (-1: none): the check that a pair is called first, then second, with the same rows.
  struct PairCalls {
    int64_t forward_rows = -1, backward_rows = -1;
  };
  std::shared_ptr<PairCalls> pair = std::make_shared<PairCalls>();
  /// For another linear (or gate/up pair) of the same model: these per-call buffers and partial
  /// input gradient, with its own gathered input and call-order record.
  LinearShared for_another_linear() const {
    LinearShared s = *this;
    s.gathered = std::make_shared<Scratch>();
    s.pair = std::make_shared<PairCalls>();
    return s;
  }
};

/// kFirst/kSecond: the halves of TensorParallelGateUp, which share one gathered input (the second
/// neither gathers nor, in backward, reduces alone: it adds its partial input gradient to the
/// first's and reduces the sum once). The gate/up op calls first then second with the same input,
/// forward and backward; nothing else builds a pair. The second checks that the first ran just
/// before it (LinearShared::pair): calling them in the other order is an Error, not wrong data.
enum class PairRole { kAlone, kFirst, kSecond };

/// The linear on raw pointers (weights passed per call). Collective over A and R: every rank of
/// them calls in the same order. N must be divisible by |A| (sharded input) and |R| (scattered
/// output), else Error naming the sizes.
class TensorParallelLinear {
 public:
  /// in, out: the shapes of this rank's weight shard [out, in].
  TensorParallelLinear(int64_t in, int64_t out, TpLinearSpec spec, LinearShared shared = {},
                       PairRole role = PairRole::kAlone);
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  /// y (overwritten) from x; bias [out] or nullptr.
  void forward(float* y, const float* x, const float* W, const float* bias, int64_t N);
  /// Whether forward_out16 applies to these weights: a bf16 context holding W's bf16 copy, no
  /// bias, and an output that is this rank's GEMM result as it stands (no reduction over R, no
  /// overlapped form).
  bool writes_out16(const float* W, const float* bias) const;
  /// round_to_bf16 of forward's y into y16 (bits), written by the GEMM itself
  /// (ops::linear_forward_out16), no fp32 y. Error unless writes_out16(W, nullptr).
  void forward_out16(uint16_t* y16, const float* x, const float* W, int64_t N);
  /// Whether forward and backward read x only through its bf16 bits when `cc` shares them: x is
  /// the GEMMs' operand as it stands (not gathered, not split into overlapped chunks).
  bool reads_input_bits_only(const ops::ComputeContext& cc) const;
  /// dx overwritten (or += when accumulate_dx; a pair's second always overwrites, its first
  /// writes none); dW[out, in] and dbias[out] accumulate; any gradient may be nullptr. `x` is
  /// read only when the input is not gathered (A absent or kNone); kRegather gathers it again.
  void backward(float* dx, float* dW, float* dbias, const float* dy, const float* x,
                const float* W, int64_t N, bool accumulate_dx);

 private:
  bool sharded_input() const;
  bool scattered_output() const;
  /// The input rows the GEMM reads: x itself, or the gathered copy (gathered here, or by the
  /// first of a pair just before).
  const float* gathered_input(const float* x, int64_t N);
  int64_t rows(int64_t N, const comm::Communicator& c) const;
  void gather_input_overlapped(float* Y, const float* x, int64_t N, const float* W);
  void matmul_reduce_scatter_overlapped(float* y, const float* X, int64_t N, const float* W);
  /// Records (kFirst) or checks and clears (kSecond) `pending` = shared_.pair's rows of `pass`;
  /// throws longtron::Error when the second runs without the first just before it.
  void pair_order(int64_t& pending, int64_t N, const char* pass) const;

  int64_t in_, out_;
  TpLinearSpec spec_;
  LinearShared shared_;
  PairRole role_;
  Scratch recv_[2], send_[2];
};

/// The linear as a model::LinearOp over the views `weight` and `bias` (−1 = none) of `local`.
class TensorParallelLinearOp final : public model::LinearOp<float> {
 public:
  TensorParallelLinearOp(const model::ParamTable& local, int weight, int bias, TpLinearSpec spec,
                         LinearShared shared = {}, PairRole role = PairRole::kAlone);
  int64_t in() const override { return linear_.in(); }
  int64_t out() const override { return linear_.out(); }
  void forward(float* y, const float* x, int64_t N, const model::Params<float>& p) override;
  void backward(float* dx, const float* dy, const float* x, int64_t N,
                const model::Params<float>& p, model::Params<float>* g,
                bool accumulate_dx) override;
  bool reads_shared_input_bits_only(const ops::ComputeContext& cc) const override {
    return linear_.reads_input_bits_only(cc);
  }

 private:
  int weight_, bias_;
  TensorParallelLinear linear_;
};

/// The FFN's gate (w1) and up (w3) projections as one tensor-parallel op over the same spec: one
/// input gather and one reduction of the summed input gradient (Megatron-LM's fused linear_fc1).
class TensorParallelGateUp final : public model::GateUpOp<float> {
 public:
  /// w1, w3: view indices in `local` (same shard shape [F_local, in]); b1, b3: their biases
  /// [F_local] (Llama's mlp_bias) or -1.
  TensorParallelGateUp(const model::ParamTable& local, int w1, int w3, int b1, int b3,
                       const TpLinearSpec& spec, LinearShared shared = {});
  int64_t out() const override { return gate_.out(); }
  void forward(float* a, float* b, const float* x, int64_t N,
               const model::Params<float>& p) override;
  /// Both halves' GEMMs write a and b's bits where both can (TensorParallelLinear::writes_out16).
  bool forward_out16(uint16_t* a16, uint16_t* b16, const float* x, int64_t N,
                     const model::Params<float>& p) override;
  void backward(float* dx, const float* da, const float* db, const float* x, int64_t N,
                const model::Params<float>& p, model::Params<float>* g) override;

 private:
  int w1_, w3_, b1_, b3_;
  TensorParallelLinear gate_, up_;
};

}  // namespace longtron::parallel
