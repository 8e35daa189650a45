// The decoder of every family (docs/model.md) with explicit forward and backward, after llm.c: embedding,
// blocks h = x + wo(Attn(RoPE(split(wqkv(RMSNorm(x)))))), y = h + w2(silu(w1 z) ⊙ w3 z), z =
// RMSNorm(h) (Qwen3: the q and k heads of wqkv's output RMS-normalised before RoPE, QkNorm),
// final RMSNorm, untied output head, cross-entropy with ignore_index -100 as (loss sum, count).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "model/layers.h"
#include "model/params.h"
#include "model/saved.h"
#include "model/workspace.h"
#include "packing/balance.h"
#include "packing/batch.h"

namespace longtron::model {

/// One decoder over a parameter buffer it does not own (the optimizer updates it in
/// place between calls). Activations live in workspace buffers allocated on the first call and
/// grown only when a longer micro-batch arrives; per block they are O(N·(H + Q + F)) — nothing
/// O(N²). With config.checkpoint only each block's input is kept and the block is recomputed in
/// backward (InternEvo's activation checkpointing); gradients are identical.
/// Under a bfloat16 compute type (float model, ops/precision.h) every tensor saved for backward
/// but the attention lse (and Qwen3's q/k norm input and rstd, QkNorm) is kept as bf16: the block inputs and post-attention residuals (read by
/// the RMSNorm backward and its recomputed forward), the split qkv after RoPE, the attention
/// output and the FFN's a = w1 z and b = w3 z (torch.autocast saves its bf16 linears' outputs
/// so; the GEMMs and the bf16 attention kernel round these inputs to bf16 anyway). Backward
/// widens them to fp32 one block at a time; norms, RoPE, softmax and every gradient stay fp32.
/// The forward's residual sum runs in fp32 within a block and continues from the block's input
/// rounded to bf16; each norm reads its input as saved (rounded to bf16, widened), so backward
/// recomputes exactly the forward's normalised values. With
/// checkpoint (chunked(): the block inputs kept in bf16, as read; else in fp32, holding the
/// rounded values) gradients are identical with and without checkpoint here too. The fp32
/// temporaries of one block share one pool laid out per phase (forward, head, FFN backward,
/// attention backward): see workspace_elements.
/// Both dtypes run one block path (block_forward, block_backward, after llm.c's one forward over
/// one activation table): only the Saved helpers of model/saved.h, by which the block saves a
/// tensor and reads it back, and the workspace layout look at the dtype.
template <typename T>
class Decoder {
 public:
  /// Dense (single-process) ops. `layout` and `params` must outlive the model.
  Decoder(const ParamTable& layout, const Params<T>& params);
  /// Ops chosen by a parallel layout (local sizes come from the ops).
  Decoder(const ParamTable& layout, const Params<T>& params, ModelOps<T> ops);

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

