// The "isp" mode of the engine registry (engine.h): plan, ops and the local sequence shard.
// Plan (isp_ops.h): linears and head split on dim 0 over WEIGHT (shard_range), the embedding on
// dim 1 over WEIGHT (a table tied to the head on dim 0, as the head); norm weights and biases replicated, their partial gradients summed over
// WEIGHT then WEIGHT_DATA (every rank saw other tokens).
#include "core/error.h"
#include "data/context_split.h"
#include "data/sequence_split.h"
#include "parallel/engine.h"
#include "parallel/isp_ops.h"

namespace longtron::parallel {

void register_isp_mode() {
  ModeFactory f;
  f.plan = [](ShardPlan& plan) {
    const model::ParamLayout& full = plan.full_layout();
    const bool tied = full.config().tie_word_embeddings;  // one table, split as the head
    for (int v = 0; v < static_cast<int>(full.views().size()); ++v) {
      const model::ParamView& view = full.view(v);
      if (view.is_embedding && !tied)
        plan.split(v, 1, comm::Group::kWeight);
      else if (view.is_matrix)
        plan.split(v, 0, comm::Group::kWeight);
      else  // replicated: each rank of the weight group contributed a partial sum
        plan.sum_gradient(v, comm::Group::kWeight);
    }
  };
  // Weight shards are reduce-scattered over WEIGHT inside the ops; the rest of the world (the
  // ranks with the same weight rank) is WEIGHT_DATA. WEIGHT x WEIGHT_DATA = world.
  f.data_group = comm::Group::kWeightData;
  f.make_ops = [](const ModeContext& ctx) {
    return make_isp_ops(ctx.full, ctx.grid, ctx.grid.layout.weight_overlap);
  };
  f.local_batch = [](const data::MicroBatch& row, const ModeContext& ctx) {
    const comm::ProcessGrid& g = ctx.grid;
    if (g.context && g.context->size() > 1)  // 2D-Attention: the context share, then the head slice
      return data::split_for_context_parallel(row, g.head->size(), g.head->rank(),
                                              g.context->size(), g.context->rank(),
                                              data::parse_context_balance(g.layout.seq2d_balance));
    const int64_t T = ctx.grid.tensor->size();
    if (static_cast<int64_t>(row.input_ids.size()) % T == 0)
      return data::split_for_sequence_parallel(row, T, ctx.grid.tensor->rank());
    data::MicroBatch padded = row;  // pad is its own segment (docs/data.md)
    data::pad_for_sequence_parallel(padded, T);
    return data::split_for_sequence_parallel(padded, T, ctx.grid.tensor->rank());
  };
  register_mode("isp", std::move(f));
}

}  // namespace longtron::parallel
