// Chunked vocab-parallel head + cross-entropy (see head_loss.h).
#include "parallel/head_loss.h"

#include <algorithm>

#include "data/batch.h"
#include "ops/ops.h"
#include "parallel/vocab_parallel.h"
#include "parallel/scratch.h"

namespace longtron::parallel {

VocabParallelHeadLoss::VocabParallelHeadLoss(int64_t V, int64_t V_local, int64_t H,
                                             int64_t vocab_start, int group_size)
    : V_local_(V_local), H_(H), vocab_start_(vocab_start),
      V_shard_((V + group_size - 1) / group_size) {}

model::LossSum VocabParallelHeadLoss::forward_backward(float* dX, float* dW, const float* X,
                                                       const float* W, const int32_t* labels,
                                                       int64_t N, double loss_scale,
                                                       double* token_losses,
                                                       comm::Communicator& comm) {
  // Chunked by the largest shard and the rows, which every rank of the group shares.
  const int64_t C = std::min(model::head_chunk_rows(V_shard_, N), N), Vr = V_local_, H = H_;
  float* logits = logits_.get(C * Vr + 1);
  float* lse = lse_.get(C);
  model::LossSum loss;
  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t rows = std::min(C, N - n0);
    ops::gemm<float>(false, true, rows, Vr, H, 1.0f, X + n0 * H, W, 0.0f, logits);
    int64_t count = 0;
    loss.sum += vocab_parallel_cross_entropy_forward(lse, &count, logits, labels + n0, rows, Vr,
                                                     vocab_start_, comm);
    loss.count += count;
    if (token_losses != nullptr)
      token_loss(token_losses + n0, logits, lse, labels + n0, rows, comm);
    if (dX == nullptr) continue;
    float* dlogits = dlogits_.get(C * Vr + 1);
    vocab_parallel_cross_entropy_backward(dlogits, logits, lse, labels + n0, rows, Vr,
                                          vocab_start_, static_cast<float>(loss_scale));
    ops::gemm<float>(false, false, rows, H, Vr, 1.0f, dlogits, W, 0.0f, dX + n0 * H);
    if (dW != nullptr) ops::linear_weight_grad(dW, dlogits, X + n0 * H, rows, H, Vr);
  }
  return loss;
}

void VocabParallelHeadLoss::token_loss(double* out, const float* logits, const float* lse,
                                       const int32_t* labels, int64_t rows,
                                       comm::Communicator& comm) const {
  std::vector<double> target(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t local = int64_t(labels[r]) - vocab_start_;
    if (labels[r] != data::kIgnoreIndex && local >= 0 && local < V_local_)
      target[size_t(r)] = logits[r * V_local_ + local];
  }
  comm.all_reduce(target.data(), rows);
  for (int64_t r = 0; r < rows; ++r)
    out[r] = labels[r] == data::kIgnoreIndex ? 0.0 : double(lse[r]) - target[size_t(r)];
}

}  // namespace longtron::parallel
