// The compute context: what a float op computes in and the state that goes with it, as one object
// the engine owns and passes down (no thread-local mode, no process-wide copy). Ops that depend on
// the precision take it as their first argument; the model's ops hold a reference given when they
// are built.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/precision.h"

namespace longtron::ops {

/// The bf16 copy of one float weight buffer (the engine's parameters), made once and read by every
/// GEMM of a step (mixed precision as Megatron-LM's bf16 weight copies: fp32 master weights, one
/// bf16 copy). The copy is valid from its making until the weights are written; the writers keep
/// it so: the optimizer's update refreshes it in the same pass (begin_update/end_update), and
/// every other writer reaches the weights through an accessor that calls invalidate() (the
/// engine's params()). Results are bitwise those of rounding the weight at each GEMM. Not
/// thread-safe: GEMMs are issued from one thread.
class Bf16WeightCopy {
 public:
  /// Mirrors weights[0..n) (n >= 0), freeing any copy. nullptr detaches.
  void attach(const float* weights, int64_t n);
  /// The weights may have changed: the next reader remakes the copy.
  void invalidate() { valid_ = false; }
  /// Whether the copy holds the rounding of the current weights (made and not invalidated since).
  bool valid() const { return valid_; }
  /// The bf16 bits of x[0..n) (nearest even, as round_to_bf16), made now if stale, or nullptr
  /// when x[0..n) is not inside the mirrored weights. Valid until the copy is invalidated or
  /// remade.
  const uint16_t* of(const float* x, int64_t n);
  /// The optimizer's fused refresh: when `weights`[0..n) is the mirrored buffer and the copy is in
  /// use (made by a read since the last release), returns the bits of the whole buffer for the
  /// update to write the rounding of each weight it writes, in the same pass, and marks the copy
  /// stale until end_update(); else nullptr: another buffer (LoRA's adapters) leaves the copy as
  /// it is, and a copy nobody reads (float32) is not made by updates.
  uint16_t* begin_update(const float* weights, int64_t n);
  /// After begin_update: every weight of the buffer was written together with its rounding.
  void end_update() { valid_ = true; }
  /// Frees the copy (the next read makes it again).
  void release();
  /// Bytes the copy holds (0 before it was first made): the memory plan's item.
  int64_t bytes() const { return static_cast<int64_t>(bits_.size() * sizeof(uint16_t)); }

 private:
  const float* base_ = nullptr;
  int64_t n_ = 0;
  bool valid_ = false;
  std::vector<uint16_t> bits_;
};

/// bf16 bits a caller already holds for a float activation (bits = round_to_bf16 of it: a tensor
/// saved for backward in bf16, or its widening, or bits an op wrote beside its output), shared
/// with the mixed-precision GEMMs that read the activation while a Sharing lives, so that they
/// read the bits instead of rounding it again (the same bits, so the same products). At most
/// kMax sharings at a time; the activations must not change while shared. Not thread-safe:
/// GEMMs are issued from one thread.
class SharedRoundings {
 public:
  static constexpr int kMax = 4;
  /// Ends its sharing when destroyed (an empty one, default-made, shares nothing).
  class [[nodiscard]] Sharing {
   public:
    Sharing() = default;
    Sharing(const Sharing&) = delete;
    Sharing& operator=(const Sharing&) = delete;
    Sharing(Sharing&& o) noexcept : owner_(o.owner_), slot_(o.slot_) { o.owner_ = nullptr; }
    ~Sharing() {
      if (owner_ != nullptr) owner_->entries_[slot_] = Entry{};
    }

   private:
    friend class SharedRoundings;
    Sharing(const SharedRoundings* owner, int slot) : owner_(owner), slot_(slot) {}
    const SharedRoundings* owner_ = nullptr;
    int slot_ = 0;
  };
  /// Shares bits[0..n) as the rounding of x[0..n) (nothing for n <= 0). Throws longtron::Error
  /// when kMax sharings live.
  Sharing share(const float* x, int64_t n, const uint16_t* bits) const;
  /// The shared bits of x[0..n) when that range lies inside a shared one, else nullptr.
  const uint16_t* of(const float* x, int64_t n) const {
    for (const Entry& e : entries_)
      if (e.x != nullptr && x >= e.x && x + n <= e.x + e.n) return e.bits + (x - e.x);
    return nullptr;
  }

 private:
  struct Entry {
    const float* x = nullptr;
    int64_t n = 0;
    const uint16_t* bits = nullptr;
  };
  mutable Entry entries_[kMax];
};

/// The precision of float GEMMs and attention, and its state: the compute type and the bf16 copy
/// of the weights. Owned by the engine (parallel::ParallelEngine::compute()); the model's ops
/// keep a reference, so a type set after they were built applies to the next call. Double ops
/// ignore it.
class ComputeContext {
 public:
  explicit ComputeContext(ComputeType type = ComputeType::kFloat32) : type_(type) {}
  ComputeContext(const ComputeContext&) = delete;
  ComputeContext& operator=(const ComputeContext&) = delete;

  ComputeType type() const { return type_; }
  bool bf16() const { return type_ == ComputeType::kBFloat16; }
  /// Sets the compute type and frees any weight copy (the next read under kBFloat16 makes it).
  void set_type(ComputeType type);

  /// The bf16 weight copy (used only under kBFloat16). Mutable through a const context: ops read
  /// the copy, which is made lazily on the first read.
  Bf16WeightCopy& weights() const { return weights_; }

  /// The activations' roundings a caller shares with the GEMMs (used only under kBFloat16).
  const SharedRoundings& shared() const { return shared_; }

  /// Bytes held by the context's scratch: the weight copy and the attention kernels' arenas
  /// (ops/attention_plan.h), which are kept per thread between calls.
  int64_t weight_copy_bytes() const { return weights_.bytes(); }
  static int64_t attention_arena_bytes();

  /// A float32 context holding no weights: the precision of the context-free op overloads (tests,
  /// fp32-only parts such as LoRA's adapters).
  static const ComputeContext& fp32();

 private:
  ComputeType type_;
  mutable Bf16WeightCopy weights_;
  SharedRoundings shared_;
};

}  // namespace longtron::ops
