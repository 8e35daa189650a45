// ISP ops factory and sharding plan (see isp_ops.h).
#include "parallel/isp_ops.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/isp_attention.h"

namespace longtron::parallel {
namespace {

/// RMSNorm on a replicated weight [H] (the dense op; its gradient is this rank's partial sum).
class ReplicatedNorm final : public model::NormOp<float> {
 public:
  ReplicatedNorm(int view, int64_t H, float eps) : view_(view), H_(H), eps_(eps) {}
  void forward(float* out, float* rstd, const float* x, int64_t N,
               const model::Params<float>& p) override {
    ops::rms_norm_forward(out, rstd, x, p.ptr(view_), N, H_, eps_);
  }
  void backward(float* dx, const float* dout, const float* x, const float* rstd, int64_t N,
                const model::Params<float>& p, model::Params<float>* g) override {
    ops::rms_norm_backward(dx, g ? g->ptr(view_) : nullptr, dout, x, p.ptr(view_), rstd, N, H_);
  }

 private:
  int view_;
  int64_t H_;
  float eps_;
};

}  // namespace

int64_t IspShard::numel(const model::ParamLayout& full) const {
  const model::ParamView& v = full.view(view);
  if (dim < 0) return v.numel;
  const int64_t other = v.numel / v.shape[static_cast<size_t>(dim)];
  return count * other;
}

std::vector<IspShard> isp_shard_plan(const model::ParamLayout& full, int W, int weight_rank) {
  const int64_t H = full.config().hidden_size;
  check(W >= 1 && H % W == 0,
        "isp: model.hidden_size = {} is not divisible by parallel.weight.size = {} (the "
        "embedding is split on its hidden dim)",
        H, W);
  std::vector<IspShard> plan;
  for (int i = 0; i < static_cast<int>(full.views().size()); ++i) {
    const model::ParamView& v = full.view(i);
    IspShard s;
    s.view = i;
    if (v.is_embedding) {
      s.dim = 1;
      s.start = weight_rank * (H / W);
      s.count = H / W;
    } else if (v.is_matrix) {  // linears and head: rows
      const Range r = shard_range(v.shape[0], W, weight_rank);
      s.dim = 0;
      s.start = r.start;
      s.count = r.count;
    } else {  // norms and biases: replicated, partial gradients summed over the world
      s.count = v.shape[0];
    }
    plan.push_back(s);
  }
  return plan;
}

void isp_scatter_params(model::Params<float>& local, const model::Params<float>& full,
                        const std::vector<IspShard>& plan) {
  const model::ParamLayout& L = full.layout();
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

model::ModelOps<float> make_isp_ops(const model::ParamLayout& full, const comm::ProcessGrid& grid,
                                    bool overlap, std::shared_ptr<IspWeightStore>* store_out) {
  const model::ModelConfig& c = full.config();
  (void)ulysses_heads(c.num_attention_heads, c.num_kv_attention_heads, grid.tensor->size());
  auto store = std::make_shared<IspWeightStore>(grid.weight, overlap);
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t H = c.hidden_size;
  model::ModelOps<float> ops;
  const model::ParamView& emb = full.view(full.tok_embeddings);
  check(H % store->weight_size() == 0,
        "isp: model.hidden_size = {} is not divisible by parallel.weight.size = {} (the "
        "embedding is split on its hidden dim)",
        H, store->weight_size());
  ops.embedding = std::make_unique<IspEmbedding>(store, full.tok_embeddings, emb.shape[0], H);
  auto linear = [&](int w, int b) {
    const model::ParamView& v = full.view(w);
    return std::make_unique<IspLinear>(store, w, b, v.shape[0], v.shape[1]);
  };
  auto scratch = std::make_shared<UlyssesAttention::Scratch>();
  for (const model::BlockParamIds& b : full.layers) {
    model::BlockOps<float> block;
    block.attention_norm = std::make_unique<ReplicatedNorm>(b.attention_norm, H, eps);
    block.ffn_norm = std::make_unique<ReplicatedNorm>(b.ffn_norm, H, eps);
    block.wqkv = linear(b.wqkv, b.wqkv_bias);
    block.wo = linear(b.wo, b.wo_bias);
    block.w1 = linear(b.w1, -1);
    block.w3 = linear(b.w3, -1);
    block.w2 = linear(b.w2, -1);
    block.attention = std::make_unique<UlyssesAttention>(c, grid.tensor, scratch,
                                                         c.window_of(&b - full.layers.data()));
    ops.blocks.push_back(std::move(block));
  }
  ops.norm = std::make_unique<ReplicatedNorm>(full.norm, H, eps);
  const model::ParamView& out = full.view(full.output);
  ops.head = std::make_unique<IspHeadLoss>(store, full.output, out.shape[0], out.shape[1],
                                          grid.tensor);
  ops.sequence_parallel_size = grid.tensor->size();
  if (store_out) *store_out = store;
  return ops;
}

}  // namespace longtron::parallel
