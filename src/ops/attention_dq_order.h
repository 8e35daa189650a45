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
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "ops/attention_plan.h"
#include "ops/kernel_isa.h"

LONGTRON_ISA_BEGIN

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

/// Hands out the items of a backward plan by chain (the key blocks of one (segment, kv head)),
/// each chain in increasing block order: a thread keeps to the chain it took and takes the next
/// whole chain, largest first, when it runs out; once every chain is taken, a thread that runs out
/// joins the chain with the most blocks left. Claimed as ItemCounter claimed in list order, two
/// threads worked the blocks b and b + 1 of one chain side by side: the later waited on the
/// earlier's dQ add into every query tile (DqOrder), whose dq tile then moved between the cores'
/// caches, and a thread descheduled on a shared machine stalled the other. dQ stays the same bits
/// (DqOrder fixes the order of the adds), and no wait deadlocks: the blocks of a chain are claimed
/// in increasing order, so the earliest unfinished block of a chain never waits. Shared by the
/// threads of the region; each keeps its chain in a local `chain` (start at −1).
class ChainClaim {
 public:
  explicit ChainClaim(const AttnPlan& p) {
    int64_t segs = 0, heads = 0;
    for (const AttnItem& it : p.items)
      segs = std::max(segs, it.seg + 1), heads = std::max(heads, it.kv_head + 1);
    std::vector<int64_t> chain_of(static_cast<size_t>(segs * heads), -1);
    std::vector<int64_t> cost;
    for (size_t x = 0; x < p.items.size(); ++x) {  // items of a chain are in block order
      const AttnItem& it = p.items[x];
      int64_t& c = chain_of[static_cast<size_t>(it.seg * heads + it.kv_head)];
      if (c < 0) c = static_cast<int64_t>(members_.size()), members_.emplace_back(), cost.push_back(0);
      members_[static_cast<size_t>(c)].push_back(static_cast<int64_t>(x));
      cost[static_cast<size_t>(c)] += it.last - it.first + 1;
    }
    order_.resize(members_.size());
    for (size_t c = 0; c < order_.size(); ++c) order_[c] = static_cast<int64_t>(c);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
    next_.reset(new std::atomic<int64_t>[members_.size()]);
    for (size_t c = 0; c < members_.size(); ++c) next_[c].store(0, std::memory_order_relaxed);
  }

  /// The next item (an index into p.items) for the thread whose chain is `chain`, or −1 when none
  /// is left.
  int64_t claim(int64_t& chain) {
    if (chain >= 0) {
      const int64_t x = take(chain);
      if (x >= 0) return x;
    }
    for (int64_t c = cursor_.fetch_add(1, std::memory_order_relaxed);
         c < static_cast<int64_t>(order_.size()); c = cursor_.fetch_add(1, std::memory_order_relaxed)) {
      chain = order_[static_cast<size_t>(c)];
      const int64_t x = take(chain);
      if (x >= 0) return x;
    }
    for (;;) {  // every chain taken: join the one with the most blocks left
      int64_t best = -1, left = 0;
      for (size_t c = 0; c < members_.size(); ++c) {
        const int64_t l = static_cast<int64_t>(members_[c].size()) -
                          next_[c].load(std::memory_order_relaxed);
        if (l > left) best = static_cast<int64_t>(c), left = l;
      }
      if (best < 0) return -1;
      chain = best;
      const int64_t x = take(chain);
      if (x >= 0) return x;
    }
  }

 private:
  int64_t take(int64_t c) {
    const auto& m = members_[static_cast<size_t>(c)];
    const int64_t k = next_[static_cast<size_t>(c)].fetch_add(1, std::memory_order_relaxed);
    return k < static_cast<int64_t>(m.size()) ? m[static_cast<size_t>(k)] : -1;
  }
  std::vector<std::vector<int64_t>> members_;  // per chain: item indices in block order
  std::vector<int64_t> order_;                 // chains, largest first
  std::unique_ptr<std::atomic<int64_t>[]> next_;
  std::atomic<int64_t> cursor_{0};
};

LONGTRON_ISA_END
