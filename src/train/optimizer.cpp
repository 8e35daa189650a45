#include "train/optimizer.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::train {

AdamW::AdamW(const model::ParamLayout& layout, const OptimizerConfig& config, comm::CommPtr zero1)
    : layout_(layout), config_(config), zero1_(std::move(zero1)), m_(layout), v_(layout) {
  check(config.lr > 0, "optimizer.lr must be > 0, got {}", config.lr);
  const int64_t n = layout.numel();
  const int z = zero1_ ? zero1_->size() : 1;
  chunk_ = (n + z - 1) / z;
  const int r = zero1_ ? zero1_->rank() : 0;
  begin_ = std::min<int64_t>(n, r * chunk_);
  end_ = std::min<int64_t>(n, begin_ + chunk_);
}

void AdamW::update(model::Params<float>& params, const model::Params<float>& grads, double lr) {
  ++step_;
  // Walk the views that intersect this rank's slice: weight decay differs per view.
  for (const auto& view : layout_.views()) {
    const int64_t lo = std::max(begin_, view.offset);
    const int64_t hi = std::min(end_, view.offset + view.numel);
    if (lo >= hi) continue;
    const float decay = view.is_matrix ? static_cast<float>(config_.weight_decay) : 0.0f;
    ops::adamw_update(params.data() + lo, m_.data() + lo, v_.data() + lo, grads.data() + lo, hi - lo,
                      static_cast<float>(lr), static_cast<float>(config_.beta1),
                      static_cast<float>(config_.beta2), static_cast<float>(config_.eps), decay,
                      step_);
  }
  if (zero1_ && zero1_->size() > 1) {
    // All-gather needs equal chunks: pad the tail through a scratch buffer of Z·chunk floats.
    const int64_t n = layout_.numel();
    const int z = zero1_->size();
    std::vector<float> gathered(static_cast<size_t>(chunk_ * z));
    std::vector<float> mine(static_cast<size_t>(chunk_), 0.0f);
    std::copy(params.data() + begin_, params.data() + end_, mine.begin());
    zero1_->all_gather(gathered.data(), mine.data(), chunk_);
    std::copy(gathered.begin(), gathered.begin() + n, params.data());
  }
}

void AdamW::gather_state() {
  if (!zero1_ || zero1_->size() <= 1) return;
  const int64_t n = layout_.numel();
  const int z = zero1_->size();
  std::vector<float> gathered(static_cast<size_t>(chunk_ * z));
  std::vector<float> mine(static_cast<size_t>(chunk_));
  for (auto* buf : {&m_, &v_}) {
    std::fill(mine.begin(), mine.end(), 0.0f);
    std::copy(buf->data() + begin_, buf->data() + end_, mine.begin());
    zero1_->all_gather(gathered.data(), mine.data(), chunk_);
    std::copy(gathered.begin(), gathered.begin() + n, buf->data());
  }
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

std::vector<NamedTensor> AdamW::named_exp_avg() const { return named_tensors(m_); }
std::vector<NamedTensor> AdamW::named_exp_avg_sq() const { return named_tensors(v_); }
std::vector<MutableTensor> AdamW::mutable_exp_avg() { return mutable_tensors(m_); }
std::vector<MutableTensor> AdamW::mutable_exp_avg_sq() { return mutable_tensors(v_); }

}  // namespace longtron::train
