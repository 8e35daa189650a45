// Zero-filled buffers that cost nothing until written: the memory comes from calloc, so n zeros
// are not memset (glibc's calloc hands out the fresh pages of a large allocation untouched; the
// kernel zeroes each page at its first write). The parameter, gradient and optimizer buffers use
// it: a buffer that is loaded or drawn before it is read is written once, not zero-filled first.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

namespace longtron {

/// Bytes allocated by ZeroedBuffer since the process started (never decreases). Tests use it to
/// check what a start-up allocates (e.g. no full-model copy when loading into shards).
int64_t zeroed_bytes_allocated();

namespace detail {
/// calloc(n, size) (no huge-page advice: on a virtual machine, faulting in 2 MiB pages measured
/// 4-5 times slower than 4 KiB ones). Returns nullptr for n == 0; throws std::bad_alloc on failure.
void* zeroed_allocate(size_t n, size_t size);
}  // namespace detail

/// A fixed-size array of n arithmetic values, all 0 at construction (all-zero bits are 0 for
/// integers and IEEE floats) without writing them. Copying copies the values.
template <typename T>
class ZeroedBuffer {
  static_assert(std::is_arithmetic_v<T>, "ZeroedBuffer is for numbers (all-zero bits = 0)");

 public:
  ZeroedBuffer() = default;
  explicit ZeroedBuffer(size_t n)
      : data_(static_cast<T*>(detail::zeroed_allocate(n, sizeof(T)))), size_(n) {}
  ZeroedBuffer(const ZeroedBuffer& o) : ZeroedBuffer(o.size_) {
    if (size_ > 0) std::memcpy(data_, o.data_, size_ * sizeof(T));
  }
  ZeroedBuffer(ZeroedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ZeroedBuffer& operator=(ZeroedBuffer o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~ZeroedBuffer() { std::free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace longtron
