// The InternLM2 model (docs/model.md) with explicit forward and backward, after llm.c: embedding,
// blocks h = x + wo(Attn(RoPE(split(wqkv(RMSNorm(x)))))), y = h + w2(silu(w1 z) ⊙ w3 z), z =
// RMSNorm(h), final RMSNorm, untied output head, cross-entropy with ignore_index -100 as (loss sum,
// count).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "data/balance.h"
#include "data/batch.h"
#include "model/layers.h"
#include "model/params.h"
#include "model/workspace.h"

namespace longtron::model {

/// One InternLM2 model over a parameter buffer it does not own (the optimizer updates it in
/// place between calls). Activations live in workspace buffers allocated on the first call and
/// grown only when a longer micro-batch arrives; per block they are O(N·(H + Q + F)) — nothing
/// O(N²). With config.checkpoint only each block's input is kept and the block is recomputed in
/// backward (InternEvo's activation checkpointing); gradients are identical.
/// Under a bfloat16 compute type (float model, ops/precision.h) every tensor saved for backward
/// but the attention lse is kept as bf16: the block inputs and post-attention residuals (read by
/// the RMSNorm backward and its recomputed forward), the split qkv after RoPE, the attention
/// output and the FFN's a = w1 z and b = w3 z (torch.autocast saves its bf16 linears' outputs
/// so; the GEMMs and the bf16 attention kernel round these inputs to bf16 anyway). Backward
/// widens them to fp32 one block at a time; norms, RoPE, softmax and every gradient stay fp32.
/// The forward's residual sum runs in fp32 within a block and continues from the block's input
/// rounded to bf16; each norm reads its input as saved (rounded to bf16, widened), so backward
/// recomputes exactly the forward's normalised values. With
/// checkpoint (chunked(): the block inputs kept in bf16, as read; else in fp32, rounded the same
/// way where read) gradients are identical with and without checkpoint here too. The fp32
/// temporaries of one block share one pool laid out per phase (forward, head, FFN backward,
/// attention backward): see workspace_elements.
template <typename T>
class InternLM2 {
 public:
  /// Dense (single-process) ops. `layout` and `params` must outlive the model.
  InternLM2(const ParamTable& layout, const Params<T>& params);
  /// Ops chosen by a parallel layout (local sizes come from the ops).
  InternLM2(const ParamTable& layout, const Params<T>& params, ModelOps<T> ops);

  /// Forward and backward of one micro-batch. Returns (Σ token losses, valid labels) and
  /// ACCUMULATES into grads the gradient of loss_scale · loss_sum (e.g. loss_scale = 1/Σcount of
  /// the step). Throws longtron::Error for inconsistent batch arrays, ids outside the vocabulary
  /// or labels other than -100 outside it.
  LossSum forward_backward(const data::MicroBatch& batch, Params<T>& grads, double loss_scale);

  /// Loss only (evaluation). If token_losses is not nullptr it is resized to N and receives each
  /// token's loss (0 where the label is -100), so callers can sum per document.
  LossSum forward_loss(const data::MicroBatch& batch, std::vector<double>* token_losses = nullptr);

  /// Logits [V] of the next token after `ids` (one document, positions 0…n−1), recomputing the
  /// whole prefix (no KV cache). ids must be non-empty and inside the vocabulary.
  std::vector<T> logits_last(std::span<const int32_t> ids);

  /// The chunked recomputation's buffers as allocated (after a chunked() call; empty before),
  /// bytes each, by their workspace_table slot: read from the allocation itself, so a test can
  /// hold the table (and the memory plan that sums it) to what the model holds.
  std::vector<std::pair<WorkspaceSlot, int64_t>> chunk_buffers() const;

  /// Bytes of activation workspace currently allocated (head chunk buffers excluded).
  int64_t workspace_bytes() const {
    return static_cast<int64_t>(arena_.size() * sizeof(T) + arena16_.size() * sizeof(uint16_t) +
                                ck_.bytes());
  }

