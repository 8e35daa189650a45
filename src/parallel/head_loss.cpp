// Chunked vocab-parallel head + cross-entropy (see head_loss.h).
#include "parallel/head_loss.h"

#include <algorithm>

#include "ops/ops.h"
#include "packing/batch.h"
#include "parallel/scratch.h"
#include "parallel/vocab_parallel.h"

namespace longtron::parallel {

VocabParallelHeadLoss::VocabParallelHeadLoss(int64_t V, int64_t V_local, int64_t H,
                                             int64_t vocab_start, int group_size,
                                             const ops::ComputeContext& cc)
    : V_local_(V_local), H_(H), vocab_start_(vocab_start),
      V_shard_((V + group_size - 1) / group_size), cc_(&cc) {}

namespace {
/// The cross-entropy of a vocabulary shard: columns [vocab_start, vocab_start + V_local) of the
/// logits live on this rank; every call is collective over `comm`.
class ShardCrossEntropy final : public model::ChunkCrossEntropy<float> {
 public:
  ShardCrossEntropy(int64_t V_local, int64_t vocab_start, comm::Communicator& comm)
      : V_local_(V_local), vocab_start_(vocab_start), comm_(comm) {}
  double forward(float* lse, int64_t* count, const float* logits, const int32_t* labels,
                 int64_t rows) override {
    return vocab_parallel_cross_entropy_forward(lse, count, logits, labels, rows, V_local_,
                                                vocab_start_, comm_);
  }
  // token loss = lse − target logit; the target logit lives on one rank: one SUM all-reduce.
  void token_losses(double* out, const float* logits, const float* lse, const int32_t* labels,
                    int64_t rows) override;
  void backward(float* dlogits, const float* logits, const float* lse, const int32_t* labels,
                int64_t rows, float scale) override {
    vocab_parallel_cross_entropy_backward(dlogits, logits, lse, labels, rows, V_local_,
                                          vocab_start_, scale);
  }

 private:
  int64_t V_local_, vocab_start_;
  comm::Communicator& comm_;
};
}  // namespace

model::LossSum VocabParallelHeadLoss::forward_backward(float* dX, float* dW, const float* X,
                                                       const float* W, const int32_t* labels,
                                                       int64_t N, double loss_scale,
                                                       double* token_losses,
                                                       comm::Communicator& comm,
                                                       const double* token_scale) {
  // Chunked by the largest shard and the rows, which every rank of the group shares.
  ShardCrossEntropy ce(V_local_, vocab_start_, comm);
  return model::chunked_head_loss(*cc_, chunks_, ce, dX, dW, X, W, labels, N, V_local_, H_,
                                  model::head_chunk_rows(V_shard_, N), loss_scale, token_losses,
                                  nullptr, token_scale);
}

void ShardCrossEntropy::token_losses(double* out, const float* logits, const float* lse,
                                     const int32_t* labels, int64_t rows) {
  std::vector<double> target(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t local = int64_t(labels[r]) - vocab_start_;
    if (labels[r] != data::kIgnoreIndex && local >= 0 && local < V_local_)
      target[size_t(r)] = logits[r * V_local_ + local];
  }
  comm_.all_reduce(target.data(), rows);
  for (int64_t r = 0; r < rows; ++r)
    out[r] = labels[r] == data::kIgnoreIndex ? 0.0 : double(lse[r]) - target[size_t(r)];
}

}  // namespace longtron::parallel
