// The fixed order in which the varlen attention backwards (attention_backward.cpp,
// attention_bf16.cpp) add the dQ tiles of their key blocks into a shared query tile. Every key
// block of a (segment, kv head) adds its dS·K tile into each query tile it sees; the adds happen
// in increasing key-block order whatever thread runs which block, so dQ is bitwise the same for
// any number of threads and any schedule (FlashAttention-3's deterministic backward serialises
// its dQ atomic adds the same way, with a semaphore per query tile; Shah et al. 2024).
//
// Waiting is deadlock-free because ordered_items() hands the key blocks of one (segment, kv head)
// out in increasing order: the earliest unfinished one of a chain never waits, since every block
// before it has added into all of its tiles.
#pragma once
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

#include "ops/attention_plan.h"

namespace longtron::ops::detail {

/// One turn counter per query tile (tile = global query block · num_kv_heads + kv head): the key
/// block (index within its segment) whose dQ add is next. The key blocks that see a query tile
/// are consecutive (visibility is monotone in the key position), so a turn passes to block + 1.
class DqOrder {
 public:
  /// `p`: a backward plan (plan_attention(s, true, ...)); tiles = p.q_blocks · num_kv_heads.
  DqOrder(const AttnPlan& p, int64_t num_kv_heads)
      : next_(new std::atomic<int64_t>[static_cast<size_t>(p.q_blocks * num_kv_heads)]) {
    const int64_t tiles = p.q_blocks * num_kv_heads;
    for (int64_t t = 0; t < tiles; ++t) next_[t].store(std::numeric_limits<int64_t>::max());
    for (const AttnItem& it : p.items)
      for (int64_t i = it.first; i < it.last; ++i) {
        std::atomic<int64_t>& a = next_[tile(p, num_kv_heads, it, i)];
        if (it.block < a.load(std::memory_order_relaxed)) a.store(it.block, std::memory_order_relaxed);
      }
  }

  /// The tile of query block `i` (within item `it`'s segment) for `it`'s kv head.
  static int64_t tile(const AttnPlan& p, int64_t num_kv_heads, const AttnItem& it, int64_t i) {
    return (p.segments[static_cast<size_t>(it.seg)].q_block0 + i) * num_kv_heads + it.kv_head;
  }

  /// Blocks until key block `block` may add into tile `t` (acquire: sees the earlier adds).
  void wait(int64_t t, int64_t block) const {
    const std::atomic<int64_t>& a = next_[t];
    for (int64_t v = a.load(std::memory_order_acquire); v != block;
         v = a.load(std::memory_order_acquire))
      a.wait(v, std::memory_order_acquire);
  }

  /// Key block `block` has added into tile `t` (or has nothing to add): the next block's turn.
  void pass(int64_t t, int64_t block) {
    next_[t].store(block + 1, std::memory_order_release);
    next_[t].notify_all();
  }

 private:
  std::unique_ptr<std::atomic<int64_t>[]> next_;
};

/// Claims the items of a parallel region in increasing index order (what DqOrder's waits need;
/// OpenMP's dynamic schedule does not promise an order). Shared by the threads of the region.
class ItemCounter {
 public:
  /// The next unclaimed index (>= n: none left).
  int64_t claim() { return next_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> next_{0};
};

}  // namespace longtron::ops::detail
