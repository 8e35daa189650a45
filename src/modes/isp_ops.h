// ISP (InternEvo "isp" = Ulysses sequence parallel + weight parallel) as a set of model ops, and
// the sharding plan the engine needs (InternEvo's ISP; docs/isp.md).
//
// Data: rank r of a TENSOR group (size T) holds tokens [rP/T, (r+1)P/T) of input_ids, indexes and
// labels; cu_seqlens stays global (packing/sequence_split.h). Parameters:
// - every linear weight (wqkv, wo, w1, w3, w2) and the head: rows sharded over WEIGHT (size W);
// - the embedding: hidden columns sharded over WEIGHT (a table tied to the head,
//   tie_word_embeddings: one tensor, rows sharded as the head's);
// - norm weights and linear biases: replicated.
// Gradient reductions (exact SUM semantics, not InternEvo's AVG):
// - sharded tensors: the ops reduce-scatter over WEIGHT; the engine then SUMS over WEIGHT_DATA
//   (the ranks with the same weight rank), where ZeRO-1 also lives;
// - replicated tensors: each rank holds a partial sum over its own tokens; the engine SUMS over
//   the whole world (every rank saw different tokens).
// Loss: each rank's (loss sum, count) over its own labels, summed over the world by the engine.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/layers.h"
#include "model/params.h"
#include "modes/isp_weights.h"
#include "parallel/layout.h"

namespace longtron::parallel {

/// How one full tensor is held under ISP on this rank (isp_split_dim, as the engine's "isp" plan;
/// this form serves tests and tools that build the ops without the engine).
struct IspShard {
  int view = -1;       ///< index into the full ParamTable's views
  int dim = -1;        ///< split dim (0 rows, 1 columns), -1 = replicated
  int64_t start = 0;   ///< first row/column held (along dim)
  int64_t count = 0;   ///< rows/columns held (the whole extent when replicated)
  /// Elements this rank holds.
  int64_t numel(const model::ParamTable& full) const;
};

/// The ISP rules on the model sizes (isp_mode.cpp), each named in its error: heads by T (by the
/// head size under parallel.sequence_2D), kv heads and T dividing one another, hidden by W (the
/// embedding is split on its hidden dim), P by T (P = 0: not checked). The engine runs them
/// (ModeFactory::validate) before any allocation; make_isp_ops runs them too.
void validate_isp_sizes(const Layout& layout, const ModelShape& shape);

/// The dim ISP splits a tensor on over WEIGHT (shard_range): 1 for the embedding (hidden columns;
/// 0, vocabulary rows as the head, when `tied`), 0 for the linears and the head (rows), -1 for norms
/// and biases (replicated). The engine's "isp" plan (isp_mode.cpp) and isp_shard_plan both follow it.
int isp_split_dim(const model::ParamView& view, bool tied);

/// The ISP plan of every view of `full` for weight rank `weight_rank` of W (shard_range rows for
/// the linears and head, uneven allowed; H / W columns for the embedding, rows when it is tied to
/// the head). W must divide hidden_size unless the embedding is tied (validate_isp_sizes).
std::vector<IspShard> isp_shard_plan(const model::ParamTable& full, int W, int weight_rank);

/// Copies this rank's part of every full tensor into `local` (same view indices; `local`'s view v
/// must hold plan[v].numel elements from its start, e.g. a full-size buffer or a local layout).
void isp_scatter_params(model::Params<float>& local, const model::Params<float>& full,
                        const std::vector<IspShard>& plan);

/// The ISP ops of one rank. `full` is the full ParamTable (shapes); the Params the model is given
/// must hold at view v this rank's part per isp_shard_plan (replicated views whole). Ops registered
/// in call order: embedding first (it marks the start of each pass for the prefetcher).
/// `store_out`, if given, receives the weight store (prefetch counters for tests/benchmarks).
/// Throws Error when the sizes break validate_isp_sizes.
/// `cc`: the precision of the ops (it must outlive them).
model::ModelOps<float> make_isp_ops(const model::ParamTable& full, const Grid& grid,
                                    bool overlap,
                                    std::shared_ptr<IspWeightStore>* store_out = nullptr,
                                    const ops::ComputeContext& cc = ops::ComputeContext::fp32());

}  // namespace longtron::parallel
