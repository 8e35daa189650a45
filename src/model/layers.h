// The replaceable pieces of the decoder: linear, attention, embedding and head+loss ops.
// The model is written against these interfaces only; the single-process (dense) versions live
// here, and a parallel build passes sharded versions (column/row/ISP linears, Ulysses attention,
// vocab-parallel embedding and cross-entropy) chosen once when the model is built.
// Sizes an op reports (in/out features, local heads) are LOCAL sizes, so buffers follow shards.
// Backward conventions follow ops.h: input gradients are overwritten (or accumulated when asked),
// parameter gradients accumulate (+=) and are skipped when the gradient buffer is nullptr.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/grow_buffer.h"
#include "model/params.h"
#include "ops/compute_context.h"
#include "ops/gemm_packing.h"

namespace longtron::model {

/// A linear layer y = x·Wᵀ (+ b), W in HF layout [out, in].
template <typename T>
class LinearOp {
 public:
  virtual ~LinearOp() = default;
  /// Local input / output features.
  virtual int64_t in() const = 0;
  virtual int64_t out() const = 0;
  /// y[N, out] = x[N, in]·Wᵀ + b (y overwritten).
  virtual void forward(T* y, const T* x, int64_t N, const Params<T>& params) = 0;
  /// dx[N, in] = dy·W (overwritten, or added when accumulate_dx); dW += dyᵀ·x, db += Σₙ dy
  /// (skipped when grads is nullptr).
  virtual void backward(T* dx, const T* dy, const T* x, int64_t N, const Params<T>& params,
                        Params<T>* grads, bool accumulate_dx) = 0;
  /// Where the op can (a float model under bf16, no bias, y whole on this rank from one GEMM):
  /// round_to_bf16 of forward's y into y16 [N, out()] without writing y in fp32, returning true;
  /// for an output read only in bf16. The default writes nothing and returns false. An op gives
  /// the same answer on every call (it depends on the op, not the data).
  virtual bool forward_out16(uint16_t* y16, const T* x, int64_t N, const Params<T>& params) {
    (void)y16, (void)x, (void)N, (void)params;
    return false;
  }
  /// Whether forward and backward read an input whose bf16 bits are shared with `cc`
  /// (ops::SharedRoundings) through those bits only, never its floats: a producer may then write
  /// the bits alone. The default (an op that may read the floats) is false.
  virtual bool reads_shared_input_bits_only(const ops::ComputeContext& cc) const {
    (void)cc;
    return false;
  }
};

/// The gated FFN's gate and up projections, which read the same input: a[N, F] = x·W1ᵀ and
/// b[N, F] = x·W3ᵀ (Megatron-LM's fused linear_fc1 of gated MLPs). One op, so that a tensor-parallel
/// form gathers the input once and reduces the summed input gradient once.
template <typename T>
class GateUpOp {
 public:
  virtual ~GateUpOp() = default;
  /// Local features F of a and b.
  virtual int64_t out() const = 0;
  /// a and b (overwritten) from x.
  virtual void forward(T* a, T* b, const T* x, int64_t N, const Params<T>& params) = 0;
  /// Where the op can (a float model under bf16 whose GEMMs write a and b whole on this rank):
  /// round_to_bf16 of forward's a and b into a16, b16 [N, out()] without writing a and b in
  /// fp32, returning true; for a and b read only in bf16. The default writes nothing and returns
  /// false (the caller then runs forward).
  virtual bool forward_out16(uint16_t* a16, uint16_t* b16, const T* x, int64_t N,
                             const Params<T>& params) {
    (void)a16, (void)b16, (void)x, (void)N, (void)params;
    return false;
  }
  /// dx = da·W1 + db·W3 (overwritten); dW1 += daᵀ·x, dW3 += dbᵀ·x (skipped when grads is nullptr).
  virtual void backward(T* dx, const T* da, const T* db, const T* x, int64_t N,
                        const Params<T>& params, Params<T>* grads) = 0;
};

/// Gate/up as two independent linears (each computes, and if parallel reduces, its own part).
template <typename T>
class SeparateGateUp final : public GateUpOp<T> {
 public:
  SeparateGateUp(std::unique_ptr<LinearOp<T>> w1, std::unique_ptr<LinearOp<T>> w3)
      : w1_(std::move(w1)), w3_(std::move(w3)) {}
  int64_t out() const override { return w1_->out(); }
  void forward(T* a, T* b, const T* x, int64_t N, const Params<T>& params) override {
    w1_->forward(a, x, N, params);
    w3_->forward(b, x, N, params);
  }
  bool forward_out16(uint16_t* a16, uint16_t* b16, const T* x, int64_t N,
                     const Params<T>& params) override {
    if (!w1_->forward_out16(a16, x, N, params)) return false;
    check(w3_->forward_out16(b16, x, N, params),
          "gate/up: the up projection cannot write bf16 where the gate projection did");
    return true;
  }
  void backward(T* dx, const T* da, const T* db, const T* x, int64_t N, const Params<T>& params,
                Params<T>* grads) override {
    w1_->backward(dx, da, x, N, params, grads, false);
    w3_->backward(dx, db, x, N, params, grads, true);
  }

