// The "isp" mode of the engine registry (engine.h): plan, ops and the local sequence shard.
// Plan (isp_ops.h): linears and head split on dim 0 over WEIGHT (shard_range), the embedding on
// dim 1 over WEIGHT (a table tied to the head on dim 0, as the head); norm weights and biases replicated, their partial gradients summed over
// WEIGHT then WEIGHT_DATA (every rank saw other tokens).
#include <vector>

#include "core/error.h"
#include "modes/engine.h"
#include "modes/isp_ops.h"
#include "modes/mode_memory.h"
#include "packing/context_split.h"
#include "packing/sequence_split.h"
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
    return make_isp_ops(ctx.full, ctx.grid, ctx.grid.layout.weight_overlap, nullptr, ctx.compute);
  };
  f.local_batch = [](const data::MicroBatch& row, const ModeContext& ctx) {
    const Grid& g = ctx.grid;
    if (g.context && g.context->size() > 1)  // 2D-Attention: the context share, then the head slice
      return data::split_for_context_parallel(row, g.head->size(), g.head->rank(),
                                              g.context->size(), g.context->rank(),
                                              g.layout.seq2d_balance);
    const int64_t T = ctx.grid.tensor->size();
    if (static_cast<int64_t>(row.input_ids.size()) % T == 0)
      return data::split_for_sequence_parallel(row, T, ctx.grid.tensor->rank());
    data::MicroBatch padded = row;  // pad is its own segment (docs/data.md)
    data::pad_for_sequence_parallel(padded, T);
    return data::split_for_sequence_parallel(padded, T, ctx.grid.tensor->rank());
  };
  f.gather_token_losses = [](const std::vector<double>& local, const data::MicroBatch& row,
                              const ModeContext& ctx) {
    // The local batch is this rank's contiguous 1/T of the (padded) row: the tensor group's
    // pieces in rank order are the row; the pad added for the split is cut off again.
    const Grid& g = ctx.grid;
    comm::Communicator& tp = *g.tensor;
    const auto n = static_cast<int64_t>(local.size());
    std::vector<double> full(static_cast<size_t>(n * tp.size()));
    tp.all_gather(full.data(), local.data(), n);
    if (g.context && g.context->size() > 1) {
      // 2D-Attention: a rank holds its context share's positions (not contiguous under zigzag
      // or document), so the positions travel with the losses and put each one back in place.
      const int64_t hp = g.head->size(), C = g.context->size();
      data::MicroBatch padded = row;
      data::pad_for_sequence_parallel(padded, hp * C);
      const auto shares = data::context_assignment(padded.cu_seqlens, C, g.layout.seq2d_balance);
      const auto& mine = shares[static_cast<size_t>(g.context->rank())];
      std::vector<double> pos(static_cast<size_t>(n)), all(full.size());
      for (int64_t k = 0; k < n; ++k) pos[size_t(k)] = double(mine[size_t(g.head->rank() * n + k)]);
      tp.all_gather(all.data(), pos.data(), n);
      std::vector<double> placed(full.size());
      for (size_t k = 0; k < full.size(); ++k) placed[size_t(all[k])] = full[k];
      full = std::move(placed);
    }
    full.resize(row.input_ids.size());
    return full;
  };
  f.memory = isp_memory;
  register_mode("isp", std::move(f));
}

}  // namespace longtron::parallel
