// Tensor-parallel layers built from the mappings: column/row-parallel linears in Megatron's MTP and
// sequence-parallel (MSP/FSP) forms, vocab-parallel cross-entropy and InternEvo's hidden-split
// embedding (Megatron-LM megatron/core/tensor_parallel/layers.py; InternEvo's ISP embedding).
//
// Conventions: arguments are (outputs, saved state, inputs, weights, sizes, mode, comm); weights are
// HF-layout [out, in] shards; N is the FULL token count of the tensor-parallel region (the whole
// row); under sequence parallel a rank holds rows [r·N/T, (r+1)·N/T) of the activations between
// blocks. Input gradients are OVERWRITTEN, parameter gradients ACCUMULATE (+=); any gradient
// pointer may be nullptr to skip it. Every function is collective over `comm` (the TENSOR group)
// and must be called in the same order on every rank of it.
#pragma once
#include <cstdint>

#include "comm/communicator.h"

namespace longtron::parallel {

using comm::Communicator;

/// How the activations next to a tensor-parallel linear are held.
/// kNone (MTP): replicated [N, hidden]. kKeepGathered (MSP): sequence shards [N/T, hidden]; the
/// column linear all-gathers its input and keeps the gathered copy for backward. kRegather (FSP):
/// as MSP but the gathered copy is only scratch; backward all-gathers the shard again.
enum class SequenceParallel { kNone, kKeepGathered, kRegather };

/// [start, start + count) of part `rank` when `total` is split into `parts` nearly equal
/// contiguous ranges: the first total % parts ranks get one more (InternEvo's uneven rule).
struct Range {
  int64_t start;
  int64_t count;
};
Range shard_range(int64_t total, int parts, int rank);

// ---- ColumnParallelLinear: W shard [out_local, in] = rows of the full W, output features split --
/// y[N, out_local] = X · W_rᵀ (+ bias_r) over the full sequence X[N, in].
/// x: [N, in] under kNone, this rank's shard [N/T, in] otherwise.
/// x_full: scratch [N, in] written with the gathered input under kKeepGathered/kRegather (must
/// stay untouched until backward under kKeepGathered; free to reuse under kRegather); unused
/// (may be nullptr) under kNone. bias: [out_local] or nullptr.
void column_parallel_forward(float* y, float* x_full, const float* x, const float* W,
                             const float* bias, int64_t N, int64_t in, int64_t out_local,
                             SequenceParallel sp, Communicator& comm);
/// dx: [N, in] under kNone (all-reduced over the group), [N/T, in] otherwise (reduce-scattered).
/// dW[out_local, in] += dyᵀ X, dbias[out_local] += Σ dy (no reduction: each shard is unique).
/// x_full: under kKeepGathered the buffer forward filled; under kRegather scratch [N, in] that is
/// re-gathered here from x (the shard); ignored under kNone (x is the full input).
/// The input-gradient collective is started asynchronously and overlapped with the weight GEMM.
void column_parallel_backward(float* dx, float* dW, float* dbias, const float* dy, float* x_full,
                              const float* x, const float* W, int64_t N, int64_t in,
                              int64_t out_local, SequenceParallel sp, Communicator& comm);

// ---- RowParallelLinear: W shard [out, in_local] = columns of the full W, input features split ----
/// Partial y = x_r · W_rᵀ over this rank's input features x[N, in_local], then summed over the
/// group: all-reduce → y[N, out] (kNone) or reduce-scatter → y[N/T, out] (sequence parallel).
/// bias [out] (full, replicated) is added after the reduction, once.
void row_parallel_forward(float* y, const float* x, const float* W, const float* bias, int64_t N,
                          int64_t in_local, int64_t out, SequenceParallel sp, Communicator& comm);
/// dy: [N, out] (kNone) or [N/T, out] (all-gathered here). dx[N, in_local] = dy·W_r;
/// dW[out, in_local] += dyᵀ x_r. dbias[out] += Σ dy over the rows this rank holds: complete under
/// kNone; under sequence parallel a partial sum the caller must all-reduce over the group with the
/// norm weights (Megatron's sequence_parallel-tagged params).
void row_parallel_backward(float* dx, float* dW, float* dbias, const float* dy, const float* x,
                           const float* W, int64_t N, int64_t in_local, int64_t out,
                           SequenceParallel sp, Communicator& comm);

// ---- Vocab-parallel cross-entropy (Megatron cross_entropy.py, with ignore_index) ----------------
/// logits: this rank's vocabulary shard [N, V_local] holding ids [vocab_start, vocab_start +
/// V_local) (any split, uneven allowed; V_local may be 0); labels[N] global ids, -100 = ignored.
/// Two collectives: all-reduce MAX of the row max, one all-reduce SUM of (Σexp, target logit,
/// owner count) in double. Returns Σ over valid rows of (lse − logit[label]) in double and sets
/// *count to the valid rows; both identical on every rank of the group. Saves lse[N] (global
/// log-sum-exp) for backward. Never builds the full [N, V]. Throws Error (on every rank) when a
/// label is not -100 and no rank's range holds it.
double vocab_parallel_cross_entropy_forward(float* lse, int64_t* count, const float* logits,
                                            const int32_t* labels, int64_t N, int64_t V_local,
                                            int64_t vocab_start, Communicator& comm);
/// dlogits[N, V_local] = scale · (softmax − onehot(label)) on the local columns for valid rows, 0
/// for ignored rows (overwritten). No communication (softmax uses the saved global lse).
void vocab_parallel_cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                           const int32_t* labels, int64_t N, int64_t V_local,
                                           int64_t vocab_start, float scale);

// ---- Hidden-split embedding (InternEvo Embedding1D, embed_split_hidden=True) --------------------
/// table: this rank's columns [V, H_local] of the full table [V, H], H split by shard_range(H, T, r).
/// out[N, H] = all-gather over the group of table[ids, :] along the hidden dim (replicated).
/// ids[N] in [0, V) (the caller maps negative ids to abs(id), as ops::embedding_forward).
void split_hidden_embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N,
                                    int64_t H, Communicator& comm);
/// dtable[V, H_local] += own hidden columns of dout[N, H] (dout is replicated: no communication).
void split_hidden_embedding_backward(float* dtable, const float* dout, const int32_t* ids,
                                     int64_t N, int64_t H, Communicator& comm);

}  // namespace longtron::parallel
