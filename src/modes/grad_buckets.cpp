// Gradient buckets reduced during backward (see grad_buckets.h).
#include "modes/grad_buckets.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::parallel {
namespace {

// The backward point after which view v's gradient is final (see the class comment).
int stage_of(const model::ParamTable& layout, int v) {
  const model::ParamView& view = layout.view(v);
  if (view.layer >= 0) return view.layer;
  const int L = static_cast<int>(layout.config().num_layers);
  if (v == layout.norm) return L;
  if (v == layout.output && layout.output != layout.tok_embeddings) return L;
  return -1;
}

}  // namespace

GradientBuckets::GradientBuckets(const model::ParamTable& layout,
                                 const std::function<bool(int)>& eligible) {
  const int n = static_cast<int>(layout.views().size());
  for (int v = 0; v < n; ++v) {
    const model::ParamView& view = layout.view(v);
    if (view.numel == 0) continue;
    const int64_t begin = view.offset, end = view.offset + view.numel;
    if (!eligible(v)) {
      if (!rest_.empty() && rest_.back().second == begin) rest_.back().second = end;
      else rest_.emplace_back(begin, end);
      continue;
    }
    const int stage = stage_of(layout, v);
    if (!buckets_.empty() && buckets_.back().end == begin && buckets_.back().stage == stage)
      buckets_.back().end = end;
    else
      buckets_.push_back({begin, end, stage});
  }
  work_.resize(buckets_.size());
  issued_.assign(buckets_.size(), false);
}

void GradientBuckets::start(comm::Communicator& comm, float* data) {
  check(!armed(), "gradient buckets: a backward pass starts while the last one's reduction is "
        "still in flight (finish_gradients was not called)");
  comm_ = &comm;
  data_ = data;
  std::fill(issued_.begin(), issued_.end(), false);
}

void GradientBuckets::issue(size_t b) {
  const Bucket& k = buckets_[b];
  work_[b] = comm_->all_reduce_async(data_ + k.begin, k.end - k.begin);
  issued_[b] = true;
}

void GradientBuckets::on_backward(int layer, bool complete) {
  if (!armed()) return;
  if (complete)
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!issued_[b] && buckets_[b].stage == layer) issue(b);
  // Progress: any MPI call advances every pending non-blocking collective; testing each also
  // releases the finished ones.
  for (comm::Work& w : work_)
    if (w.pending()) w.test();
}

void GradientBuckets::finish() {
  if (!armed()) return;
  // Stages in backward order: num_layers, ..., 0, -1.
  std::vector<size_t> order(buckets_.size());
  for (size_t b = 0; b < order.size(); ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buckets_[a].stage > buckets_[b].stage; });
  for (size_t b : order)
    if (!issued_[b]) issue(b);
  for (const auto& [begin, end] : rest_) comm_->all_reduce(data_ + begin, end - begin);
  for (comm::Work& w : work_) w.wait();
  comm_ = nullptr;
  data_ = nullptr;
}

void GradientBuckets::abandon() {
  for (comm::Work& w : work_) w.wait();
  comm_ = nullptr;
  data_ = nullptr;
}

}  // namespace longtron::parallel
