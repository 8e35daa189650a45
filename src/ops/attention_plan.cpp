#include "ops/attention_plan.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"

namespace longtron::ops::detail {

namespace {
std::atomic<int64_t> arena_bytes{0};
}  // namespace

int64_t attention_arena_bytes() { return arena_bytes.load(std::memory_order_relaxed); }
void count_attention_arena_bytes(int64_t bytes) {
  arena_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

namespace {

void validate_offsets(const int32_t* cu, int64_t segments, int64_t total, const char* name,
                      const char* what) {
  check(cu[0] == 0, "attention: {}[0] must be 0, got {}", name, cu[0]);
  for (int64_t i = 0; i < segments; ++i) {
    check(cu[i + 1] >= cu[i],
          "attention: {} must be non-decreasing, but {}[{}] = {} > {}[{}] = {}", name, name, i,
          cu[i], name, i + 1, cu[i + 1]);
  }
  check(cu[segments] == total, "attention: {} ends at {} but there are {} {}", name,
        cu[segments], total, what);
}

}  // namespace

void validate_attention_shape(const AttentionShape& s) {
  check(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0,
        "attention: num_heads {} must be a positive multiple of num_kv_heads {}", s.num_heads,
        s.num_kv_heads);
  check(s.head_dim > 0, "attention: head_dim must be positive, got {}", s.head_dim);
  check(s.q_stride >= s.num_heads * s.head_dim,
        "attention: q_stride {} is less than num_heads × head_dim = {}", s.q_stride,
        s.num_heads * s.head_dim);
  check(s.kv_stride >= s.num_kv_heads * s.head_dim,
        "attention: kv_stride {} is less than num_kv_heads × head_dim = {}", s.kv_stride,
        s.num_kv_heads * s.head_dim);
  check(s.window >= 0, "attention: window must be >= 0 (0 = none), got {}", s.window);
  check(s.num_segments >= 1 && s.cu_seqlens != nullptr, "attention: cu_seqlens is empty");
  validate_offsets(s.cu_seqlens, s.num_segments, s.num_tokens, "cu_seqlens", "tokens");
  if (s.cu_seqlens_k == nullptr) return;
  validate_offsets(s.cu_seqlens_k, s.num_segments, s.num_kv_tokens, "cu_seqlens_k",
                   "key tokens (num_kv_tokens)");
  if (s.key_offsets != nullptr) return;  // any offset: queries may see no key at all
  for (int64_t i = 0; i < s.num_segments; ++i) {
    const int64_t lq = s.cu_seqlens[i + 1] - s.cu_seqlens[i];
    const int64_t lk = s.cu_seqlens_k[i + 1] - s.cu_seqlens_k[i];
    check(lq <= lk,
          "attention: segment {} has {} queries but only {} keys (queries are aligned to the end "
          "of their keys, so there must be at least as many keys)",
          i, lq, lk);
  }
}

AttnPlan plan_attention(const AttentionShape& s, bool backward, int64_t key_block) {
  validate_attention_shape(s);
  AttnPlan p;
  p.window = s.window;
  p.key_block = key_block;
  const int32_t* cu_k = s.cu_seqlens_k != nullptr ? s.cu_seqlens_k : s.cu_seqlens;
  for (int64_t i = 0; i < s.num_segments; ++i) {
    const int64_t lq = s.cu_seqlens[i + 1] - s.cu_seqlens[i], lk = cu_k[i + 1] - cu_k[i];
    const int64_t off =
        s.key_offsets != nullptr && s.cu_seqlens_k != nullptr ? s.key_offsets[i] : lk - lq;
    AttnSegment g{s.cu_seqlens[i], lq, cu_k[i], lk, p.q_blocks, p.k_blocks, key_block, off};
    p.q_blocks += g.q_blocks();
    p.k_blocks += g.k_blocks();
    p.segments.push_back(g);
  }
  std::vector<AttnItem> items;
  for (int64_t i = 0; i < s.num_segments; ++i) {
    const AttnSegment& g = p.segments[i];
    for (int64_t b = 0; b < (backward ? g.k_blocks() : g.q_blocks()); ++b) {
      int64_t first = 0, last = 0;
      if (backward) {  // query blocks that see any key of [c0, c1)
        const int64_t c0 = b * key_block, c1 = std::min(g.k_len, c0 + key_block);
        const int64_t lo = p.query_lo(g, c0), hi = p.query_hi(g, c1 - 1);
        if (lo < hi) first = lo / kAttnBlock, last = (hi + kAttnBlock - 1) / kAttnBlock;
      } else {  // key blocks seen by any query of [r0, r1)
        const int64_t r0 = b * kAttnBlock, r1 = std::min(g.q_len, r0 + kAttnBlock);
        const int64_t lo = std::clamp<int64_t>(p.key_lo(g, r0), 0, g.k_len);
        const int64_t hi = std::clamp<int64_t>(p.key_hi(g, r1 - 1), 0, g.k_len);
        if (lo < hi) first = lo / key_block, last = (hi + key_block - 1) / key_block;
      }
      for (int64_t h = 0; h < s.num_kv_heads; ++h) items.push_back({i, b, h, first, last});
    }
    for (int64_t b = 0; b < g.q_blocks(); ++b)
      for (int64_t h = 0; h < s.num_kv_heads; ++h) p.q_side.push_back({i, b, h, 0, 0});
    for (int64_t b = 0; b < g.k_blocks(); ++b)
      for (int64_t h = 0; h < s.num_kv_heads; ++h) p.k_side.push_back({i, b, h, 0, 0});
  }
  std::stable_sort(items.begin(), items.end(), [](const AttnItem& a, const AttnItem& b) {
    return a.last - a.first > b.last - b.first;
  });
  if (backward) {
    // The key blocks of one (segment, kv head) take the places that chain holds in the sorted
    // list in increasing block order (a window can make a later block costlier): the backward
    // adds dQ in block order and may wait only on blocks handed out earlier (attention_dq_order.h).
    const int64_t H = s.num_kv_heads;
    std::vector<std::vector<size_t>> places(static_cast<size_t>(s.num_segments * H));
    for (size_t x = 0; x < items.size(); ++x)
      places[static_cast<size_t>(items[x].seg * H + items[x].kv_head)].push_back(x);
    std::vector<AttnItem> ordered(items.size());
    for (const auto& chain : places) {
      std::vector<AttnItem> blocks;
      for (size_t x : chain) blocks.push_back(items[x]);
      std::sort(blocks.begin(), blocks.end(),
                [](const AttnItem& a, const AttnItem& b) { return a.block < b.block; });
      for (size_t y = 0; y < chain.size(); ++y) ordered[chain[y]] = blocks[y];
    }
    items = std::move(ordered);
  }
  p.items = std::move(items);
  return p;
}

}  // namespace longtron::ops::detail
