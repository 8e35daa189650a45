#include "train/optimizer.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::train {

AdamW::AdamW(const model::ParamTable& layout, const OptimizerConfig& config, comm::CommPtr zero1)
    : layout_(layout), config_(config), zero1_(std::move(zero1)) {
  check(config.lr > 0, "optimizer.lr must be > 0, got {}", config.lr);
  const int64_t n = layout.numel();
  const int z = zero1_ ? zero1_->size() : 1;
  chunk_ = (n + z - 1) / z;
  const int r = zero1_ ? zero1_->rank() : 0;
  begin_ = std::min<int64_t>(n, r * chunk_);
  end_ = std::min<int64_t>(n, begin_ + chunk_);
  m_ = ZeroedBuffer<float>(static_cast<size_t>(end_ - begin_));
  v_ = ZeroedBuffer<float>(static_cast<size_t>(end_ - begin_));
  // The views that intersect this rank's slice, from begin_: weight decay differs per view.
  for (const auto& view : layout_.views()) {
    const int64_t lo = std::max(begin_, view.offset);
    const int64_t hi = std::min(end_, view.offset + view.numel);
    if (lo < hi) ranges_.push_back({lo - begin_, hi - begin_, view.is_matrix});
    covered_ += std::max<int64_t>(0, hi - lo);
  }
}

ops::AdamWArgs AdamW::args(double lr, int64_t step, double grad_scale) const {
  return ops::AdamWArgs{static_cast<float>(lr),
                        static_cast<float>(config_.beta1),
                        static_cast<float>(config_.beta2),
                        static_cast<float>(config_.eps),
                        static_cast<float>(config_.weight_decay),
                        step,
                        static_cast<float>(grad_scale)};
}

std::vector<int64_t> AdamW::shard_counts() const {
  const int64_t n = layout_.numel();
  const int z = zero1_->size();
  std::vector<int64_t> counts(static_cast<size_t>(z));
  for (int r = 0; r < z; ++r)
    counts[r] = std::min<int64_t>(n, (r + 1) * chunk_) - std::min<int64_t>(n, r * chunk_);
  return counts;
}

void AdamW::update(model::Params<float>& params, const model::Params<float>& grads, double lr,
                   ops::Bf16WeightCopy& copy, double grad_scale) {
  ++step_;
  // The bf16 copy's bits of the whole buffer when `copy` mirrors it (stale until end_update).
  uint16_t* const bits = copy.begin_update(params.data(), params.numel());
  // One pass over the slice (every view, decay per view); the moments are indexed from begin_.
  last_ = ops::adamw_update(params.data() + begin_, m_.data(), v_.data(), grads.data() + begin_,
                            ranges_, args(lr, step_, grad_scale), bits ? bits + begin_ : nullptr);
  // In place: each rank's slice already sits at its offset of the flat buffer, so no scratch.
  const bool sharded = zero1_ && zero1_->size() > 1;
  if (sharded) zero1_->all_gather_v(params.data(), params.data() + begin_, shard_counts());
  if (bits == nullptr) return;
  // The rest of the copy: the other ranks' slices (just gathered) and any element of this slice
  // no view covers (none in a ParamTable, whose views tile the buffer: kept safe).
  if (covered_ != end_ - begin_)
    ops::round_to_bf16(params.data() + begin_, end_ - begin_, bits + begin_);
  if (sharded) {
    ops::round_to_bf16(params.data(), begin_, bits);
    ops::round_to_bf16(params.data() + end_, params.numel() - end_, bits + end_);
  }
  copy.end_update();
}

bool AdamW::update_is_finite(const model::Params<float>& params, const model::Params<float>& grads,
                             double lr, double grad_max_abs, double grad_scale) const {
  const ops::AdamWArgs a = args(lr, step_ + 1, grad_scale);
  // What the last update wrote bounds what this one can reach: no pass over the buffers when
  // that proves every value finite (the usual step); else the exact check.
  if (last_ && ops::adamw_bounds_imply_finite(*last_, grad_max_abs, a)) return true;
  return ops::adamw_update_is_finite(params.data() + begin_, m_.data(), v_.data(),
                                     grads.data() + begin_, ranges_, a);
}

void AdamW::gather_state(model::Params<float>& exp_avg, model::Params<float>& exp_avg_sq) const {
  check(exp_avg.numel() == layout_.numel() && exp_avg_sq.numel() == layout_.numel(),
        "AdamW::gather_state: buffers of {} and {} elements, layout of {}", exp_avg.numel(),
        exp_avg_sq.numel(), layout_.numel());
  const bool sharded = zero1_ && zero1_->size() > 1;
  for (auto [full, mine] : {std::pair{&exp_avg, &m_}, std::pair{&exp_avg_sq, &v_}}) {
    std::copy(mine->begin(), mine->end(), full->data() + begin_);
    if (sharded) zero1_->all_gather_v(full->data(), full->data() + begin_, shard_counts());
  }
}

void AdamW::load_state(const model::Params<float>& exp_avg, const model::Params<float>& exp_avg_sq) {
  check(exp_avg.numel() == layout_.numel() && exp_avg_sq.numel() == layout_.numel(),
        "AdamW::load_state: buffers of {} and {} elements, layout of {}", exp_avg.numel(),
        exp_avg_sq.numel(), layout_.numel());
  std::copy(exp_avg.data() + begin_, exp_avg.data() + end_, m_.begin());
  std::copy(exp_avg_sq.data() + begin_, exp_avg_sq.data() + end_, v_.begin());
  last_.reset();  // moments not written by an update: the next check reads them
}

std::vector<NamedTensor> named_tensors(const model::Params<float>& buffer, const std::string& prefix) {
  std::vector<NamedTensor> out;
  const auto& views = buffer.layout().views();
  for (size_t i = 0; i < views.size(); ++i)
    out.push_back({prefix + views[i].name, views[i].shape, buffer.ptr(static_cast<int>(i))});
  return out;
}

std::vector<MutableTensor> mutable_tensors(model::Params<float>& buffer, const std::string& prefix) {
  std::vector<MutableTensor> out;
  const auto& views = buffer.layout().views();
  for (size_t i = 0; i < views.size(); ++i)
    out.push_back({prefix + views[i].name, views[i].shape, buffer.ptr(static_cast<int>(i))});
  return out;
}

}  // namespace longtron::train
