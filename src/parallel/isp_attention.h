// Ulysses attention for ISP (DeepSpeed-Ulysses, arXiv 2309.14509; InternEvo isp;
// XTuner sequence parallel, xtuner/parallel/sequence/attention.py; docs/isp.md): each rank holds
// its P/T tokens with every head; RoPE is applied locally (per token, with the split indexes), then
// one all-to-all over the TENSOR group scatters heads and gathers the sequence, so every rank holds
// the WHOLE row for Hq/T query heads (and their kv heads) and runs the local varlen attention over
// the GLOBAL cu_seqlens; a second all-to-all gathers heads and scatters the sequence back. Backward
// is the adjoint: the same two all-to-alls on the gradients.
//
// GQA: when T > Hkv (T divisible by Hkv) each kv head is repeated T/Hkv times consecutively so each
// rank gets one kv head (XTuner v1 / DeepSpeed ALST rule: minimal replication); the gradients of the
// copies are summed. Heads that cannot be divided are an Error naming both numbers.
//
// 2D-Attention (LoongTrain, arXiv 2406.18485; InternEvo sequence_2D): with a CONTEXT group of C
// ranks the all-to-all runs over the HEAD group (T = head_size × C), so after it a rank holds its
// context rank's share of the row (P/C positions, packing/context_split.h) for Hq/head_size heads,
// and the attention over the row is context parallel (cp_attention.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layers.h"
#include "model/model_config.h"
#include "parallel/cp_attention.h"

namespace longtron::parallel {

/// The head split of Ulysses attention: per rank hq_local query heads and hkv_local kv heads after
/// repetition by `repeat` (1 when T divides Hkv). Throws Error unless T divides Hq and (T divides
/// Hkv or Hkv divides T).
struct UlyssesHeads {
  int64_t hq, hkv, repeat, hq_local, hkv_local;
};
UlyssesHeads ulysses_heads(int64_t num_heads, int64_t num_kv_heads, int64_t T);

/// AttentionOp over local tokens [N, Q] (grouped qkv, full Q: the wqkv weight is gathered) with
/// AttentionBatch{indexes: local, cu_seqlens: global (last entry T·N), num_tokens: N local}.
/// Saved state per call: the gathered split qkv [T·N, hq_local + 2·hkv_local, d] and the gathered
/// attention output [T·N, hq_local, d]; lse [hq_local, T·N]. Collective over `tensor`.
class UlyssesAttention final : public model::AttentionOp<float> {
 public:
  /// Token-sized buffers between calls (the split qkv and the all-to-all order), shared by the
  /// attention ops of one model so they exist once, not once per layer.
  struct Scratch {
    std::vector<float> split, packed;
    std::shared_ptr<ContextScratch> context = std::make_shared<ContextScratch>();
  };
  /// `scratch` nullptr = buffers of its own. `tensor` is the HEAD group under 2D-Attention;
  /// `context` (nullptr = none) its CONTEXT group, whose ranks hold the shares of `balance`;
  /// `window`: the block's sliding window (0 = none); `options`: ring or all-gather context
  /// parallelism, the ring's layout, the kernels' precision and their query groups, which also
  /// apply without a context group (cp_attention.h).
  UlyssesAttention(const model::ModelConfig& config, comm::CommPtr tensor,
                   std::shared_ptr<Scratch> scratch = nullptr, comm::CommPtr context = nullptr,
                   data::ContextBalance balance = data::ContextBalance::kZigzag,
                   int64_t window = 0, ContextOptions options = {});
  /// The context-parallel attention (nullptr without a context group of more than one rank).
  const ContextAttention* context() const { return context_.get(); }
  int64_t qkv_features() const override { return q_; }
  int64_t out_features() const override { return h_.hq * d_; }
  int64_t saved_qkv_size(int64_t N) const override { return N * (T_ * local_ + h_.hq) * d_; }
  int64_t saved_lse_size(int64_t N) const override { return N * h_.hq; }
  void forward(float* out, float* saved_qkv, float* lse, const float* qkv,
               const model::AttentionBatch& b) override;
  void backward(float* dqkv, float* scratch, const float* dout, const float* saved_qkv,
                const float* out, const float* lse, const model::AttentionBatch& b) override;

 private:
  /// grouped [N, Q] ↔ split [N, q heads | k heads | v heads] (the dense op's head order).
  void permute(float* dst, const float* src, int64_t N, bool to_split) const;
  /// split [N, Q] → send order [N, T, local, d]: for rank j its q heads, then its (repeated) k
  /// and v heads. pack_back is the adjoint: copies q, SUMS the gradients of repeated kv copies.
  void pack(float* dst, const float* split, int64_t N) const;
  void pack_back(float* split, const float* src, int64_t N) const;
  model::AttentionBatch check_batch(const model::AttentionBatch& b) const;

  comm::CommPtr comm_;
  int64_t T_;
  UlyssesHeads h_;
  int64_t d_, q_, local_;  // head dim, full qkv features, local heads (q + 2 kv) after the swap
  model::ModelConfig config_;
  std::vector<double> inv_freq_;  // RoPE inverse frequencies (model/rope_scaling.h)
  int64_t window_;
  std::shared_ptr<Scratch> scratch_;
  const ops::ComputeContext* compute_;  // the kernels' precision (options.compute)
  int64_t group_tokens_;                // the kernels' query groups (options.group_tokens)
  int64_t C_ = 1;                                  // context ranks
  std::unique_ptr<ContextAttention> context_;      // nullptr when C = 1
};

}  // namespace longtron::parallel
