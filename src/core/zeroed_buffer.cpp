// Zero-filled buffers without a memset (see zeroed_buffer.h).
#include "core/zeroed_buffer.h"

#include <atomic>
#include <new>

namespace longtron {
namespace {
std::atomic<int64_t> g_allocated{0};
}  // namespace

int64_t zeroed_bytes_allocated() { return g_allocated.load(std::memory_order_relaxed); }

void* detail::zeroed_allocate(size_t n, size_t size) {
  if (n == 0) return nullptr;
  size_t bytes = 0;
  if (__builtin_mul_overflow(n, size, &bytes)) throw std::bad_alloc();
  void* p = std::calloc(n, size);
  if (p == nullptr) throw std::bad_alloc();
  g_allocated.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return p;
}

}  // namespace longtron