  /// Whether forward_backward and forward_loss run the chunked recomputation: model.checkpoint
  /// with ops that allow it (ModelOps::token_chunks) and no Megatron sequence parallel.
  bool chunked() const { return checkpoint_ && ops_.token_chunks && ops_.residual_split == 1; }

  /// Called on the calling thread during forward_backward's backward pass (empty: never):
  /// hook(layer, true) once a part of the parameter gradients holds its final value for this
  /// micro-batch — layer = num_layers after the head and the final norm, i after block i (the
  /// blocks in reverse), −1 after the embedding; hook(i, false) half-way through block i (after
  /// its FFN), a point to progress communication where nothing new is complete. A data-parallel
  /// engine starts the reduction of each finished gradient bucket there (PyTorch DDP's
  /// gradient-ready hooks). The hook must not touch the gradients of parts still to come.
  void set_backward_hook(std::function<void(int layer, bool complete)> hook) {
    backward_hook_ = std::move(hook);
  }

  /// Activation recomputation (starts as config.checkpoint); switching re-lays the workspace on
  /// the next forward_backward.
  bool checkpoint() const { return checkpoint_; }
  void set_checkpoint(bool on);

 private:
  /// The chunked recomputation (chunked(); after Mini-Sequence Transformer, arXiv 2407.15892,
  /// and Megatron-LM's selective recomputation, arXiv 2205.05198). Row-sized: the L block inputs
  /// (bf16 under a bf16 compute type, since the forward itself reads them so rounded: the residual
  /// stream is rounded at each block's input; else T), and for the block being run the
  /// attention's qkv (split after RoPE; in backward its gradient, in place), output (bf16 under
  /// bf16: every reader reads it rounded), lse, the output's gradient and dL/d(residual)
  /// (training). Everything else lives in chunk buffers of C = chunk_tokens(config) tokens: each
  /// token-wise part runs chunk by chunk. Sized by workspace_table (model/workspace.h).
  struct Chunked {
    int64_t N = 0, C = 0;
    bool train = false, bf16 = false;
    std::vector<uint16_t> x16;  ///< [L][N, H] block inputs (bf16)
    std::vector<T> x;           ///< [L][N, H] block inputs (not bf16)
    std::vector<T> qkv, out, lse, dout, dres;
    std::vector<uint16_t> out16;  ///< [N, A] the attention output (bf16; else `out`)
    std::vector<T> c;           ///< chunk buffers (views below)
    std::vector<uint16_t> c16;  ///< bf16 chunk buffers: a, b rounded
    T *xw, *xn, *h, *hw, *t, *rstd, *g1, *g2, *g3, *g4;
    T* ow;                      ///< bf16: the chunk's attention output, widened
    uint16_t *a16, *b16;
    int64_t bytes() const {
      return static_cast<int64_t>(
          (x16.size() + out16.size() + c16.size()) * sizeof(uint16_t) +
          (x.size() + qkv.size() + out.size() + lse.size() + dout.size() + dres.size() +
           c.size()) * sizeof(T));
    }
  };
  /// Lays out ck_ for N tokens (train: the backward's buffers and every block's input; else one
  /// block input, overwritten by the block's output).
  void chunk_reserve(int64_t N, bool train);
  /// Block input `slot`, rows [n0, n0 + n) → dst (widened from bf16).
  void chunk_load(int64_t slot, int64_t n0, int64_t n, T* dst) const;
  /// src rows [n0, n0 + n) → block input `slot`; src then holds the stored values (rounded).
  void chunk_store(int64_t slot, int64_t n0, int64_t n, T* src);
  /// The attention of block `layer` from block input `slot`: chunks of norm and wqkv into ck_.qkv,
  /// then the attention op over the row (ck_.out, ck_.lse).
  void chunk_attention(int layer, int64_t slot, const AttentionBatch& ab);
  /// The attention output of rows [n0, …) of the chunk chunk_tail last ran (widened from bf16).
  const T* chunk_out(int64_t n0) const { return ck_.bf16 ? ck_.ow : ck_.out.data() + n0 * A_; }
  /// Rows [n0, n0 + n) of block `layer` after its attention: h = x + wo(out) in ck_.h, the FFN's
  /// norm input in ck_.hw, z in ck_.xn (rstd in ck_.rstd), a and b in g1, g2 (and a16, b16);
  /// with `output`, y = h + w2(silu(a) ⊙ b) in ck_.h.
  void chunk_tail(int layer, int64_t slot, int64_t n0, int64_t n, bool output);
  /// Training (grads) or the loss (and token_losses) of one micro-batch, chunked.
  LossSum chunked_pass(const data::MicroBatch& batch, Params<T>* grads, double loss_scale,
                       double* token_losses);

