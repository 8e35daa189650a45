// The size table of the decoder's activation workspace (after llm.c's activation table): one list
// of buffers, computed from the local sizes alone, that the model allocates and binds in order
// (Decoder::reserve, chunk_reserve) and the memory plan (train/memory_plan.h) sums, so the two
// cannot drift apart.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace longtron::model {

/// The local sizes that fix the decoder's activation workspace (reserve): L blocks, N tokens per
/// call, R residual-stream rows (N, or N / residual_split under Megatron sequence parallel), local
/// hidden H, qkv features Q, FFN width F, attention output features A, and the attention op's
/// saved qkv / lse elements for N tokens. `per_layer` = one set of saved block state per layer
/// (training without recomputation), else one shared set.
/// Counted in double so a plan of an absurd length cannot overflow.
/// `bf16` = mixed precision (a bfloat16 compute type, ops/precision.h): every tensor saved for
/// backward but lse lives in a second arena of bf16 values (see Decoder), and one block's fp32
/// temporaries share one pool laid out per phase of the step.
/// `chunk` > 0: the chunked recomputation (Decoder::chunked(), chunks of `chunk` tokens): the L
/// block inputs (bf16 under bf16), the attention's qkv, output (bf16 under bf16) and lse, with
/// `train` its output's gradient and dL/d(residual), and one chunk's temporaries; `train` = false
/// keeps one block input and no gradients (forward only).
struct WorkspaceShape {
  double L = 0, N = 0, R = 0, H = 0, Q = 0, F = 0, A = 0, saved_qkv = 0, saved_lse = 0;
  bool per_layer = false;
  bool bf16 = false;
  double chunk = 0;
  bool train = true;
  /// Per-head q/k norms (model::QkNorm; 0 = none): the elements of their saved input and of
  /// their rstd per token (local (Hq + Hkv)·d and Hq + Hkv), kept per block like the other saves
  /// (in fp32 under bf16 too), row-sized under the chunked recomputation.
  double qk = 0, qk_heads = 0;
};

/// What a workspace buffer holds; Decoder binds each to its view. Unchunked float layout: the
/// block inputs and per-block saved state (k*), then one block's temporaries; bf16 layout: block
/// inputs, per-block lse and bf16 saves, the two rstd rows and the pool; chunked layout: the
/// row-sized buffers of Decoder::Chunked and its chunk buffers.
enum class WorkspaceSlot {
  kInput, kInput16,                                                    // block inputs
  kQkvSaved, kAttn, kA, kB, kLse, kH, kRstd1, kRstd2,                 // saved per block (float)
  kH16, kQkv16, kAttn16, kA16, kB16,                                  // saved per block (bf16)
  kQkIn, kQkRstd,                                                     // saved per block (q/k norm)
  kXn, kQkv, kTmp, kG, kXf, kRstdF, kRstdScratch,                     // forward temporaries
  kDres, kDtmp, kDxn, kDg, kDa, kDb, kDattn, kDqkvSaved,              // backward temporaries
  kPool, kGemmIn16,                                                   // bf16: pool, GEMM input bits
  kChunkInputs, kChunkInputs16, kChunkQkv, kChunkOut, kChunkOut16, kChunkLse, kChunkDout,
  kChunkDres, kChunkTemps, kChunkTemps16,                             // chunked recomputation
  kChunkQkIn, kChunkQkRstd,                                           // chunked: q/k norm
};

/// One buffer of the workspace: its slot, the block (or block input) it belongs to (0 for the
/// shared ones), its elements including padding, whether it lives in the 2-byte bf16 arena (else
/// the model's float type), and whether it grows with the row (else sized by a chunk, or R).
struct WorkspaceBuffer {
  const char* name;
  WorkspaceSlot slot;
  int index;
  double elements;
  bool bf16;
  bool row;
};

/// The workspace of `s`, in allocation order (float buffers padded to 16 elements, bf16 buffers
/// to 32, in the unchunked layouts; none in the chunked one).
std::vector<WorkspaceBuffer> workspace_table(const WorkspaceShape& s);

/// Elements of the float workspace arena Decoder allocates for `s`: the table's float buffers.
double workspace_elements(const WorkspaceShape& s);
/// Elements of the bf16 arena (2 bytes each) for `s`: the table's bf16 buffers; 0 unless s.bf16.
double workspace_bf16_elements(const WorkspaceShape& s);

/// The bf16 mode's pool of fp32 temporaries (Decoder::Bf16Pool), in elements, each buffer
/// padded to 16: rh = R×H (residual-stream rows), nq = N×Q, sq = saved qkv, na = N×A, nf = N×F.
/// Every phase starts with dres's slot; the pool is as long as the longest phase.
template <typename I>
struct PoolSizes {
  I rh, nq, sq, na, nf;
  /// The FFN backward's g, dg (later da, db), also holding the widened h.
  I u() const { return std::max(2 * nf, rh); }
  /// dres | xn | res | the norm's widened input, then qkv, qs, att or ga, gb. The head phase
  /// (dres | xf | res | dxf) fits.
  I forward() const { return 3 * rh + std::max({nq + sq + na, 2 * nf, rh}); }
  /// dres | g, dg | s1 | s2.
  I ffn_backward() const { return 3 * rh + u(); }
  /// dres | dqkv | datt, attn_w, qkv_w, dqs (then xw, xn2, dxn2 in their place).
  I attention_backward() const { return rh + nq + std::max(2 * na + 2 * sq, 3 * rh); }
  I total() const {
    return std::max({forward(), 4 * rh, ffn_backward(), attention_backward()});
  }
};

template <typename I>
PoolSizes<I> pool_sizes(I R, I N, I H, I Q, I F, I A, I sq) {
  const auto pad = [](I n) { return static_cast<I>(std::ceil(static_cast<double>(n) / 16) * 16); };
  return PoolSizes<I>{pad(R * H), pad(N * Q), pad(sq), pad(N * A), pad(N * F)};
}

}  // namespace longtron::model
