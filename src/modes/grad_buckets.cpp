// Gradient buckets reduced during backward (see grad_buckets.h).
#include "modes/grad_buckets.h"

#include <algorithm>
#include <limits>

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
  issued_.assign(buckets_.size(), false);
}

void GradientBuckets::start(comm::Communicator& comm, float* data) {
  check(!armed(), "gradient buckets: a backward pass starts while the last one's reduction is "
        "still in flight (finish_gradients was not called)");
  comm_ = &comm;
  replica_ = nullptr;
  data_ = data;
  scratch_ = nullptr;
  counts_.clear();
  std::fill(issued_.begin(), issued_.end(), false);
  flights_.clear();
  flights_.reserve(buckets_.size() + rest_.size());
  cursor_ = 0;
}

void GradientBuckets::start_slices(comm::Communicator& zero1, comm::Communicator& replica,
                                   float* data, std::vector<int64_t> counts, float* scratch) {
  check(int64_t(counts.size()) == zero1.size() && zero1.size() > 1,
        "gradient buckets: {} slice counts for a zero1 group of {} ranks", counts.size(),
        zero1.size());
  int64_t total = 0;
  for (int r = 0; r < zero1.size(); ++r) {
    check(counts[size_t(r)] >= 0, "gradient buckets: negative slice count {}", counts[size_t(r)]);
    if (r == zero1.rank()) slice_begin_ = total;
    total += counts[size_t(r)];
  }
  const int64_t covered = std::max(buckets_.empty() ? 0 : buckets_.back().end,
                                   rest_.empty() ? 0 : rest_.back().second);
  check(total >= covered, "gradient buckets: slices of {} elements for a buffer of {}", total,
        covered);
  start(zero1, data);
  slice_end_ = slice_begin_ + counts[size_t(zero1.rank())];
  counts_ = std::move(counts);
  replica_ = &replica;
  scratch_ = scratch;
}

void GradientBuckets::launch(int64_t begin, int64_t end) {
  Flight& f = flights_.emplace_back();
  f.begin = begin;
  f.end = end;
  f.phase = 1;
  if (!slices()) {
    f.work = comm_->all_reduce_async(data_ + f.begin, f.end - f.begin);
    return;
  }
  // Chunk r of this range: its intersection with slice r.
  std::vector<int64_t> chunk(counts_.size());
  int64_t slice = 0;
  for (size_t r = 0; r < counts_.size(); ++r) {
    const int64_t lo = std::max(f.begin, slice), hi = std::min(f.end, slice + counts_[r]);
    chunk[r] = std::max<int64_t>(0, hi - lo);
    slice += counts_[r];
  }
  float* recv = scratch_ + std::clamp(f.begin, slice_begin_, slice_end_) - slice_begin_;
  f.work = comm_->reduce_scatter_v_async(recv, data_ + f.begin, chunk);
}

void GradientBuckets::advance(Progress how) {
  // With replica groups the replica all-reduces are issued only at points every rank passes in
  // the same order (before each stage's buckets, and in finish), so that every rank issues the
  // collectives of both groups in one order (the order check, LONGTRON_COMM_CHECK, blocks at each
  // issue: orders that differ between ranks could wait on each other in a cycle).
  const bool chained = slices() && replica_->size() > 1;
  bool in_order = true;  // every earlier flight's first collective is complete and handled
  for (size_t i = cursor_; i < flights_.size(); ++i) {
    Flight& f = flights_[i];
    if (f.phase == 1) {
      if (how == Progress::kPoll) f.work.test();  // progresses it, releases it when complete
      else f.work.wait();
      if (f.work.pending() || !in_order || (chained && how == Progress::kPoll)) {
        in_order = false;
        continue;
      }
      f.phase = 3;
      if (slices()) {  // the received part of this rank's slice goes home, then to the replicas
        const int64_t lo = std::clamp(f.begin, slice_begin_, slice_end_);
        const int64_t hi = std::clamp(f.end, slice_begin_, slice_end_);
        std::copy(scratch_ + (lo - slice_begin_), scratch_ + (hi - slice_begin_), data_ + lo);
        if (chained && hi > lo) {
          f.work = replica_->all_reduce_async(data_ + lo, hi - lo);
          f.phase = 2;
        }
      }
    }
    if (f.phase == 2) {
      if (how == Progress::kAll) f.work.wait();
      else f.work.test();
      if (!f.work.pending()) f.phase = 3;
    }
    if (i == cursor_ && f.phase == 3) ++cursor_;
  }
}

void GradientBuckets::on_backward(int layer, bool complete) {
  if (!armed()) return;
  if (complete) {
    bool first = true;
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!issued_[b] && buckets_[b].stage == layer) {
        if (first) advance(Progress::kIssue);  // the replica all-reduces of earlier stages
        first = false;
        issued_[b] = true;
        launch(buckets_[b].begin, buckets_[b].end);
      }
  }
  // Progress: any MPI call advances every pending non-blocking collective; testing each also
  // releases the finished ones.
  advance(Progress::kPoll);
}

void GradientBuckets::finish() {
  if (!armed()) return;
  // Stages in backward order: num_layers, ..., 0, -1; each stage's buckets issued as its
  // backward point does (a rank without rows issues them all here, in the same order).
  std::vector<size_t> order(buckets_.size());
  for (size_t b = 0; b < order.size(); ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buckets_[a].stage > buckets_[b].stage; });
  int stage = std::numeric_limits<int>::max();
  for (size_t b : order)
    if (!issued_[b]) {
      if (buckets_[b].stage != stage) advance(Progress::kIssue);
      stage = buckets_[b].stage;
      issued_[b] = true;
      launch(buckets_[b].begin, buckets_[b].end);
    }
  if (!rest_.empty()) advance(Progress::kIssue);
  for (const auto& [begin, end] : rest_) launch(begin, end);
  advance(Progress::kAll);
  disarm();
}

void GradientBuckets::abandon() {
  if (armed()) advance(Progress::kAll);  // the same chains on every rank: nothing half-issued
  disarm();
}

void GradientBuckets::disarm() {
  flights_.clear();
  cursor_ = 0;
  comm_ = nullptr;
  replica_ = nullptr;
  data_ = nullptr;
  scratch_ = nullptr;
  counts_.clear();
}

}  // namespace longtron::parallel
