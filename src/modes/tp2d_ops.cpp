// The ops of the 2D tensor-parallel mode (see tp2d_ops.h).
#include "modes/tp2d_ops.h"

#include "modes/mode_memory.h"
#include "modes/tp_embedding_head.h"

#include <memory>

#include "core/error.h"
#include "parallel/dist_norm.h"
#include "parallel/isp_attention.h"
#include "parallel/tp_linear.h"

namespace longtron::parallel {

namespace {

using comm::CommPtr;
using model::Params;
using model::ParamTable;

/// The grid position of this rank.
struct Pos {
  int x, y, xr, yr;
  CommPtr X, Y, tensor;
  explicit Pos(const Grid& g)
      : x(g.x->size()), y(g.y->size()), xr(g.x->rank()), yr(g.y->rank()), X(g.x), Y(g.y),
        tensor(g.tensor) {}
  int64_t rows_x(int64_t N) const {
    check(N % x == 0 && N % y == 0,
          "2D tensor parallel: the row's {} tokens are not divisible by parallel.tensor_2d.x ({}) "
          "and .y ({})", N, x, y);
    return N / x;
  }
};

/// RMSNorm over [N/x, H/y] with the sum of squares all-reduced over y (dist_norm.h).
class Norm2D final : public model::NormOp<float> {
 public:
  Norm2D(const ParamTable& full, int weight, const Pos& g)
      : weight_(weight), H_(full.view(weight).shape[0]),
        eps_(static_cast<float>(full.config().norm_eps)), g_(g) {}
  void forward(float* out, float* rstd, const float* x, int64_t N, const Params<float>& p) override {
    dist_rms_norm_forward(out, rstd, x, p.ptr(weight_), g_.rows_x(N), H_ / g_.y, H_, eps_, *g_.Y);
  }
  void backward(float* dx, const float* dout, const float* x, const float* rstd, int64_t N,
                const Params<float>& p, Params<float>* grads) override {
    dist_rms_norm_backward(dx, grads ? grads->ptr(weight_) : nullptr, dout, x, p.ptr(weight_),
                           rstd, g_.rows_x(N), H_ / g_.y, H_, *g_.Y);
  }

 private:
  int weight_;
  int64_t H_;
  float eps_;
  Pos g_;
};

/// Attention on this x rank's heads: the dense op when y = 1 (exactly MSP), else Ulysses over y
/// on the rank's sequence chunk [N/y] (rows yr·N/y …) with global cu_seqlens.
class Attention2D final : public model::AttentionOp<float> {
 public:
  Attention2D(const model::ModelConfig& local_heads, std::unique_ptr<model::AttentionOp<float>> dense,
              const Pos& g, int64_t window, const ops::ComputeContext& cc)
      : g_(g), inner_(g.y == 1 ? std::move(dense)
                               : std::make_unique<UlyssesAttention>(
                                     local_heads, g.Y, nullptr, nullptr,
                                     data::ContextBalance::kZigzag, window,
                                     ContextOptions{.compute = &cc})) {}
  int64_t qkv_features() const override { return inner_->qkv_features(); }
  int64_t out_features() const override { return inner_->out_features(); }
  int64_t saved_qkv_size(int64_t N) const override { return inner_->saved_qkv_size(chunk(N)); }
  int64_t saved_lse_size(int64_t N) const override { return inner_->saved_lse_size(chunk(N)); }
  void forward(float* out, float* saved_qkv, float* lse, const float* qkv,
               const model::AttentionBatch& b) override {
    inner_->forward(out, saved_qkv, lse, qkv, local(b));
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* saved_qkv,
                const float* out, const float* lse, const model::AttentionBatch& b) override {
    inner_->backward(dqkv, scratch, dout, saved_qkv, out, lse, local(b));
  }