  /// Saved state of one block: the split qkv after RoPE, attention output and lse, the residual
  /// after attention, both norms' rstd, and the FFN's a = w1 z and b = w3 z. In bf16 mode only
  /// lse is float, and qkv16, attn16, a16, b16, h16 are kept instead of the rest.
  struct BlockActs {
    T *qkv_s, *attn, *lse, *h, *rstd1, *rstd2, *a, *b;
    uint16_t *qkv16, *attn16, *a16, *b16, *h16;
  };
  /// bf16 mode: the fp32 temporaries, views into one pool laid out per phase (R×H buffers are
  /// residual-stream rows, the rest token rows). dres (dL/d residual) has the pool's first slot
  /// in every phase, so a recomputed forward (checkpoint) leaves it intact.
  struct Bf16Pool {
    T* dres;
    // forward: xn (also the linears' output tmp), res (the fp32 residual stream; at the end the
    // last block's output), then wide (a norm's input as saved, widened), qkv, qs (split qkv),
    // att (attention output) or ga, gb (a, b).
    T *xn, *res, *wide, *qkv, *qs, *att, *ga, *gb;
    // head: xf in xn's slot, the head's input gradient dxf at the start of the phase area.
    T *xf, *dxf;
    // FFN backward: g / da, dg / db, then s1, s2 (R×H each); hw (the widened h, second read).
    T *g, *dg, *s1, *s2, *hw;
    // attention backward: dqkv, datt, the widened attn and qkv_s, attention's scratch; then
    // the widened x, its norm xn2 (later dL/dx of the norm), the norm's input gradient dxn2.
    T *dqkv, *datt, *attn_w, *qkv_w, *dqs, *xw, *xn2, *dxn2;
  };
  /// Workspace for N tokens; want_all = one set of block acts per layer (else one shared set);
  /// bf16 = the bf16 layout (see the class comment). Allocated and bound from workspace_table.
  void reserve(int64_t N, bool want_all, bool bf16);
  /// The shape of this model's workspace for N tokens (the table's input).
  WorkspaceShape workspace_shape(int64_t N, bool want_all, bool bf16) const;
  /// Points the view of table entry `b` (unchunked layouts) at `at`.
  void bind(const WorkspaceBuffer& b, T* at, uint16_t* at16, int64_t N);
  /// Lays out the bf16 pool's views (Bf16Pool) over `base`, for N tokens.
  void bind_pool(T* base, int64_t N);
  /// Whether this call keeps its saved inputs in bf16: a float model whose ops compute in bf16
  /// (ModelOps::compute).
  bool bf16_mode() const;
  AttentionBatch attention_batch(const data::MicroBatch& batch) const;
  /// Embedding and every block; final_residual() holds the last block's output. save = keep
  /// per-block acts.
  void forward_blocks(const data::MicroBatch& batch, bool save);
  /// The last block's output [R, H] after forward_blocks.
  T* final_residual() { return bf16_ ? pool_.res : xs_.back(); }
  void block_forward(int layer, BlockActs& A, T* y, const T* x, const AttentionBatch& ab);
  /// On entry dres_ = dL/dy of the block; on exit dL/dx.
  void block_backward(int layer, BlockActs& A, const T* x, const AttentionBatch& ab,
                      Params<T>& grads);
  /// bf16 mode: the block on pool_.res in place (x on entry, y on exit); saves A, and x rounded
  /// to bf16 into x16.
  void block_forward_bf16(int layer, BlockActs& A, const AttentionBatch& ab, uint16_t* x16);
  /// Where block `layer`'s input goes in bf16: its saved copy, or (checkpoint, whose inputs are
  /// kept in fp32) a staging area in the pool's xn slot, free when the block starts.
  uint16_t* block_input16(int layer) {
    return xs16_.empty() ? reinterpret_cast<uint16_t*>(pool_.xn)
                         : xs16_[static_cast<size_t>(layer)];
  }
  /// bf16 mode: pool_.dres = dL/dy on entry, dL/dx on exit.
  void block_backward_bf16(int layer, BlockActs& A, const AttentionBatch& ab, Params<T>& grads);
  BlockActs& acts(int layer, bool save);

