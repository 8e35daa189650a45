// Megatron's tensor-parallel mappings as adjoint pairs on float buffers (Megatron-LM
// megatron/core/tensor_parallel/mappings.py). Each forward is written next
// to its backward, and the backward is the adjoint of the forward: <f(x), y> = <x, f*(y)>.
//
// Conventions: tensors are dense row-major; a "shard" is group rank r's chunk, chunks in group-rank
// order; T = comm.size(). Arguments are (outputs, inputs, sizes, comm), as in ops/ops.h. Collectives on a
// group of one are copies. Sizes that do not divide evenly are an Error naming them (the callers
// split unevenly or pad first). Every function is collective over `comm`: call it on every rank.
#pragma once
#include <cstdint>

#include "comm/communicator.h"

namespace longtron::parallel {

using comm::Communicator;

// ---- copy / reduce over the group (replicated ↔ partial sums) ---------------------------------
/// copy_to_group forward: identity (x[n] is used as is by every rank).
inline void copy_to_group_forward(float* /*x*/, int64_t /*n*/, Communicator& /*comm*/) {}
/// copy_to_group backward: dx[n] (in place) = Σ over the group of the partial gradients.
void copy_to_group_backward(float* dx, int64_t n, Communicator& comm);

/// reduce_from_group forward: x[n] (in place) = Σ over the group of the partial results.
void reduce_from_group_forward(float* x, int64_t n, Communicator& comm);
/// reduce_from_group backward: identity (every rank keeps the full, replicated dy).
inline void reduce_from_group_backward(float* /*dy*/, int64_t /*n*/, Communicator& /*comm*/) {}

// ---- last dim: full [rows, cols] ↔ shard [rows, cols/T] -----------------------------------------
/// scatter_last_dim forward: shard[rows, cols/T] = full[:, r·cols/T … (r+1)·cols/T).
void scatter_last_dim_forward(float* shard, const float* full, int64_t rows, int64_t cols,
                              Communicator& comm);
/// scatter_last_dim backward: dfull[rows, cols] = all-gather of every rank's dshard along the last dim.
void scatter_last_dim_backward(float* dfull, const float* dshard, int64_t rows, int64_t cols,
                               Communicator& comm);

/// gather_last_dim forward: full[rows, cols] = concat over ranks of shard[rows, cols/T] (last dim).
void gather_last_dim_forward(float* full, const float* shard, int64_t rows, int64_t cols,
                             Communicator& comm);
/// gather_last_dim backward: dshard = own chunk of dfull (the consumer is replicated).
void gather_last_dim_backward(float* dshard, const float* dfull, int64_t rows, int64_t cols,
                              Communicator& comm);

// ---- first (sequence) dim: full [rows, cols] ↔ shard [rows/T, cols] ------------------------------
/// scatter_first_dim forward: shard[rows/T, cols] = rows [r·rows/T, (r+1)·rows/T) of full.
void scatter_first_dim_forward(float* shard, const float* full, int64_t rows, int64_t cols,
                               Communicator& comm);
/// scatter_first_dim backward: dfull = all-gather of the dshards along the first dim.
void scatter_first_dim_backward(float* dfull, const float* dshard, int64_t rows, int64_t cols,
                                Communicator& comm);

/// all_gather_first_dim forward (Megatron gather_from_sequence_parallel_region with
/// tensor_parallel_output_grad=True): full[rows, cols] = concat of the shards [rows/T, cols].
void all_gather_first_dim_forward(float* full, const float* shard, int64_t rows, int64_t cols,
                                  Communicator& comm);
/// all_gather_first_dim backward: dshard = reduce-scatter (sum) of the partial dfull of every rank.
/// (When the consumer of the gathered tensor is replicated, use scatter_first_dim_forward instead.)
void all_gather_first_dim_backward(float* dshard, const float* dfull, int64_t rows, int64_t cols,
                                   Communicator& comm);

/// reduce_scatter_first_dim forward: shard[rows/T, cols] = chunk r of Σ over ranks of full[rows, cols].
void reduce_scatter_first_dim_forward(float* shard, const float* full, int64_t rows, int64_t cols,
                                      Communicator& comm);
/// reduce_scatter_first_dim backward: dfull[rows, cols] = all-gather of the dshards.
void reduce_scatter_first_dim_backward(float* dfull, const float* dshard, int64_t rows,
                                       int64_t cols, Communicator& comm);

// ---- Ulysses all-to-all: [tokens, heads, head_dim] --------------------------------------------
/// Scatter heads, gather sequence (before attention; DeepSpeed-Ulysses, InternEvo ISP):
/// in[n_local, heads, head_dim] (this rank's tokens, all heads) →
/// out[T·n_local, heads/T, head_dim] (all tokens in rank order, heads [r·heads/T, (r+1)·heads/T)).
/// Its adjoint (and inverse) is ulysses_gather_heads.
void ulysses_scatter_heads(float* out, const float* in, int64_t n_local, int64_t heads,
                           int64_t head_dim, Communicator& comm);
/// Gather heads, scatter sequence (after attention): in[T·n_local, heads/T, head_dim] →
/// out[n_local, heads, head_dim]. `heads` is the FULL head count. Adjoint of ulysses_scatter_heads.
void ulysses_gather_heads(float* out, const float* in, int64_t n_local, int64_t heads,
                          int64_t head_dim, Communicator& comm);

}  // namespace longtron::parallel