 private:
  std::unique_ptr<LinearOp<T>> w1_, w3_;
};

/// RMSNorm over the hidden features of each token: out = x / sqrt(mean(x²) + eps) ⊙ w. A 2D
/// tensor-parallel version all-reduces the sum of squares over its y group (docs/tp2d.md).
template <typename T>
class NormOp {
 public:
  virtual ~NormOp() = default;
  /// out[N, H] (overwritten) and rstd[N] (saved for backward).
  virtual void forward(T* out, T* rstd, const T* x, int64_t N, const Params<T>& params) = 0;
  /// forward, and where the op can in the same pass (a float model, out[N, H] whole on this
  /// rank) also round_to_bf16 of out into out16[N, H]: returns whether it did. The default
  /// only runs forward.
  virtual bool forward_rounded(T* out, uint16_t* out16, T* rstd, const T* x, int64_t N,
                               const Params<T>& params) {
    (void)out16;
    forward(out, rstd, x, N, params);
    return false;
  }
  /// dx[N, H] overwritten; dweight += (skipped when grads is nullptr).
  virtual void backward(T* dx, const T* dout, const T* x, const T* rstd, int64_t N,
                        const Params<T>& params, Params<T>* grads) = 0;
};

/// Per-head RMSNorm of the query and key heads of the grouped qkv rows (Qwen3Attention's q_norm
/// and k_norm, Transformers' modeling_qwen3.py): after the wqkv projection, before RoPE, each q
/// head becomes q / sqrt(mean(q²) + eps) ⊙ w_q and each k head likewise with w_k (one weight
/// [head_dim] each, shared by all heads); v is left as it is. It acts on the local rows of
/// whole heads, [Hkv_local, Hq/Hkv + 2, d] per token (docs/model.md), so every layout's qkv
/// (all heads of local tokens, or local heads of all tokens) takes the same op; a layout whose
/// heads or tokens are split sums the weight gradients over that group.
template <typename T>
class QkNorm {
 public:
  /// Weights q_norm, k_norm of `layout` (eps model.norm_eps); q_heads, kv_heads: the local heads;
  /// row_split: a call of N tokens holds N / row_split qkv rows (2D tensor parallel's y split).
  QkNorm(const ParamTable& layout, const BlockParamIds& b, int64_t q_heads, int64_t kv_heads,
         int64_t row_split = 1);
  /// Elements of saved state per call of N tokens: the q and k heads before the norm, and their
  /// rstd.
  int64_t saved_size(int64_t N) const { return rows(N) * (hq_ + hkv_) * d_; }
  int64_t rstd_size(int64_t N) const { return rows(N) * (hq_ + hkv_); }
  /// qkv[rows(N), (hq + 2 hkv)·d] normalised in place; saved[saved_size(N)] and
  /// rstd[rstd_size(N)] written for backward.
  void forward(T* qkv, T* saved, T* rstd, int64_t N, const Params<T>& params) const;
  /// dqkv[N, Q] (the gradient of the normalised rows) becomes the gradient of the rows before
  /// the norm, in place (v rows untouched); the weight gradients += (skipped when grads is
  /// nullptr or the op is frozen).
  void backward(T* dqkv, const T* saved, const T* rstd, int64_t N, const Params<T>& params,
                Params<T>* grads) const;
  /// LoRA: the weights stay as loaded, backward computes no weight gradient.
  void freeze() { frozen_ = true; }

