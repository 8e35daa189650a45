#include "ops/attention_plan.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::ops::detail {

void validate_attention_shape(const AttentionShape& s) {
  check(s.cu_seqlens_k == nullptr && s.window == 0,
        "attention: separate key segments and sliding windows are not implemented yet");
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
  check(s.num_segments >= 1 && s.cu_seqlens != nullptr, "attention: cu_seqlens is empty");
  check(s.cu_seqlens[0] == 0, "attention: cu_seqlens[0] must be 0, got {}", s.cu_seqlens[0]);
  for (int64_t i = 0; i < s.num_segments; ++i) {
    check(s.cu_seqlens[i + 1] >= s.cu_seqlens[i],
          "attention: cu_seqlens must be non-decreasing, but cu_seqlens[{}] = {} > cu_seqlens[{}] "
          "= {}",
          i, s.cu_seqlens[i], i + 1, s.cu_seqlens[i + 1]);
  }
  check(s.cu_seqlens[s.num_segments] == s.num_tokens,
        "attention: cu_seqlens ends at {} but there are {} tokens", s.cu_seqlens[s.num_segments],
        s.num_tokens);
}

std::vector<AttnItem> attention_items(const AttentionShape& s, bool backward,
                                      int64_t* total_blocks) {
  std::vector<AttnItem> items;
  std::vector<int64_t> cost;
  int64_t block_id = 0;
  for (int64_t seg = 0; seg < s.num_segments; ++seg) {
    const int64_t begin = s.cu_seqlens[seg], end = s.cu_seqlens[seg + 1];
    const int64_t blocks = (end - begin + kAttnBlock - 1) / kAttnBlock;
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t g = 0; g < s.num_kv_heads; ++g) {
        items.push_back({begin, end, b, g, block_id + b});
        cost.push_back(backward ? blocks - b : b + 1);
      }
    }
    block_id += blocks;
  }
  if (total_blocks != nullptr) *total_blocks = block_id;
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  std::vector<AttnItem> sorted;
  sorted.reserve(items.size());
  for (int64_t i : order) sorted.push_back(items[i]);
  return sorted;
}

}  // namespace longtron::ops::detail