  /// Per-token gradient factors (preference losses, docs/preference.md): when set, forward_backward
  /// runs the head in two passes over the same final hidden states: a forward giving each token's
  /// loss (N of them, 0 where the label is -100), then `weights(token_losses, token_scale)` fills
  /// token_scale[N], then the head's backward of Σₙ loss_scale · token_scale[n] · lossₙ
  /// (HeadLossOp::set_token_scale). The returned LossSum is the plain cross-entropy's. Empty: one
  /// pass. forward_backward throws Error when set under the chunked recomputation (chunked()) or
  /// with a head that takes no per-token factors.
  using TokenWeights =
      std::function<void(const std::vector<double>& token_losses, std::vector<double>& token_scale)>;
  void set_token_weights(TokenWeights weights) { token_weights_ = std::move(weights); }
  /// Whether this model's head takes per-token factors (set_token_weights can be used).
  bool takes_token_weights() const { return ops_.head->supports_token_scale(); }

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
    std::vector<T> qk_in, qk_rstd;  ///< [N, …] the q/k norms' saves (model::QkNorm; else empty)
    std::vector<uint16_t> out16;  ///< [N, A] the attention output (bf16; else `out`)
    std::vector<T> c;           ///< chunk buffers (views below)
    std::vector<uint16_t> c16;  ///< bf16 chunk buffers: a, b rounded
    T *xw, *xn, *h, *hw, *t, *rstd, *g1, *g2, *g3, *g4;
    T* ow;                      ///< bf16: the chunk's attention output, widened
    uint16_t *a16, *b16;
    const T* hn;                ///< h as the FFN's norm read it: h, or (bf16) rounded in hw
    int64_t bytes() const {
      return static_cast<int64_t>(
          (x16.size() + out16.size() + c16.size()) * sizeof(uint16_t) +
          (x.size() + qkv.size() + out.size() + lse.size() + dout.size() + dres.size() +
           qk_in.size() + qk_rstd.size() + c.size()) * sizeof(T));
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
  /// Under bf16: shares the attention output's bits for tokens [n0, n0 + n) with the GEMMs that
  /// read chunk_out(n0) (wo's), while the result lives; nothing otherwise.
  ops::SharedRoundings::Sharing share_out(int64_t n0, int64_t n) const;
  /// Rows [n0, n0 + n) of block `layer` after its attention: h = x + wo(out) in ck_.h, the FFN's
  /// norm input at ck_.hn, z in ck_.xn (rstd in ck_.rstd), a and b saved (chunk_a, chunk_b);
  /// with `output`, y = h + w2(silu(a) ⊙ b) in ck_.h.
  void chunk_tail(int layer, int64_t slot, int64_t n0, int64_t n, bool output);
  /// The chunk's FFN a and b as saved: in g1, g2, or (bf16) rounded in a16, b16.
  Saved<T> chunk_a() const {
    return ck_.bf16 ? Saved<T>{nullptr, ck_.a16} : Saved<T>{ck_.g1, nullptr};
  }
  Saved<T> chunk_b() const {
    return ck_.bf16 ? Saved<T>{nullptr, ck_.b16} : Saved<T>{ck_.g2, nullptr};
  }
  /// Training (grads) or the loss (and token_losses) of one micro-batch, chunked.
  LossSum chunked_pass(const data::MicroBatch& batch, Params<T>* grads, double loss_scale,
                       double* token_losses);

  /// Saved state of one block (Saved: kept as computed, or in bf16): the split qkv after RoPE,
  /// the attention output, the residual after attention h, and the FFN's a = w1 z and b = w3 z;
  /// the attention lse (float in both layouts) and both norms' rstd (the bf16 layout keeps no
  /// rstd: both point at the recomputed one, rstd_scratch_, which backward's norm recomputation
  /// refills before each read).
  struct BlockActs {
    Saved<T> qkv, attn, h, a, b;
    T *lse, *rstd1, *rstd2;
    T *qk_in = nullptr, *qk_rstd = nullptr;  ///< the q/k norms' input and rstd (fp32), if any
  };
  /// One block's temporaries by phase, under the names the one block path uses. The float
  /// layout gives them their own buffers (names whose lives do not overlap share one); the bf16
  /// layout lays each phase over one pool (bind_pool). dres (dL/d residual) keeps its own buffer
  /// in every phase, so a recomputed forward (checkpoint) leaves it intact. A name the layout
  /// does not need (a bf16 stage or widened copy under float) is nullptr.
  struct Scratch {
    T* dres;
    /// Under bf16: the bits of the GEMM input a norm or SwiGLU writes with its float output
    /// (for_gemm); nullptr otherwise.
    uint16_t* in16 = nullptr;
    /// Forward: xn (a norm's output), qkv, the bf16 stages of the split qkv (qs), attention
    /// output (att), a and b, the linears' output tmp, g = silu(a) ⊙ b, the FFN norm's input
    /// widened from its bf16 save (wide); res, the bf16 layout's residual stream.
    struct Fwd { T *xn, *qkv, *qs, *att, *a, *b, *tmp, *g, *wide, *res; } fwd;
    /// The final norm's output and the head's input gradient.
    struct Head { T *xf, *dxf; } head;
    /// FFN backward: g, dg, da, db; h as saved (h1, then again h2, where bf16's first copy was
    /// overwritten by dz), z = RMSNorm(h) recomputed, dz, and the norm's input gradient dh.
    struct Ffn { T *g, *dg, *da, *db, *h1, *z, *dz, *h2, *dh; } ffn;
    /// Attention backward: the saved output and qkv widened (att_w, qkv_w), dqkv, datt, the
    /// attention's own scratch dqs, x widened (xw), its norm recomputed (xn), dxn and dx.
    struct Att { T *att_w, *qkv_w, *dqkv, *datt, *dqs, *xw, *xn, *dxn, *dx; } att;
  };
  /// Workspace for N tokens; want_all = one set of block acts per layer (else one shared set);
  /// bf16 = the bf16 layout (see the class comment). Allocated and bound from workspace_table.
  void reserve(int64_t N, bool want_all, bool bf16);
  /// The shape of this model's workspace for N tokens (the table's input).
  WorkspaceShape workspace_shape(int64_t N, bool want_all, bool bf16) const;
  /// Points the view of table entry `b` (unchunked layouts) at `at`.
  void bind(const WorkspaceBuffer& b, T* at, uint16_t* at16, int64_t N);
  /// Lays out the bf16 layout's Scratch over one pool at `base`, for N tokens.
  void bind_pool(T* base, int64_t N);
  /// Whether this call keeps its saved inputs in bf16: a float model whose ops compute in bf16
  /// (ModelOps::compute).
  bool bf16_mode() const;
  AttentionBatch attention_batch(const data::MicroBatch& batch) const;
  /// Embedding and every block; final_residual() holds the last block's output. save = keep
  /// per-block acts.
  void forward_blocks(const data::MicroBatch& batch, bool save);
  /// The last block's output [R, H] after forward_blocks.
  T* final_residual() { return bf16_ ? s_.fwd.res : xs_.back(); }
  /// `norm` of x (N rows) into out for the GEMM that reads it next: under bf16, where the op
  /// can, with its bits written in the same pass into s_.in16 and shared with that GEMM while
  /// the result lives.
  ops::SharedRoundings::Sharing norm_for_gemm(NormOp<T>& norm, T* out, T* rstd, const T* x,
                                              int64_t N);
  /// g = silu(a) ⊙ b (n elements, A's a and b as saved) for w2's GEMMs (`w2`), its bits shared
  /// likewise; where w2 reads shared bits only, g's floats are not written. With a and b (the
  /// forward), saves them into A first, in the same pass.
  ops::SharedRoundings::Sharing swiglu_for_gemm(T* g, const BlockActs& A, int64_t n,
                                                const LinearOp<T>& w2, const T* a = nullptr,
                                                const T* b = nullptr);
  /// Whether block `o` saves its attention output as bf16 bits alone, never in fp32 (bf16 saves
  /// in A, an attention op that keeps its output so, and a wo that reads its input's bits only).
  bool output_bits_only(const BlockOps<T>& o, const BlockActs& A) const;
  /// dres += d (n elements); under bf16 (unsplit rows) with dres's bits written in the same pass
  /// into s_.in16 and shared with the GEMM that reads dres next.
  ops::SharedRoundings::Sharing accumulate_for_gemm(T* dres, const T* d, int64_t n);
  /// Shares bits as the bits of v[0..n) (a float model; nothing otherwise).
  ops::SharedRoundings::Sharing share_bits(const T* v, int64_t n, const uint16_t* bits) const;
  /// share_bits of s_.in16.
  ops::SharedRoundings::Sharing share_in16(const T* v, int64_t n) const;
  /// The one block path (both layouts): block `layer` from its input x (as stored) to y, saving
  /// A. The float layout runs it from xs_[layer] to xs_[layer + 1] (a recomputation: y into a
  /// free temporary); the bf16 layout in place on the residual stream s_.fwd.res (x = y).
  void block_forward(int layer, BlockActs& A, const T* x, T* y, const AttentionBatch& ab);
  /// On entry s_.dres = dL/dy of the block; on exit dL/dx. x: the block's input as saved.
  void block_backward(int layer, BlockActs& A, const Saved<T>& x, const AttentionBatch& ab,
                      Params<T>& grads);
  /// Block `layer`'s input as saved: xs_[layer] in fp32, or its bf16 copy.
  Saved<T> saved_input(int layer) const {
    const auto l = static_cast<size_t>(layer);
    return xs16_.empty() ? Saved<T>{xs_[l], nullptr} : Saved<T>{nullptr, xs16_[l]};
  }
  BlockActs& acts(int layer, bool save);

  const ParamTable& layout_;
  const Params<T>& params_;
  ModelOps<T> ops_;
  std::function<void(int, bool)> backward_hook_;  ///< set_backward_hook
  TokenWeights token_weights_;                     ///< set_token_weights
  std::vector<double> token_losses_, token_scale_;  // its two passes' per-token values
  /// The head's loss and (with grads) its backward into s_.head.dxf, with the token weights'
  /// two passes when set.
  LossSum head_pass(const data::MicroBatch& batch, int64_t N, Params<T>& grads, double loss_scale);
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
  // Residual stream: the float layout keeps the block inputs and the last output, xs_[L+1][R,H];
  // the bf16 layout runs it in s_.fwd.res and keeps the L block inputs rounded, in xs16_ with
  // per-block acts, else (checkpoint) in xs_, fp32 (the rounded values).
  std::vector<T*> xs_;
  std::vector<uint16_t*> xs16_;
  std::vector<BlockActs> acts_;     // L entries (checkpoint off) or 1 (shared)
  T *rstdf_, *rstd_scratch_;        // the final norm's rstd; a norm's rstd recomputed
  Scratch s_{};                     // one block's temporaries (either layout)
  Chunked ck_;       // chunked() only
};

/// Model FLOPs of one step (docs/model.md): 6 × matmul parameters (all linears, head included; not the
/// embedding, norms or biases) × tokens + 6 × num_layers × hidden × Σ lᵢ² over the attention
/// segments of the step. Used for MFU (docs/training.md).
double model_flops(const ModelConfig& config, int64_t tokens, double sum_l2);

/// The row cost model of data.balance (packing/balance.h) from model_flops' two terms: per token
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
