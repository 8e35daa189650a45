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

/// Buckets of a flat gradient buffer and their in-flight reductions for one backward pass.
/// A view's stage is the backward point (model::InternLM2::set_backward_hook) after which its
/// gradient is final: num_layers for the final norm and an untied output head, its block's index
/// for a block's tensors, −1 for everything else (the embedding, a tied head, any tensor the
/// model does not place in a block). Consecutive views of one stage form one bucket; views that
/// are not `eligible` (their gradient still takes a sum over another group after backward) are
/// left to rest(), reduced after backward. Only the views of the layout are used, so a layout
/// whose gradient buffer holds some tensors only (e.g. trainable adapters) buckets just those.
///
/// A pass either all-reduces each bucket in place (start) or, for ZeRO-1 (start_slices),
/// reduce-scatters it into the optimizer's contiguous slices of the whole buffer: bucket
/// [b, e) is a reduce_scatter_v whose chunk r is [b, e) ∩ slice r (empty chunks included), so
/// each rank receives the sum of its slice's part of the bucket only, as Megatron-LM's
/// distributed optimizer reduce-scatters its buckets; the ring bytes of all buckets together are
/// those of one reduce-scatter of the buffer. With replica groups (a zero1 group smaller than the
/// data-parallel group), each received part is then all-reduced over the replica group, issued
/// in the buckets' order at the next stage's backward point (waiting for its reduce-scatter
/// there), so that every rank issues the collectives of both groups in one order.
class GradientBuckets {
 public:
  /// One contiguous range [begin, end) of the flat buffer that one collective reduces.
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
  /// Arms one backward pass of ZeRO-1 (see the class comment): data[] is cut into zero1.size()
  /// contiguous slices of `counts` elements (zero1-rank order, summing to the buffer's length);
  /// afterwards this rank's slice of data[] holds the sum over zero1 (then over `replica`, when
  /// it has more than one rank), the rest of data[] is left as it was. `scratch` receives the
  /// reduce-scatters (this rank's slice length; it must not alias data). Throws Error while a
  /// pass is in flight or when counts does not fit.
  void start_slices(comm::Communicator& zero1, comm::Communicator& replica, float* data,
                    std::vector<int64_t> counts, float* scratch);
  /// The model's backward hook: with complete = true starts the reduction of every bucket of
  /// stage `layer`; in every call tests (MPI_Test) the reductions in flight, so that MPI
  /// progresses them between pieces of computation. Does nothing unless armed.
  void on_backward(int layer, bool complete);
  /// After backward: starts the buckets not started yet (in stage order), reduces rest() and
  /// waits for every bucket. Collective over the armed communicators, in the same order on every
  /// rank. Disarms.
  void finish();
  /// Whether a pass is armed (started and not finished).
  bool armed() const { return comm_ != nullptr; }
  /// Whether the armed pass reduce-scatters into slices (start_slices).
  bool slices() const { return !counts_.empty(); }
  /// The slice counts of the armed pass (empty for an all-reduce pass).
  const std::vector<int64_t>& slice_counts() const { return counts_; }
  /// Waits for whatever is in flight and disarms, without reducing rest() (zero_grads of a
  /// step that never finished: the buffer is discarded).
  void abandon();

 private:
  // One range's reduction: its first collective (all-reduce or reduce-scatter), then, for a
  // slice with replicas, the replica all-reduce.
  struct Flight {
    int64_t begin = 0, end = 0;  // the range of data[]
    comm::Work work;
    int phase = 0;  // 0 not issued, 1 first collective in flight, 2 replica all-reduce, 3 done
  };
  // Appends the flight of [begin, end) and issues its first collective.
  void launch(int64_t begin, int64_t end);
  // How far advance() moves the flights: kPoll tests them (a finished reduce-scatter is copied
  // home unless it has a replica all-reduce to issue); kIssue waits for every first collective
  // and issues the replica all-reduces, in flight order; kAll waits for everything.
  enum class Progress { kPoll, kIssue, kAll };
  void advance(Progress how);
  void disarm();
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int64_t, int64_t>> rest_;
  std::vector<Flight> flights_;      // issued in this order (buckets by stage, then rest)
  std::vector<bool> issued_;         // per bucket
  size_t cursor_ = 0;                // the first flight whose first collective may be pending
  comm::Communicator* comm_ = nullptr;     // all-reduce group, or the zero1 group
  comm::Communicator* replica_ = nullptr;  // slices: the replica group (size 1: none)
  float* data_ = nullptr;
  float* scratch_ = nullptr;
  std::vector<int64_t> counts_;  // slices: elements per zero1 rank; empty for all-reduce
  int64_t slice_begin_ = 0, slice_end_ = 0;
};

}  // namespace longtron::parallel