 private:
  int64_t rows(int64_t N) const { return N / split_; }
  int q_norm_, k_norm_;
  int64_t hq_, hkv_, d_, split_;
  T eps_;
  bool frozen_ = false;
};

/// The QkNorm of block `b` over the local heads, or nullptr when the model has no q/k norms.
template <typename T>
std::unique_ptr<QkNorm<T>> make_qk_norm(const ParamTable& layout, const BlockParamIds& b,
                                        int64_t q_heads, int64_t kv_heads, int64_t row_split = 1) {
  if (b.q_norm < 0) return nullptr;
  return std::make_unique<QkNorm<T>>(layout, b, q_heads, kv_heads, row_split);
}

/// Inputs of one attention call besides q/k/v: per-token RoPE positions and the row's segments.
struct AttentionBatch {
  const int32_t* indexes;     ///< [N] RoPE position of each (local) token
  const int32_t* cu_seqlens;  ///< [num_segments + 1] segment offsets
  int64_t num_segments;
  int64_t num_tokens;         ///< N, local tokens
};

/// Grouped qkv → RoPE → document-masked causal attention, and its adjoint.
/// Input: qkv[N, Q] as the wqkv linear writes it (grouped rows, docs/model.md). Output: out[N, Hq·d].
template <typename T>
class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  virtual int64_t qkv_features() const = 0;  ///< local Q = (Hq + 2Hkv)·d
  virtual int64_t out_features() const = 0;  ///< local Hq·d
  /// Elements of saved state per call of N tokens (split qkv after RoPE, and the lse).
  virtual int64_t saved_qkv_size(int64_t N) const = 0;
  virtual int64_t saved_lse_size(int64_t N) const = 0;
  /// out (overwritten); saved_qkv and lse are written for backward.
  virtual void forward(T* out, T* saved_qkv, T* lse, const T* qkv, const AttentionBatch& b) = 0;
  /// forward, and where the op can in the same pass (a float model) also round_to_bf16 of
  /// saved_qkv into saved16 [saved_qkv_size(N)]: returns whether it did. The default only runs
  /// forward.
  virtual bool forward_rounded(T* out, T* saved_qkv, uint16_t* saved16, T* lse, const T* qkv,
                               const AttentionBatch& b) {
    (void)saved16;
    forward(out, saved_qkv, lse, qkv, b);
    return false;
  }
  /// dqkv[N, Q] (grouped layout, overwritten) from dout[N, Hq·d]; scratch has saved_qkv_size(N).
  virtual void backward(T* dqkv, T* scratch, const T* dout, const T* saved_qkv, const T* out,
                        const T* lse, const AttentionBatch& b) = 0;
  /// backward, and where the op can in the same pass (a float model) also round_to_bf16 of dqkv
  /// into dqkv16 [N, Q] (which may be saved16 of the forward: backward reads saved_qkv as given,
  /// so its bits are spent): returns whether it did. The default only runs backward.
  virtual bool backward_rounded(T* dqkv, uint16_t* dqkv16, T* scratch, const T* dout,
                                const T* saved_qkv, const T* out, const T* lse,
                                const AttentionBatch& b) {
    (void)dqkv16;
    backward(dqkv, scratch, dout, saved_qkv, out, lse, b);
    return false;
  }
  /// forward and backward with the output kept as bf16 bits out16 [N, Hq·d] (the forward's output
  /// rounded by round_to_bf16, the backward reading it widened), for a bf16 compute type where
  /// every reader of the output reads it so rounded: the chunked recomputation, and the unchunked
  /// step where keeps_bf16_out() and the output projection reads its input's bits only. With
  /// saved16 / dqkv16 (not null) they also round saved_qkv / dqkv into them as forward_rounded /
  /// backward_rounded do (backward_bf16_out returns whether it did). Same aliasing as the ops of
  /// ModelOps::token_chunks. Throw longtron::Error unless the op implements them (the dense op
  /// in float).
  virtual void forward_bf16_out(uint16_t* out16, T* saved_qkv, uint16_t* saved16, T* lse,
                                const T* qkv, const AttentionBatch& b) {
    (void)out16, (void)saved_qkv, (void)saved16, (void)lse, (void)qkv, (void)b;
    check(false, "internal: this attention op keeps no bf16 output");
  }
  virtual bool backward_bf16_out(T* dqkv, uint16_t* dqkv16, T* scratch, const T* dout,
                                 const T* saved_qkv, const uint16_t* out16, const T* lse,
                                 const AttentionBatch& b) {
    (void)dqkv, (void)dqkv16, (void)scratch, (void)dout, (void)saved_qkv, (void)out16, (void)lse,
        (void)b;
    check(false, "internal: this attention op keeps no bf16 output");
    return false;
  }
  /// Whether the ops above keep the output in bf16 without ever holding it in fp32 (the bf16
  /// kernel stores each output row rounded and reads it widened), so that a step may save the
  /// output as bits only. The default (no such kernel) is false; the same answer on every call.
  virtual bool keeps_bf16_out() const { return false; }
};

