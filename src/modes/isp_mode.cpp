// The "isp" mode of the engine registry (engine.h): plan, ops and the local sequence shard.
// Plan (isp_ops.h): linears and head split on dim 0 over WEIGHT (shard_range), the embedding on
// dim 1 over WEIGHT (a table tied to the head on dim 0, as the head); norm weights and biases replicated, their partial gradients summed over
// WEIGHT then WEIGHT_DATA (every rank saw other tokens).
#include "core/error.h"
#include "data/context_split.h"
#include "data/sequence_split.h"
#include "modes/engine.h"
#include "modes/isp_ops.h"
#include "parallel/layout.h"

namespace longtron::parallel {

void validate_isp_sizes(const Layout& l, const ModelShape& s) {
  const int64_t T = l.tensor_size;
  if (l.seq2d) {  // Ulysses over the head group only: the context size is free of the heads
    const int64_t hp = l.seq2d_head;
    need_divisible(s.num_heads, hp, "num_attention_heads", "parallel.sequence_2D.head_size");
    check(s.num_kv_heads % hp == 0 || hp % s.num_kv_heads == 0,
          "num_kv_attention_heads ({}) and parallel.sequence_2D.head_size ({}) must divide one "
          "another (kv heads are repeated when head_size > kv heads)",
          s.num_kv_heads, hp);
  } else {
    need_divisible(s.num_heads, T, "num_attention_heads", "parallel.tensor.size");
    check(s.num_kv_heads % T == 0 || T % s.num_kv_heads == 0,
          "num_kv_attention_heads ({}) and parallel.tensor.size ({}) must divide one another "
          "(ISP repeats kv heads when T > kv heads)",
          s.num_kv_heads, T);
  }
  // The embedding is split on its hidden dim, unless it is the head's table (rows, uneven allowed).
  if (!s.tied_embeddings)
    need_divisible(s.hidden_size, l.weight_size, "hidden_size", "parallel.weight.size");
  need_divisible(s.packed_length, T, "packed row length P", "parallel.tensor.size");
}

void register_isp_mode() {
  ModeFactory f;
  f.validate = validate_isp_sizes;
  f.plan = [](ShardPlan& plan) {
    const model::ParamTable& full = plan.full_layout();
    const bool tied = full.config().tie_word_embeddings;  // one table, split as the head
    for (int v = 0; v < static_cast<int>(full.views().size()); ++v) {
      const int dim = isp_split_dim(full.view(v), tied);
      if (dim >= 0)
        plan.split(v, dim, comm::Group::kWeight);
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
    const Grid& g = ctx.grid;
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
