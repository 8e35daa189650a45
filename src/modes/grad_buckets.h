// The data-parallel gradient reduction overlapped with backward (docs/parallel.md, "Overlapping
// the gradient reduction"): the flat gradient buffer cut into buckets in the order backward
// completes them, each all-reduced as soon as its last gradient is written, as PyTorch DDP's
// bucketed all-reduce (Li et al. 2020, "PyTorch Distributed") and Megatron-LM's
// overlap_grad_reduce do.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"

namespace longtron::parallel {

/// Buckets of a flat gradient buffer and their in-flight all-reduces for one backward pass.
/// A view's stage is the backward point (model::InternLM2::set_backward_hook) after which its
/// gradient is final: num_layers for the final norm and an untied output head, its block's index
/// for a block's tensors, −1 for everything else (the embedding, a tied head, any tensor the
/// model does not place in a block). Consecutive views of one stage form one bucket; views that
/// are not `eligible` (their gradient still takes a sum over another group after backward) are
/// left to rest(), reduced after backward. Only the views of the layout are used, so a layout
/// whose gradient buffer holds some tensors only (e.g. trainable adapters) buckets just those.
class GradientBuckets {
 public:
  /// One contiguous range [begin, end) of the flat buffer that one all-reduce sums.
  struct Bucket {
    int64_t begin = 0, end = 0;
    int stage = 0;
  };

  /// Cuts `layout` (the gradient buffer's) into buckets; `eligible(view index)` says whether a
  /// view may be reduced during backward.
  GradientBuckets(const model::ParamTable& layout, const std::function<bool(int)>& eligible);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// The ranges reduced after backward (views not eligible), in buffer order.
  const std::vector<std::pair<int64_t, int64_t>>& rest() const { return rest_; }

  /// Arms one backward pass: the buckets of each stage will be all-reduced in place over `comm`
  /// in data[], starting at the backward point of that stage (on_backward). Throws Error while
  /// an earlier pass is still in flight.
  void start(comm::Communicator& comm, float* data);
  /// The model's backward hook: with complete = true starts the all-reduce of every bucket of
  /// stage `layer`; in every call tests (MPI_Test) the all-reduces in flight, so that MPI
  /// progresses them between pieces of computation. Does nothing unless armed.
  void on_backward(int layer, bool complete);
  /// After backward: starts the buckets not started yet (in stage order), all-reduces rest()
  /// (blocking) and waits for every bucket. Collective over the armed communicator, in the same
  /// order on every rank. Disarms.
  void finish();
  /// Whether a pass is armed (started and not finished).
  bool armed() const { return comm_ != nullptr; }
  /// Waits for whatever is in flight and disarms, without reducing rest() (zero_grads of a
  /// step that never finished: the buffer is discarded).
  void abandon();

 private:
  void issue(size_t bucket);
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int64_t, int64_t>> rest_;
  std::vector<comm::Work> work_;  // per bucket
  std::vector<bool> issued_;
  comm::Communicator* comm_ = nullptr;
  float* data_ = nullptr;
};

}  // namespace longtron::parallel
