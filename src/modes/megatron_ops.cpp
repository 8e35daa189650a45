// Megatron tensor parallel as model ops: MTP, and its sequence-parallel forms MSP and FSP
// (docs/parallel.md; Megatron-LM megatron/core/tensor_parallel; InternEvo's MSP/FSP).
//
// Plan (T = TENSOR size, r = tensor rank): wqkv rows = whole kv-head groups [r·Hkv/T, …) with their
// q heads (the grouped layout of docs/model.md makes that contiguous), w1/w3 rows and w2 columns = the
// same FFN range (shard_range), wo columns = this rank's q heads, output rows = vocabulary
// shard_range(V, T, r) (uneven allowed), embedding columns = shard_range(H, T, r) (InternEvo's
// hidden-split Embedding1D) — or, for a tied embedding/head, the head's vocabulary rows
// (Megatron's VocabParallelEmbedding); w1/w3 biases (mlp_bias) = w1's FFN range. Under MSP/FSP the
// norm weights and the wo and w2 biases see only this rank's N/T tokens: their gradients are
// SUMMED over TENSOR (Megatron's sequence_parallel attribute).
//
// Sequence parallel (MSP/FSP): every op receives N = the row's tokens; the residual stream holds
// this rank's rows [r·N/T, (r+1)·N/T) at the front of the model's buffers. Column linears gather
// them (MSP keeps the gathered copy per layer for backward; FSP keeps only one scratch copy for the
// whole model and gathers again in backward); row linears reduce-scatter into them.
// w1 and w3 read the same input: one gate/up op (TensorParallelGateUp) gathers it once and sums
// their partial input gradients before ONE reduction (Megatron's fused gate/up projection).
#include <memory>
#include <optional>

#include "core/error.h"
#include "modes/engine.h"
#include "modes/mode_memory.h"
#include "modes/tp_embedding_head.h"
#include "ops/ops.h"
#include "parallel/scratch.h"
#include "parallel/tp_linear.h"

namespace longtron::parallel {
namespace {

using comm::CommPtr;
using comm::Group;
using model::ModelOps;
using model::Params;
using model::ParamTable;
using Buffer = parallel::Scratch;

int64_t shard_tokens(int64_t N, SequenceParallel sp, const Communicator& c) {
  if (sp == SequenceParallel::kNone) return N;
  check(N % c.size() == 0, "sequence parallel: {} tokens are not divisible by tensor size {}", N,
        c.size());
  return N / c.size();
}

/// RMSNorm over the rows this rank holds (all N, or N/T under sequence parallel).
class ShardNorm final : public model::NormOp<float> {
 public:
  ShardNorm(const ParamTable& local, int weight, SequenceParallel sp, CommPtr comm)
      : weight_(weight), H_(local.view(weight).shape[0]),
        eps_(static_cast<float>(local.config().norm_eps)), sp_(sp), comm_(std::move(comm)) {}
  void forward(float* out, float* rstd, const float* x, int64_t N, const Params<float>& p) override {
    ops::rms_norm_forward(out, rstd, x, p.ptr(weight_), shard_tokens(N, sp_, *comm_), H_, eps_);
  }
  void backward(float* dx, const float* dout, const float* x, const float* rstd, int64_t N,
                const Params<float>& p, Params<float>* g) override {
    ops::rms_norm_backward(dx, g ? g->ptr(weight_) : nullptr, dout, x, p.ptr(weight_), rstd,
                           shard_tokens(N, sp_, *comm_), H_);
  }

