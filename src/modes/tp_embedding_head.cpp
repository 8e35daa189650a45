// The embedding and head of the tensor-parallel modes (see tp_embedding_head.h).
#include "modes/tp_embedding_head.h"

#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/vocab_check.h"
#include "parallel/head_loss.h"
#include "parallel/mappings.h"
#include "parallel/shard_plan.h"
#include "parallel/vocab_parallel.h"

namespace longtron::parallel {
namespace {

using comm::CommPtr;
using model::Params;
using model::ParamTable;
using Blocks = std::optional<ActivationBlocks>;

/// `mine` as full rows [N, H]: itself when the rows are replicated (no blocks), else every
/// rank's block gathered into `full`.
const float* full_rows(const Blocks& blocks, const float* mine, Scratch& full, Scratch& scratch,
                       int64_t N, int64_t H) {
  if (!blocks) return mine;
  blocks->gather(full.get(N * H), scratch, mine, N, H);
  return full.data();
}

/// InternEvo's Embedding1D: table columns split over the group, lookup then all-gather along
/// hidden into full rows, of which this rank keeps its block (backward: gather the blocks).
class SplitEmbedding final : public model::EmbeddingOp<float> {
 public:
  SplitEmbedding(const ParamTable& full, int table, CommPtr comm, Blocks blocks)
      : table_(table), V_(full.view(table).shape[0]), H_(full.view(table).shape[1]),
        comm_(std::move(comm)), blocks_(std::move(blocks)) {}
  void forward(float* x, const int32_t* ids, int64_t N, const Params<float>& p) override {
    ops::check_token_ids(ids, N, V_);
    if (!blocks_) return split_hidden_embedding_forward(x, ids, p.ptr(table_), N, H_, *comm_);
    float* full = full_.get(N * H_);
    split_hidden_embedding_forward(full, ids, p.ptr(table_), N, H_, *comm_);
    blocks_->take(x, full, N, H_);
  }
  void backward(const float* dx, const int32_t* ids, int64_t N, Params<float>* g) override {
    if (g == nullptr) return;
    const float* d = full_rows(blocks_, dx, full_, scratch_, N, H_);
    split_hidden_embedding_backward(g->ptr(table_), d, ids, N, H_, *comm_);
  }

 private:
  int table_;
  int64_t V_, H_;
  CommPtr comm_;
  Blocks blocks_;
  Scratch full_, scratch_;
};

/// Megatron's VocabParallelEmbedding (tied models): the table's rows split as the head's (one
/// shard [V_r, H] for both uses), partial lookup, then all-reduce (replicated) or reduce-scatter
/// into this rank's block; backward gathers the blocks and adds the rows of this rank's ids.
class VocabParallelEmbedding final : public model::EmbeddingOp<float> {
 public:
  VocabParallelEmbedding(const ParamTable& full, const ParamTable& local, int table, CommPtr comm,
                         Blocks blocks)
      : table_(table), V_(full.view(table).shape[0]), Vr_(local.view(table).shape[0]),
        H_(full.view(table).shape[1]),
        start_(shard_range(V_, comm->size(), comm->rank()).start), comm_(std::move(comm)),
        blocks_(std::move(blocks)) {}
  void forward(float* x, const int32_t* ids, int64_t N, const Params<float>& p) override {
    ops::check_token_ids(ids, N, V_);
    if (!blocks_) {
      vocab_parallel_embedding_forward(x, ids, p.ptr(table_), N, H_, start_, Vr_);
      return reduce_from_group_forward(x, N * H_, *comm_);
    }
    float* partial = full_.get(N * H_);
    vocab_parallel_embedding_forward(partial, ids, p.ptr(table_), N, H_, start_, Vr_);
    blocks_->reduce_scatter(x, scratch_, partial, N, H_);
  }
  void backward(const float* dx, const int32_t* ids, int64_t N, Params<float>* g) override {
    if (g == nullptr) return;
    const float* d = full_rows(blocks_, dx, full_, scratch_, N, H_);
    vocab_parallel_embedding_backward(g->ptr(table_), d, ids, N, H_, start_, Vr_);
  }