/// Token embedding: x[N, H] = table[ids].
template <typename T>
class EmbeddingOp {
 public:
  virtual ~EmbeddingOp() = default;
  virtual void forward(T* x, const int32_t* ids, int64_t N, const Params<T>& params) = 0;
  /// dtable[ids] += dx (skipped when grads is nullptr).
  virtual void backward(const T* dx, const int32_t* ids, int64_t N, Params<T>* grads) = 0;
};

/// Loss as (sum over valid labels, number of valid labels) — carried so until the step ends.
struct LossSum {
  double sum = 0.0;
  int64_t count = 0;
};

/// Output head + cross-entropy (ignore_index -100), fused so logits never exist for all tokens
/// at once (rows are processed in chunks).
template <typename T>
class HeadLossOp {
 public:
  virtual ~HeadLossOp() = default;
  /// Loss of xf[N, H] (after the final norm) against labels[N]. When dxf is not nullptr, writes
  /// dxf[N, H] = d(loss_scale · loss_sum)/dxf and accumulates the head's weight gradient into
  /// grads (if not nullptr). When token_losses is not nullptr, writes each token's loss (0 where
  /// the label is -100). Throws longtron::Error for a label outside [0, V) other than -100.
  virtual LossSum forward_backward(T* dxf, const T* xf, const int32_t* labels, int64_t N,
                                   const Params<T>& params, Params<T>* grads, double loss_scale,
                                   double* token_losses) = 0;
  /// logits[V] of one normalised row xf[H] (generation).
  virtual void logits_row(T* logits, const T* xf, const Params<T>& params) = 0;
  /// Per-token factors of the gradient (preference losses, docs/preference.md): while set, the
  /// next forward_backward writes the gradient of Σₙ loss_scale · token_scale[n] · lossₙ, one
  /// factor per row of its xf. nullptr (the default): every factor 1. Read only by heads whose
  /// supports_token_scale() is true.
  void set_token_scale(const double* token_scale) { token_scale_ = token_scale; }
  virtual bool supports_token_scale() const { return false; }

 protected:
  const double* token_scale_ = nullptr;
};

/// Rows per chunk of a chunked head over V vocabulary columns (the whole vocabulary, or the largest
/// shard of a vocabulary-parallel head) and N rows on this rank: at most 2²² logits at once, and
/// at most ⌈N / 32⌉ rows, so that the chunk's logits and their gradient (2·V floats a row) shrink
/// with the rank's tokens like its other activations instead of staying fixed while context or
/// sequence parallelism divides the rest (docs/isp.md); never fewer than 256 rows (below that the
/// GEMMs get thin and dW is re-read once per chunk) unless 2²² / V is smaller, and never fewer than
/// 64: rows of up to 256 tokens get max(64, min(2²²/V, 256)) rows a chunk, rows of at least
/// 32·2²²/V tokens get max(64, 2²²/V). Depends
/// only on (V, N), so every rank of a group that holds the same rows chunks them alike.
inline int64_t head_chunk_rows(int64_t V, int64_t N) {
  const int64_t cap = (int64_t{1} << 22) / std::max<int64_t>(1, V);
  const int64_t share = std::max<int64_t>(256, (N + 31) / 32);
  return std::max<int64_t>(64, std::min(cap, share));
}

/// Scratch of a chunked head: logits, their gradient and lse for one chunk of rows (kept at the
/// largest chunk seen; zeroed when they grow).
template <typename T>
struct HeadChunks {
  GrowBuffer<T, GrowFill::kZeroed> logits, dlogits, lse;
  GrowBuffer<uint16_t> dlogits16;  // under bf16: the gradient as the GEMMs read it
  /// Under bf16: the head weight packed once a call for the chunks' logits and dxf GEMMs
  /// (ops::SharedBf16B).
  GrowBuffer<ops::PackedLine> weight_logits, weight_dxf;
};

