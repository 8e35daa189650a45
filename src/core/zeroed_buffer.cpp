// Zero-filled buffers without a memset (see zeroed_buffer.h).
#include "core/zeroed_buffer.h"

#include <sys/mman.h>

#include <atomic>
#include <new>

namespace longtron {
namespace {
std::atomic<int64_t> g_allocated{0};
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

int64_t zeroed_bytes_allocated() { return g_allocated.load(std::memory_order_relaxed); }

void* detail::zeroed_allocate(size_t n, size_t size) {
  if (n == 0) return nullptr;
  size_t bytes = 0;
  if (__builtin_mul_overflow(n, size, &bytes)) throw std::bad_alloc();
  void* p = std::calloc(n, size);
  if (p == nullptr) throw std::bad_alloc();
  g_allocated.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
#ifdef MADV_HUGEPAGE
  // Large buffers: 2 MiB pages where the kernel has them (transparent_hugepage = madvise), so the
  // first write faults once per 2 MiB instead of once per 4 KiB. Advice only; failure is harmless.
  if (bytes >= 2 * kHugePage) {
    const auto first = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
    const auto last = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHugePage - 1);
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#endif
  return p;
}

}  // namespace longtron