 private:
  int table_;
  int64_t V_, Vr_, H_, start_;
  CommPtr comm_;
  Blocks blocks_;
  Scratch full_, scratch_;
};

/// Vocab-parallel output head + cross-entropy: logits [rows, V_r] per chunk of rows, never [N, V].
class VocabParallelHead final : public model::HeadLossOp<float> {
 public:
  VocabParallelHead(const ParamTable& full, const ParamTable& local, int weight, CommPtr comm,
                    Blocks blocks, bool generation, const char* mode,
                    const ops::ComputeContext& cc)
      : weight_(weight), V_(full.view(weight).shape[0]), Vr_(local.view(weight).shape[0]),
        H_(full.view(weight).shape[1]), comm_(std::move(comm)), blocks_(std::move(blocks)),
        generation_(generation), mode_(mode), cc_(cc),
        loss_(V_, Vr_, H_, shard_range(V_, comm_->size(), comm_->rank()).start, comm_->size(),
              cc) {}

  model::LossSum forward_backward(float* dxf, const float* xf, const int32_t* labels, int64_t N,
                                  const Params<float>& p, Params<float>* g, double loss_scale,
                                  double* token_losses) override {
    const float* X = full_rows(blocks_, xf, x_full_, scratch_, N, H_);
    float* dX = nullptr;  // partial dL/dX over this rank's vocabulary, [N, H]
    if (dxf != nullptr) dX = blocks_ ? dx_full_.get(N * H_) : dxf;
    float* dW = g != nullptr ? g->ptr(weight_) : nullptr;
    const model::LossSum loss = loss_.forward_backward(dX, dW, X, p.ptr(weight_), labels, N,
                                                       loss_scale, token_losses, *comm_,
                                                       this->token_scale_);
    if (dX != nullptr) {
      if (blocks_) blocks_->reduce_scatter(dxf, scratch_, dX, N, H_);
      else comm_->all_reduce(dX, N * H_);
    }
    return loss;
  }

  /// The head sees the whole row (N of its rows), so per-token factors are the row's.
  bool supports_token_scale() const override { return true; }

  /// Whole-vocabulary logits of one full (replicated) row: local logits, all-gathered unevenly.
  void logits_row(float* logits, const float* xf, const Params<float>& p) override {
    check(generation_, "generation is not supported under {} (export the checkpoint and generate "
          "with one process)", mode_);
    std::vector<float> mine(static_cast<size_t>(Vr_) + 1);
    ops::gemm<float>(cc_, false, true, 1, Vr_, H_, 1.0f, xf, p.ptr(weight_), 0.0f, mine.data());
    std::vector<int64_t> counts;
    for (int r = 0; r < comm_->size(); ++r) counts.push_back(shard_range(V_, comm_->size(), r).count);
    comm_->all_gather_v(logits, mine.data(), counts);
  }

 private:
  int weight_;
  int64_t V_, Vr_, H_;
  CommPtr comm_;
  Blocks blocks_;
  bool generation_;
  const char* mode_;
  const ops::ComputeContext& cc_;
  VocabParallelHeadLoss loss_;
  Scratch x_full_, dx_full_, scratch_;
};

}  // namespace

std::unique_ptr<model::EmbeddingOp<float>> make_tensor_parallel_embedding(
    const ParamTable& full, const ParamTable& local, int table, CommPtr tensor,
    std::optional<ActivationBlocks> blocks) {
  if (full.config().tie_word_embeddings)
    return std::make_unique<VocabParallelEmbedding>(full, local, table, std::move(tensor),
                                                    std::move(blocks));
  return std::make_unique<SplitEmbedding>(full, table, std::move(tensor), std::move(blocks));
}

std::unique_ptr<model::HeadLossOp<float>> make_tensor_parallel_head(
    const ParamTable& full, const ParamTable& local, int weight, CommPtr tensor,
    std::optional<ActivationBlocks> blocks, bool generation, const char* mode,
    const ops::ComputeContext& cc) {
  return std::make_unique<VocabParallelHead>(full, local, weight, std::move(tensor),
                                             std::move(blocks), generation, mode, cc);
}

}  // namespace longtron::parallel