 private:
  int weight_;
  int64_t H_;
  float eps_;
  SequenceParallel sp_;
  CommPtr comm_;
};

SequenceParallel sequence_parallel_of(const Layout& layout) {
  switch (layout.tensor_mode) {
    case TensorMode::kMsp: return SequenceParallel::kKeepGathered;
    case TensorMode::kFsp: return SequenceParallel::kRegather;
    default: return SequenceParallel::kNone;
  }
}

void megatron_plan(ShardPlan& plan) {
  const ParamTable& full = plan.full_layout();
  const bool sp = sequence_parallel_of(plan.grid().layout) != SequenceParallel::kNone;
  // Tied: the one table is split on vocabulary rows, as the head (split below).
  if (!full.config().tie_word_embeddings) plan.split(full.tok_embeddings, 1, Group::kTensor);
  for (const model::BlockParamIds& b : full.layers) {
    plan.split_attention_heads(b, Group::kTensor);
    plan.split(b.w1, 0, Group::kTensor);
    plan.split(b.w1_bias, 0, Group::kTensor);  // the same FFN range as w1 (shard_range of F)
    plan.split(b.w3, 0, Group::kTensor);
    plan.split(b.w3_bias, 0, Group::kTensor);
    plan.split(b.w2, 1, Group::kTensor);
    // Each rank normalises its own heads: the q/k norm weights' gradients are partial sums.
    plan.sum_gradient(b.q_norm, Group::kTensor);
    plan.sum_gradient(b.k_norm, Group::kTensor);
    if (sp) {
      plan.sum_gradient(b.attention_norm, Group::kTensor);
      plan.sum_gradient(b.ffn_norm, Group::kTensor);
      plan.sum_gradient(b.wo_bias, Group::kTensor);
      plan.sum_gradient(b.w2_bias, Group::kTensor);
    }
  }
  if (sp) plan.sum_gradient(full.norm, Group::kTensor);
  plan.split(full.output, 0, Group::kTensor);
}

ModelOps<float> megatron_ops(const ModeContext& ctx) {
  const SequenceParallel sp = sequence_parallel_of(ctx.grid.layout);
  const CommPtr& tp = ctx.grid.tensor;
  const int T = tp->size();
  const ParamTable& L = ctx.local;
  // Local heads: the dense attention of a model with heads/T, kv heads/T and hidden/T (same
  // head_dim), which is exactly the grouped layout of this rank's wqkv rows.
  model::ModelConfig local_config = ctx.full.config();
  local_config.num_attention_heads /= T;
  local_config.num_kv_attention_heads /= T;
  local_config.hidden_size /= T;
  const ParamTable attention_layout(local_config);
  ModelOps<float> dense = model::make_dense_ops<float>(attention_layout, ctx.compute);

  ModelOps<float> ops;
  ops.compute = &ctx.compute;
  // Under sequence parallel the residual stream is held in row blocks over TENSOR.
  std::optional<ActivationBlocks> rows;
  if (sp != SequenceParallel::kNone) rows = ActivationBlocks::rows(tp);
  ops.embedding = make_tensor_parallel_embedding(ctx.full, L, L.tok_embeddings, tp, rows);
  // Column linears gather over TENSOR (FSP: one gathered copy for the whole model); row linears
  // reduce over TENSOR, scattering the rows under sequence parallel.
  TpLinearSpec column{tp, sp, nullptr};
  TpLinearSpec row{nullptr, SequenceParallel::kNone, tp, sp != SequenceParallel::kNone};
  column.compute = row.compute = &ctx.compute;
  // One set of per-call buffers for all linears of the model (each holds data only inside one
  // call); the gathered inputs kept for backward are one per column linear (FSP: one in all).
  const LinearShared model_wide;
  auto fsp_scratch = std::make_shared<Buffer>();
  const auto shared = [&] {
    LinearShared s = model_wide.for_another_linear();
    if (sp == SequenceParallel::kRegather) s.gathered = fsp_scratch;
    return s;
  };
  for (size_t i = 0; i < L.layers.size(); ++i) {
    const model::BlockParamIds& b = L.layers[i];
    model::BlockOps<float> block;
    block.attention_norm = std::make_unique<ShardNorm>(L, b.attention_norm, sp, tp);
    block.ffn_norm = std::make_unique<ShardNorm>(L, b.ffn_norm, sp, tp);
    block.wqkv = std::make_unique<TensorParallelLinearOp>(L, b.wqkv, b.wqkv_bias, column, shared());
    block.wo = std::make_unique<TensorParallelLinearOp>(L, b.wo, b.wo_bias, row, shared());
    block.qk_norm = model::make_qk_norm<float>(L, b, local_config.num_attention_heads,
                                               local_config.num_kv_attention_heads);
    block.gate_up =
        std::make_unique<TensorParallelGateUp>(L, b.w1, b.w3, b.w1_bias, b.w3_bias, column, shared());
    block.w2 = std::make_unique<TensorParallelLinearOp>(L, b.w2, b.w2_bias, row, shared());
    block.attention = std::move(dense.blocks[i].attention);
    ops.blocks.push_back(std::move(block));
  }
  ops.norm = std::make_unique<ShardNorm>(L, L.norm, sp, tp);
  ops.head = make_tensor_parallel_head(ctx.full, L, L.output, tp, rows, true, "tensor parallel",
                                       ctx.compute);
  if (sp != SequenceParallel::kNone) ops.residual_split = T;  // activations [N/T, H] between blocks
  return ops;
}

// Heads and kv heads split by T (whole kv groups per rank); under sequence parallel the packed
// row P too (each rank holds P/T rows of the residual stream).
void megatron_sizes(const Layout& l, const ModelShape& s) {
  const int64_t T = l.tensor_size;
  need_divisible(s.num_heads, T, "num_attention_heads", "parallel.tensor.size");
  need_divisible(s.num_kv_heads, T, "num_kv_attention_heads", "parallel.tensor.size");
  if (l.tensor_mode != TensorMode::kMtp)
    need_divisible(s.packed_length, T, "packed row length P", "parallel.tensor.size");
}

}  // namespace

void register_megatron_modes() {
  for (const char* name : {"mtp", "msp", "fsp"}) {
    ModeFactory f;
    f.plan = megatron_plan;
    f.make_ops = megatron_ops;
    f.validate = megatron_sizes;
    f.memory = megatron_memory;
    register_mode(name, std::move(f));
  }
}

}  // namespace longtron::parallel