/// The cross-entropy of one chunk of a chunked head, over logits[rows, Vc] (Vc: the vocabulary
/// columns this rank holds) and labels[rows] (-100 = ignored): the whole vocabulary's
/// (DenseChunkCrossEntropy, ops::cross_entropy_*) or a vocabulary shard's
/// (parallel::VocabParallelHeadLoss, collective over its group).
template <typename T>
class ChunkCrossEntropy {
 public:
  virtual ~ChunkCrossEntropy() = default;
  /// Σ over valid rows of lse − target logit (in double); sets *count to the valid rows and
  /// lse[rows].
  virtual double forward(T* lse, int64_t* count, const T* logits, const int32_t* labels,
                         int64_t rows) = 0;
  /// out[rows]: each row's loss, 0 where ignored.
  virtual void token_losses(double* out, const T* logits, const T* lse, const int32_t* labels,
                            int64_t rows) = 0;
  /// dlogits[rows, Vc] = scale · d(loss sum)/dlogits (overwritten).
  virtual void backward(T* dlogits, const T* logits, const T* lse, const int32_t* labels,
                        int64_t rows, T scale) = 0;
  /// forward, then backward with dlogits rounded to bf16 (float_to_bf16) into dlogits16, in one
  /// pass over the logits, where the cross-entropy fuses them; returns false (nothing done) where
  /// it does not, the default: the caller then runs forward, backward and the rounding.
  virtual bool forward_backward_bf16(double* /*loss*/, uint16_t* /*dlogits16*/, T* /*lse*/,
                                     int64_t* /*count*/, const T* /*logits*/,
                                     const int32_t* /*labels*/, int64_t /*rows*/, T /*scale*/) {
    return false;
  }
};

/// ChunkCrossEntropy over the whole vocabulary (ops::cross_entropy_forward / _backward).
template <typename T>
class DenseChunkCrossEntropy final : public ChunkCrossEntropy<T> {
 public:
  explicit DenseChunkCrossEntropy(int64_t V) : V_(V) {}
  double forward(T* lse, int64_t* count, const T* logits, const int32_t* labels,
                 int64_t rows) override;
  void token_losses(double* out, const T* logits, const T* lse, const int32_t* labels,
                    int64_t rows) override;
  void backward(T* dlogits, const T* logits, const T* lse, const int32_t* labels, int64_t rows,
                T scale) override;
  /// ops::cross_entropy_forward_backward_bf16 (float only).
  bool forward_backward_bf16(double* loss, uint16_t* dlogits16, T* lse, int64_t* count,
                             const T* logits, const int32_t* labels, int64_t rows,
                             T scale) override;

 private:
  int64_t V_;
};

/// The output head W[Vc, H] + cross-entropy over xf[N, H] in chunks of `chunk` rows
/// (head_chunk_rows), so logits exist for one chunk at a time: the one row loop of every head
/// (dense, weight-parallel ISP, vocabulary-parallel Megatron and 2D). For each chunk: logits =
/// xf·Wᵀ, ce.forward (and ce.token_losses), then with dxf: ce.backward, dxf = dlogits·W
/// (overwritten) and, with dW, dW[Vc, H] += dlogitsᵀ·xf. Labels must have been checked
/// (ops::check_labels) by the caller. W16 (float only; nullptr: none) is W already rounded to
/// bf16 (raw bits, e.g. ISP's bf16 all-gather): the GEMMs that read the weight then use it
/// directly (ops::gemm_bf16_weight) and W may be nullptr. The other GEMMs run in the precision of
/// `cc` (ops/compute_context.h). token_scale[N] (nullptr: none) multiplies each row's gradient
/// (HeadLossOp::set_token_scale).
template <typename T>
LossSum chunked_head_loss(const ops::ComputeContext& cc, HeadChunks<T>& s,
                          ChunkCrossEntropy<T>& ce, T* dxf, T* dW,
                          const T* xf, const T* W, const int32_t* labels, int64_t N, int64_t Vc,
                          int64_t H, int64_t chunk, double loss_scale, double* token_losses,
                          const uint16_t* W16 = nullptr, const double* token_scale = nullptr);

