// The grow-only scratch buffer of the project: GEMM operand copies, attention tiles, the gathered
// inputs and partial outputs of the parallel ops.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace longtron {

/// What a GrowBuffer holds after it grows: kUninitialized (every element is written before it is
/// read, so the fill would be wasted work: ~1% of a bf16 training step for the GEMM operands) or
/// kZeroed (every element 0, for readers of a part nobody wrote, e.g. padding).
enum class GrowFill { kUninitialized, kZeroed };

/// A buffer that only grows: get(n) returns at least n elements, reallocating when the capacity is
/// smaller. Growing drops the old contents (the old block is freed first, so the peak is one
/// buffer) and fills the new block as kFill says; otherwise the contents are left as they are.
/// Pointers stay valid until the next get() that grows, or release(). Not thread-safe: one buffer
/// per thread or per op.
template <typename T, GrowFill kFill = GrowFill::kUninitialized>
class GrowBuffer {
 public:
  T* get(int64_t n) {
    const size_t want = n > 0 ? static_cast<size_t>(n) : 0;
    if (want > capacity_) {
      data_.reset();
      capacity_ = 0;  // (stays true if the allocation below throws)
      data_ = kFill == GrowFill::kZeroed ? std::make_unique<T[]>(want)
                                         : std::make_unique_for_overwrite<T[]>(want);
      capacity_ = want;
    }
    return data_.get();
  }
  /// The current block (nullptr before the first get that allocated).
  T* data() const { return data_.get(); }
  /// Elements the current block holds.
  size_t capacity() const { return capacity_; }
  /// Bytes the current block holds (what the memory plan counts).
  size_t bytes() const { return capacity_ * sizeof(T); }
  /// Frees the block.
  void release() {
    data_.reset();
    capacity_ = 0;
  }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

}  // namespace longtron
