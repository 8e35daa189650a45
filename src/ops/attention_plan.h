// Shared by the varlen attention forward and backward: validation of an AttentionShape, the
// segments with their query and key ranges, the visibility rule (causal, bottom-right aligned,
// optional sliding window), and the list of (segment, kv head, block) work items, largest first,
// so a dynamic OpenMP schedule keeps threads busy when one long document dominates.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/grow_buffer.h"

#include "ops/ops.h"

namespace longtron::ops::detail {

/// Query block size (FlashAttention-2 Br), and the key block size Bc of the forward.
constexpr int64_t kAttnBlock = 64;
/// Key block size of the backwards (fp32/double and bf16): each query tile (q, dO and the shared
/// dq, G·64×d tiles that come from beyond L2) then serves 128 keys, halving that traffic per FLOP.
constexpr int64_t kAttnBackwardKeyBlock = 128;

/// One segment: queries [q_begin, q_begin + q_len) of q, keys [k_begin, k_begin + k_len) of k/v.
struct AttnSegment {
  int64_t q_begin, q_len, k_begin, k_len;
  int64_t q_block0, k_block0;  // global index of the segment's first query / key block
  int64_t key_block;           // key block size of the plan
  int64_t key_offset;          // query r sits at key position r + key_offset
  /// Query r sits at key position r + offset (bottom-right alignment, Lk − Lq, unless the shape
  /// gives key_offsets).
  int64_t offset() const { return key_offset; }
  int64_t q_blocks() const { return (q_len + kAttnBlock - 1) / kAttnBlock; }
  int64_t k_blocks() const { return (k_len + key_block - 1) / key_block; }
};

/// A work item: block `block` (a query block in the forward, a key block in the backward) of
/// segment `seg` for kv head `kv_head`, and the range [first, last) of blocks on the other side
/// that it visits (the only ones with a visible pair).
struct AttnItem {
  int64_t seg, block, kv_head, first, last;
};

/// Segments and work items of one call. Positions are local to the segment.
struct AttnPlan {
  std::vector<AttnSegment> segments;
  int64_t window = 0;
  int64_t key_block = kAttnBlock;
  int64_t q_blocks = 0, k_blocks = 0;  // totals over all segments
  std::vector<AttnItem> items;         // largest first
  std::vector<AttnItem> q_side;        // every (segment, query block, kv head), first = last = 0
  std::vector<AttnItem> k_side;        // every (segment, key block, kv head), first = last = 0
  /// Query r sees keys [key_lo, key_hi): causal at r + offset, at most `window` of them.
  int64_t key_lo(const AttnSegment& g, int64_t r) const {
    return window > 0 ? std::max<int64_t>(0, r + g.offset() - window + 1) : 0;
  }
  int64_t key_hi(const AttnSegment& g, int64_t r) const { return r + g.offset() + 1; }
  /// Key c is seen by queries [query_lo, query_hi) (empty when query_lo >= query_hi).
  int64_t query_lo(const AttnSegment& g, int64_t c) const {
    return std::max<int64_t>(0, c - g.offset());
  }
  int64_t query_hi(const AttnSegment& g, int64_t c) const {
    return window > 0 ? std::min(g.q_len, c - g.offset() + window) : g.q_len;
  }
};

/// The scratch arenas of the attention kernels, by what they hold. Each (arena, element type) is
/// one buffer per thread: the packed operands of a call on the calling thread, the tiles on every
/// worker thread.
enum class Arena : int {
  kKeys,         ///< forward: packed Kᵀ and V tiles (fp32), packed Kᵀ words (bf16)
  kValues,       ///< bf16 forward: packed V words
  kQueries,      ///< backward: packed q, dO, dq (fp32: also lse and D; bf16: the bf16 halves)
  kQueryFloats,  ///< bf16 backward: lse, D and the fp32 dq of the packed queries
  kDqWritten,    ///< backward: one flag per (query block, kv head) tile: dq written yet
  kTiles,        ///< the per-thread tiles of a work item (scratch_tiles)
  kCount
};

/// Bytes the attention arenas hold now, over every thread and element type (they are kept between
/// calls and grow to the largest call; the memory plan's attention workspace).
int64_t attention_arena_bytes();
/// Adds `bytes` to attention_arena_bytes() (called when an arena grows).
void count_attention_arena_bytes(int64_t bytes);

/// A buffer of at least n elements kept per calling thread and arena between calls: the packed
/// tiles of one attention call are tens of MB, and allocating them afresh each call costs page
/// faults (≈5% of the kernel). Contents are unspecified (zeros after growing); the memory is kept
/// until thread exit.
template <typename T>
T* workspace(Arena arena, size_t n) {
  static thread_local GrowBuffer<T, GrowFill::kZeroed> buffers[static_cast<int>(Arena::kCount)];
  GrowBuffer<T, GrowFill::kZeroed>& b = buffers[static_cast<int>(arena)];
  const size_t before = b.bytes();
  T* p = b.get(static_cast<int64_t>(n));
  if (b.bytes() != before) count_attention_arena_bytes(static_cast<int64_t>(b.bytes() - before));
  return p;
}

/// A tile of n elements inside a workspace (see scratch_tiles); indexes like a vector.
template <typename T>
struct ScratchTile {
  T* ptr = nullptr;
  size_t n = 0;
  T* data() const { return ptr; }
  T* begin() const { return ptr; }
  T* end() const { return ptr + n; }
  T& operator[](size_t i) const { return ptr[i]; }
  T& operator[](int64_t i) const { return ptr[i]; }
};

/// K tiles of the given sizes, one after another (each rounded up to 64 bytes) in the calling
/// thread's workspace<T>(Arena::kTiles): the per-thread tiles of a kernel, allocated once per thread and
/// reused by every later call (as std::vectors they cost each call page faults and a zero fill,
/// several % of the kernel). Contents are unspecified.
template <typename T, size_t K>
std::array<ScratchTile<T>, K> scratch_tiles(const std::array<int64_t, K>& sizes) {
  constexpr int64_t align = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;
  int64_t total = 0;
  for (int64_t n : sizes) total += (n + align - 1) / align * align;
  T* p = workspace<T>(Arena::kTiles, static_cast<size_t>(total));
  std::array<ScratchTile<T>, K> tiles;
  for (size_t i = 0; i < K; ++i) {
    tiles[i] = {p, static_cast<size_t>(sizes[i])};
    p += (sizes[i] + align - 1) / align * align;
  }
  return tiles;
}

/// Throws longtron::Error unless cu_seqlens (and cu_seqlens_k when given) start at 0, are
/// non-decreasing and end at num_tokens (num_kv_tokens), no segment has more queries than keys,
/// the window is >= 0, and the head counts, head_dim and strides are consistent.
void validate_attention_shape(const AttentionShape& s);

/// Validates s and lists its segments and work items. Forward items are query blocks visiting
/// key blocks, backward items key blocks visiting query blocks; each item's cost is the number
/// of blocks it visits, and items are sorted by it, largest first, except that in the backward
/// the key blocks of one (segment, kv head) come in increasing order (attention_dq_order.h).
/// Query blocks have kAttnBlock rows, key blocks key_block.
AttnPlan plan_attention(const AttentionShape& s, bool backward,
                        int64_t key_block = kAttnBlock);

}  // namespace longtron::ops::detail