  const ParamTable& layout_;
  const Params<T>& params_;
  ModelOps<T> ops_;
  std::function<void(int, bool)> backward_hook_;  ///< set_backward_hook
  void backward_point(int layer, bool complete) {
    if (backward_hook_) backward_hook_(layer, complete);
  }
  /// The chunked recomputation's token-wise ops run next on tokens from row position `first`.
  void at_chunk(int64_t first) {
    if (ops_.on_chunk) ops_.on_chunk(first);
  }
  bool checkpoint_;
  int64_t H_, Q_, F_, A_;  // local hidden, qkv features, FFN width, attention output features

  int64_t capacity_ = 0;   // tokens the workspace holds
  bool saved_all_ = false;  // workspace laid out with per-block acts (checkpoint off)
  bool bf16_ = false;       // workspace laid out for bf16 saved inputs
  std::vector<T> arena_;
  std::vector<uint16_t> arena16_;   // bf16 saved tensors (bf16 mode only)
  // Residual stream: block inputs [L+1][R,H] (fp32 mode); bf16 mode: the L block inputs, in
  // xs16_ with per-block acts, else in xs_ (fp32, so recomputation starts from the forward's x).
  std::vector<T*> xs_;
  std::vector<uint16_t*> xs16_;
  std::vector<BlockActs> acts_;     // L entries (checkpoint off) or 1 (shared)
  T *xn_, *qkv_, *tmp_, *g_, *xf_, *rstdf_, *rstd_scratch_;       // forward temporaries
  T *dres_, *dtmp_, *dxn_, *dg_, *da_, *db_, *dattn_, *dqkv_s_;   // backward temporaries
  Bf16Pool pool_{};  // bf16 mode only (the fp32 temporaries above are then unused)
  Chunked ck_;       // chunked() only
};

/// Model FLOPs of one step (docs/model.md): 6 × matmul parameters (all linears, head included; not the
/// embedding, norms or biases) × tokens + 6 × num_layers × hidden × Σ lᵢ² over the attention
/// segments of the step. Used for MFU (docs/training.md).
double model_flops(const ModelConfig& config, int64_t tokens, double sum_l2);

/// The row cost model of data.balance (data/balance.h) from model_flops' two terms: per token
/// 6 × matmul parameters (the linear term), per causal pair 12 × num_layers × hidden (model_flops
/// counts 6·layers·hidden·l² per segment, and a segment of l tokens has l(l+1)/2 ≈ l²/2 causal
/// pairs). With a sliding window, only the pairs the window leaves visible count, in the layers it
/// applies to (RowCost::window). FLOPs, not timing, so every rank and `inspect` compute the same
/// costs.
data::RowCost balance_cost(const ModelConfig& config);

/// Σ lᵢ² over the segments of cu_seqlens (the attention term of model_flops).
double sum_squared_segments(std::span<const int32_t> cu_seqlens);

/// The attention term of model_flops for `config`'s sliding windows: Σ lᵢ² with each segment's
/// l² scaled, in each layer, by the share of its causal pairs that the layer's window leaves
/// visible (ops::visible_pairs), averaged over layers. Equals sum_squared_segments without a
/// window or when no segment is longer than it.
double sum_squared_segments(const ModelConfig& config, std::span<const int32_t> cu_seqlens);

}  // namespace longtron::model
