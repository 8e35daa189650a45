// Shared by the varlen attention forward and backward: validation of an AttentionShape and the
// list of (segment, kv head, block) work items, largest first, so a dynamic OpenMP schedule
// keeps threads busy when one long document dominates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/ops.h"

namespace longtron::ops::detail {

/// Query and key block size (FlashAttention-2 Br = Bc).
constexpr int64_t kAttnBlock = 64;

struct AttnItem {
  int64_t seg_begin;    // first token of the segment
  int64_t seg_end;      // one past its last token
  int64_t block;        // query block (forward) or key block (backward) inside the segment
  int64_t kv_head;
  int64_t block_id;     // global index of this block over all segments (backward locks)
};

/// A buffer of at least n elements kept per calling thread and slot between calls: the packed
/// tiles of one attention call are tens of MB, and allocating them afresh each call costs page
/// faults (≈5% of the kernel). Contents are unspecified; the memory is kept until thread exit.
template <typename T>
T* workspace(int slot, size_t n) {
  static thread_local std::vector<T> buffers[4];
  std::vector<T>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

/// Throws longtron::Error unless cu_seqlens is 0, non-decreasing, ends at num_tokens, and the
/// head counts, head_dim and strides are consistent.
void validate_attention_shape(const AttentionShape& s);

/// One item per (segment, kv head, block). Forward items cost block + 1 key blocks, backward
/// items cost (blocks − block) query blocks; sorted by that cost, largest first.
std::vector<AttnItem> attention_items(const AttentionShape& s, bool backward,
                                      int64_t* total_blocks);

}  // namespace longtron::ops::detail