 private:
  int64_t chunk(int64_t N) const { return (N + g_.y - 1) / g_.y; }
  model::AttentionBatch local(const model::AttentionBatch& b) const {
    if (g_.y == 1) return b;
    g_.rows_x(b.num_tokens);
    model::AttentionBatch l = b;
    l.num_tokens = b.num_tokens / g_.y;
    l.indexes = b.indexes + g_.yr * l.num_tokens;
    return l;
  }
  Pos g_;
  std::unique_ptr<model::AttentionOp<float>> inner_;
};

}  // namespace

model::ModelOps<float> make_tp2d_ops(const ModeContext& ctx) {
  const Pos g(ctx.grid);
  const Overlap2D overlap = parse_overlap_2d(ctx.grid.layout.tensor_2d_overlap);
  const ParamTable& L = ctx.local;
  // This x rank's heads: a model with heads/x, kv heads/x and hidden/x (same head_dim), which is
  // exactly the grouped layout of its wqkv rows.
  model::ModelConfig heads = ctx.full.config();
  heads.num_attention_heads /= g.x;
  heads.num_kv_attention_heads /= g.x;
  heads.hidden_size /= g.x;
  const ParamTable attention_layout(heads);
  model::ModelOps<float> dense = model::make_dense_ops<float>(attention_layout, ctx.compute);

  model::ModelOps<float> ops;
  ops.compute = &ctx.compute;
  ops.residual_split = g.x;  // the residual stream holds N/x rows (of H/y features)
  // The embedding and head are Megatron's with the residual stream in the 2D blocks (x2×y1: MSP).
  const ActivationBlocks blocks = ActivationBlocks::grid(g.tensor, g.x, g.y);
  ops.embedding = make_tensor_parallel_embedding(ctx.full, L, L.tok_embeddings, g.tensor, blocks);
  // One set of per-call buffers for all linears (each holds data only inside one call); each
  // linear (the w1/w3 pair: one) keeps its own gathered input for backward.
  const LinearShared model_wide;
  for (size_t i = 0; i < L.layers.size(); ++i) {
    const model::BlockParamIds& b = L.layers[i];
    model::BlockOps<float> block;
    block.attention_norm = std::make_unique<Norm2D>(ctx.full, b.attention_norm, g);
    block.ffn_norm = std::make_unique<Norm2D>(ctx.full, b.ffn_norm, g);
    // Column-like linears gather over X and reduce-scatter over Y, row-like ones the reverse.
    TpLinearSpec xy{g.X, SequenceParallel::kKeepGathered, g.Y, true, overlap};
    TpLinearSpec yx{g.Y, SequenceParallel::kKeepGathered, g.X, true, overlap};
    xy.compute = yx.compute = &ctx.compute;
    const auto own = [&] { return model_wide.for_another_linear(); };
    block.wqkv = std::make_unique<TensorParallelLinearOp>(L, b.wqkv, b.wqkv_bias, xy, own());
    block.wo = std::make_unique<TensorParallelLinearOp>(L, b.wo, b.wo_bias, yx, own());
    // The x rank's heads of its N/y rows (the qkv the attention reads).
    block.qk_norm = model::make_qk_norm<float>(L, b, heads.num_attention_heads,
                                               heads.num_kv_attention_heads, g.y);
    block.gate_up =
        std::make_unique<TensorParallelGateUp>(L, b.w1, b.w3, b.w1_bias, b.w3_bias, xy, own());
    block.w2 = std::make_unique<TensorParallelLinearOp>(L, b.w2, b.w2_bias, yx, own());
    block.attention = std::make_unique<Attention2D>(heads, std::move(dense.blocks[i].attention), g,
                                                    heads.window_of(i), ctx.compute);
    ops.blocks.push_back(std::move(block));
  }
  ops.norm = std::make_unique<Norm2D>(ctx.full, L.norm, g);
  ops.head = make_tensor_parallel_head(ctx.full, L, L.output, g.tensor, blocks, false,
                                       "parallel.tensor_2d", ctx.compute);
  return ops;
}

void tp2d_plan(ShardPlan& plan) {
  using comm::Group;
  const ParamTable& full = plan.full_layout();
  // Tied: the one table is split on vocabulary rows, as the head (split below).
  if (!full.config().tie_word_embeddings) plan.split(full.tok_embeddings, 1, Group::kTensor);
  for (const model::BlockParamIds& b : full.layers) {
    plan.split_attention_heads(b, Group::kX);  // wqkv rows, wo columns: whole kv groups over X
    plan.split(b.wqkv, 1, Group::kY);
    plan.sum_gradient(b.wqkv_bias, Group::kY);
    plan.split(b.wo, 0, Group::kY);
    plan.split(b.wo_bias, 0, Group::kY);
    plan.sum_gradient(b.wo_bias, Group::kX);
    for (int w : {b.w1, b.w3}) {
      plan.split(w, 0, Group::kX);
      plan.split(w, 1, Group::kY);
    }
    for (int bias : {b.w1_bias, b.w3_bias}) {  // mlp_bias: as the wqkv bias
      plan.split(bias, 0, Group::kX);
      plan.sum_gradient(bias, Group::kY);
    }
    plan.split(b.w2, 0, Group::kY);
    plan.split(b.w2, 1, Group::kX);
    plan.split(b.w2_bias, 0, Group::kY);  // as the wo bias
    plan.sum_gradient(b.w2_bias, Group::kX);
    for (int norm : {b.attention_norm, b.ffn_norm}) {
      plan.split(norm, 0, Group::kY);
      plan.sum_gradient(norm, Group::kX);
    }
    for (int norm : {b.q_norm, b.k_norm}) {  // heads split over X, rows over Y: partial sums
      plan.sum_gradient(norm, Group::kX);
      plan.sum_gradient(norm, Group::kY);
    }
  }
  plan.split(full.norm, 0, Group::kY);
  plan.sum_gradient(full.norm, Group::kX);
  plan.split(full.output, 0, Group::kTensor);
}

namespace {

// Heads and kv heads by x, the heads of an x rank by y (kv heads per x rank and y dividing one
// another: repeated when y is larger), P by x and by y, hidden by y; and the overlap option.
void tp2d_sizes(const Layout& l, const ModelShape& s) {
  const int64_t x = l.tensor_2d_x, y = l.tensor_2d_y;
  need_divisible(s.num_heads, x, "num_attention_heads", "parallel.tensor_2d.x");
  need_divisible(s.num_kv_heads, x, "num_kv_attention_heads", "parallel.tensor_2d.x");
  need_divisible(s.num_heads / x, y, "attention heads per x rank", "parallel.tensor_2d.y");
  const int64_t kv = s.num_kv_heads / x;
  check(kv % y == 0 || y % kv == 0,
        "kv heads per x rank ({}) and parallel.tensor_2d.y ({}) must divide one another", kv, y);
  need_divisible(s.packed_length, x, "packed row length P", "parallel.tensor_2d.x");
  need_divisible(s.packed_length, y, "packed row length P", "parallel.tensor_2d.y");
  need_divisible(s.hidden_size, y, "hidden_size", "parallel.tensor_2d.y");
  parse_overlap_2d(l.tensor_2d_overlap);
}

}  // namespace

void register_2d_mode() {
  ModeFactory f;
  f.plan = tp2d_plan;
  f.make_ops = make_tp2d_ops;
  f.validate = tp2d_sizes;
  f.memory = tp2d_memory;
  register_mode("2d", std::move(f));
}

}  // namespace longtron::parallel
