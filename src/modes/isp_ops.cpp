// ISP ops factory and sharding plan (see isp_ops.h).
#include "modes/isp_ops.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/isp_attention.h"

namespace longtron::parallel {

int64_t IspShard::numel(const model::ParamTable& full) const {
  const model::ParamView& v = full.view(view);
  if (dim < 0) return v.numel;
  const int64_t other = v.numel / v.shape[static_cast<size_t>(dim)];
  return count * other;
}

int isp_split_dim(const model::ParamView& v, bool tied) {
  if (v.is_embedding) return tied ? 0 : 1;  // hidden columns, or vocabulary rows as the head
  if (v.is_matrix) return 0;     // linears and head: rows
  return -1;                     // norms and biases: replicated
}

std::vector<IspShard> isp_shard_plan(const model::ParamTable& full, int W, int weight_rank) {

  std::vector<IspShard> plan;
  for (int i = 0; i < static_cast<int>(full.views().size()); ++i) {
    const model::ParamView& v = full.view(i);
    IspShard s;
    s.view = i;
    s.dim = isp_split_dim(v, full.config().tie_word_embeddings);
    if (s.dim < 0) {
      s.count = v.shape[0];
    } else {
      const Range r = shard_range(v.shape[static_cast<size_t>(s.dim)], W, weight_rank);
      s.start = r.start;
      s.count = r.count;
    }
    plan.push_back(s);
  }
  return plan;
}

void isp_scatter_params(model::Params<float>& local, const model::Params<float>& full,
                        const std::vector<IspShard>& plan) {
  const model::ParamTable& L = full.layout();
  for (const IspShard& s : plan) {
    const model::ParamView& v = L.view(s.view);
    const float* src = full.ptr(s.view);
    float* dst = local.ptr(s.view);
    if (s.dim < 0) {
      std::copy(src, src + v.numel, dst);
    } else if (s.dim == 0) {
      const int64_t cols = v.shape[1];
      std::copy(src + s.start * cols, src + (s.start + s.count) * cols, dst);
    } else {
      const int64_t rows = v.shape[0], cols = v.shape[1];
      for (int64_t r = 0; r < rows; ++r)
        std::copy(src + r * cols + s.start, src + r * cols + s.start + s.count, dst + r * s.count);
    }
  }
}

model::ModelOps<float> make_isp_ops(const model::ParamTable& full, const Grid& grid,
                                    bool overlap, std::shared_ptr<IspWeightStore>* store_out,
                                    const ops::ComputeContext& cc) {
  const model::ModelConfig& c = full.config();
  validate_isp_sizes(grid.layout, ModelShape{c.num_attention_heads, c.num_kv_attention_heads,
                                             c.hidden_size, 0, c.tie_word_embeddings});
  // Ulysses over the HEAD group (= TENSOR unless 2D-Attention splits it with a CONTEXT group).
  const comm::CommPtr& head = grid.head ? grid.head : grid.tensor;
  const data::ContextBalance balance = grid.layout.seq2d_balance;
  auto store = std::make_shared<IspWeightStore>(grid.weight, overlap, cc);
  const int64_t H = c.hidden_size;
  model::ModelOps<float> ops;
  ops.compute = &cc;
  const model::ParamView& emb = full.view(full.tok_embeddings);
  const bool tied = c.tie_word_embeddings;  // one table split on vocabulary rows, as the head
  ops.embedding =
      std::make_unique<IspEmbedding>(store, full.tok_embeddings, emb.shape[0], H, tied ? 0 : 1);
  auto linear = [&](int w, int b) {
    const model::ParamView& v = full.view(w);
    return std::make_unique<IspLinear>(store, w, b, v.shape[0], v.shape[1]);
  };
  auto scratch = std::make_shared<UlyssesAttention::Scratch>();
  for (const model::BlockParamIds& b : full.layers) {
    model::BlockOps<float> block;
    // Norms on replicated weights [H]: the dense op; each gradient is this rank's partial sum.
    block.attention_norm = model::make_dense_norm<float>(full, b.attention_norm);
    block.ffn_norm = model::make_dense_norm<float>(full, b.ffn_norm);
    block.wqkv = linear(b.wqkv, b.wqkv_bias);
    block.wo = linear(b.wo, b.wo_bias);
    // Every head of the local tokens (before Ulysses' all-to-all), weights replicated likewise.
    block.qk_norm = model::make_qk_norm<float>(full, b, c.num_attention_heads,
                                               c.num_kv_attention_heads);
    block.gate_up = std::make_unique<model::SeparateGateUp<float>>(linear(b.w1, b.w1_bias),
                                                                   linear(b.w3, b.w3_bias));
    block.w2 = linear(b.w2, b.w2_bias);
    block.attention = std::make_unique<UlyssesAttention>(
        c, head, scratch, grid.context, balance, c.window_of(&b - full.layers.data()),
        ContextOptions{grid.layout.seq2d_ring ? ContextForm::kRing : ContextForm::kAllGather,
                       grid.layout.seq2d_window, grid.layout.seq2d_interleaved, &cc,
                       model::attention_group_tokens(c)});
    ops.blocks.push_back(std::move(block));
  }
  ops.norm = model::make_dense_norm<float>(full, full.norm);
  const model::ParamView& out = full.view(full.output);
  ops.head = std::make_unique<IspHeadLoss>(store, full.output, out.shape[0], out.shape[1],
                                          grid.tensor);
  ops.sequence_parallel_size = grid.tensor->size();
  if (store_out) *store_out = store;
  return ops;
}

}  // namespace longtron::parallel
