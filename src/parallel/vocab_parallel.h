// Tensor-parallel layers built from the mappings: vocab-parallel cross-entropy, InternEvo's
// hidden-split embedding and Megatron's vocab-parallel embedding (Megatron-LM
// megatron/core/tensor_parallel; InternEvo's ISP embedding).
// The column/row-parallel linears are one op, parallel/tp_linear.h.
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

// ---- Vocab-parallel embedding (Megatron VocabParallelEmbedding) ---------------------------------
// The layout of a tied embedding/head (tie_word_embeddings) under tensor parallel: the table's
// rows are split over the group exactly as the vocab-parallel head's, so one shard [V_local, H]
// serves both uses and both gradients add into it (Megatron-LM's shared embedding weights).
/// out[N, H] = this rank's PARTIAL lookup (overwritten): row ids[n] − vocab_start of `table`
/// [V_local, H] for ids in [vocab_start, vocab_start + V_local), 0 for the others. The sum of the
/// partial outputs over the group (all-reduce, or reduce-scatter under sequence parallel) is the
/// full lookup, exactly: one rank holds each id. No communication.
void vocab_parallel_embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N,
                                      int64_t H, int64_t vocab_start, int64_t V_local);
/// dtable[V_local, H] += dout[n, :] for each token whose id this rank holds; dout[N, H] is the
/// gradient of the FULL lookup (replicated over the group). No communication.
void vocab_parallel_embedding_backward(float* dtable, const float* dout, const int32_t* ids,
                                       int64_t N, int64_t H, int64_t vocab_start, int64_t V_local);

}  // namespace longtron::parallel