/// chunked_head_loss over the whole vocabulary V (DenseChunkCrossEntropy): the dense and the
/// weight-parallel (ISP) heads. token_losses as HeadLossOp.
template <typename T>
LossSum chunked_head_loss(const ops::ComputeContext& cc, HeadChunks<T>& s, T* dxf, T* dW,
                          const T* xf, const T* W,
                          const int32_t* labels, int64_t N, int64_t V, int64_t H, int64_t chunk,
                          double loss_scale, double* token_losses,
                          const uint16_t* W16 = nullptr, const double* token_scale = nullptr);

/// The ops of one block, in the order the block calls them.
template <typename T>
struct BlockOps {
  std::unique_ptr<NormOp<T>> attention_norm, ffn_norm;
  std::unique_ptr<LinearOp<T>> wqkv, wo;
  std::unique_ptr<QkNorm<T>> qk_norm;  ///< between wqkv and the attention; nullptr: none
  std::unique_ptr<GateUpOp<T>> gate_up;  ///< w1 (gate) and w3 (up)
  std::unique_ptr<LinearOp<T>> w2;
  std::unique_ptr<AttentionOp<T>> attention;
};

/// Every op of a model; built once (make_dense_ops or a parallel factory).
template <typename T>
struct ModelOps {
  /// The precision the ops compute in (they hold a reference to the same context, given when
  /// built): the model reads its compute type to lay out its activations (bf16 saves).
  const ops::ComputeContext* compute = &ops::ComputeContext::fp32();
  std::unique_ptr<EmbeddingOp<T>> embedding;
  std::vector<BlockOps<T>> blocks;
  std::unique_ptr<NormOp<T>> norm;  ///< the final RMSNorm
  std::unique_ptr<HeadLossOp<T>> head;
  /// Ranks a row's tokens are split over (docs/data.md, "Sequence split"): the batch holds P / T
  /// tokens while cu_seqlens stays global (its last entry is P). 1 in a single process.
  int64_t sequence_parallel_size = 1;
  /// Megatron sequence parallel (MSP/FSP, modes/megatron_ops.cpp): the ops see the whole row
  /// (N tokens) but the residual stream between the linears — embedding output, norms, row-linear
  /// outputs, head input — holds only this rank's N / residual_split rows, so the model sizes and
  /// updates those buffers for N / residual_split rows. 1 otherwise.
  int64_t residual_split = 1;
  /// The ops may be called on any run of a row's tokens (the norms, linears, embedding and head
  /// are token-wise and keep nothing between calls), and the attention op accepts qkv ==
  /// saved_qkv in forward and dqkv == scratch == saved_qkv in backward: the decoder then recomputes
  /// (model.checkpoint) over chunks of ModelConfig::chunk_tokens tokens (the dense ops).
  bool token_chunks = false;
  /// Called by the chunked recomputation with the row position of the first token of the run
  /// that the token-wise ops are called on next (0 again when the pass ends); empty: nobody
  /// listens. LoRA's dropout reads it: its mask is a function of each token's row position.
  std::function<void(int64_t first)> on_chunk;
};

/// Tokens per chunk of the token-wise parts of a recomputed block (model.chunk_tokens), at least 1.
inline int64_t chunk_tokens(const ModelConfig& c) { return std::max<int64_t>(1, c.chunk_tokens); }

/// Queries per varlen attention kernel call of the dense attention op (whole documents; one longer
/// document is a call of its own): 4 × model.chunk_tokens, so the kernels' packed copies of q, dO,
/// dq, lse and D (and the forward's packed keys) are sized by a group of documents, not the row.
inline int64_t attention_group_tokens(const ModelConfig& c) { return 4 * chunk_tokens(c); }

/// The single-process ops over the full tensors of `layout`, computing in the precision of `cc`
/// (which must outlive them).
template <typename T>
ModelOps<T> make_dense_ops(const ParamTable& layout,
                           const ops::ComputeContext& cc = ops::ComputeContext::fp32());

/// RMSNorm over whole rows with weight view `weight` [H] of `layout` (eps model.norm_eps): the
/// dense model's norms, and any mode's whose rows are all local (ISP).
template <typename T>
std::unique_ptr<NormOp<T>> make_dense_norm(const ParamTable& layout, int weight);

}  // namespace longtron::model
