#include "ops/compute_context.h"

#include "core/error.h"
#include "ops/attention_plan.h"
#include "ops/ops.h"

namespace longtron::ops {

void Bf16WeightCopy::attach(const float* weights, int64_t n) {
  base_ = weights;
  n_ = weights != nullptr && n > 0 ? n : 0;
  release();
}

const uint16_t* Bf16WeightCopy::of(const float* x, int64_t n) {
  if (base_ == nullptr || x < base_ || x + n > base_ + n_) return nullptr;
  if (!valid_) {
    bits_.resize(static_cast<size_t>(n_));
    round_to_bf16(base_, n_, bits_.data());
    valid_ = true;
  }
  return bits_.data() + (x - base_);
}

uint16_t* Bf16WeightCopy::begin_update(const float* weights, int64_t n) {
  if (base_ == nullptr || weights != base_ || n != n_ || bits_.empty()) return nullptr;
  valid_ = false;  // until end_update: a throw in between leaves the copy to be remade
  return bits_.data();
}

void Bf16WeightCopy::release() {
  std::vector<uint16_t>().swap(bits_);
  valid_ = false;
}

SharedRoundings::Sharing SharedRoundings::share(const float* x, int64_t n,
                                                const uint16_t* bits) const {
  if (x == nullptr || n <= 0) return Sharing{};
  for (int slot = 0; slot < kMax; ++slot) {
    if (entries_[slot].x != nullptr) continue;
    entries_[slot] = Entry{x, n, bits};
    return Sharing{this, slot};
  }
  fail("internal: more than {} activations' roundings shared at once", kMax);
}

void ComputeContext::set_type(ComputeType type) {
  type_ = type;
  weights_.release();  // made again on the first read under kBFloat16
}

int64_t ComputeContext::attention_arena_bytes() { return detail::attention_arena_bytes(); }

const ComputeContext& ComputeContext::fp32() {
  static const ComputeContext context(ComputeType::kFloat32);
  return context;
}

}  // namespace longtron::ops
