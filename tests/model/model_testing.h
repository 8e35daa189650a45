// Helpers of the model tests: hand-built packed rows and a tiny InternLM2 shape.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "model/model_config.h"
#include "packing/batch.h"

namespace longtron::testing {

/// Tiny shape for finite differences: head_dim 4, GQA with 2 query heads per kv head, FFN 48.
inline model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;
  c.multiple_of = 8;  // int(16 · 8/3) = 42 → 48
  return c;
}

/// Appends one document as its own segment: labels are the next token, -100 at the last token;
/// indexes restart at 0 (docs/data.md).
inline void append_document(data::MicroBatch& b, const std::vector<int32_t>& doc) {
  if (b.cu_seqlens.empty()) b.cu_seqlens.push_back(0);
  for (size_t i = 0; i < doc.size(); ++i) {
    b.input_ids.push_back(doc[i]);
    b.labels.push_back(i + 1 < doc.size() ? doc[i + 1] : data::kIgnoreIndex);
    b.indexes.push_back(static_cast<int32_t>(i));
  }
  b.cu_seqlens.push_back(b.cu_seqlens.back() + static_cast<int32_t>(doc.size()));
  b.max_seqlen = std::max<int32_t>(b.max_seqlen, static_cast<int32_t>(doc.size()));
}

/// Appends a pad segment of n tokens (id 0, label -100, indexes 0…n−1), as the packer does.
inline void append_pad(data::MicroBatch& b, int32_t n) {
  if (b.cu_seqlens.empty()) b.cu_seqlens.push_back(0);
  for (int32_t i = 0; i < n; ++i) {
    b.input_ids.push_back(0);
    b.labels.push_back(data::kIgnoreIndex);
    b.indexes.push_back(i);
  }
  b.cu_seqlens.push_back(b.cu_seqlens.back() + n);
  b.max_seqlen = std::max(b.max_seqlen, n);
}

/// A random document of `length` tokens in [1, vocab).
inline std::vector<int32_t> random_document(std::mt19937_64& rng, int64_t length, int64_t vocab) {
  std::uniform_int_distribution<int32_t> id(1, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> doc(static_cast<size_t>(length));
  for (auto& t : doc) t = id(rng);
  return doc;
}

/// Row of 24 tokens: documents of 7, 1, 5, 1, 6 tokens and a 4-token pad segment.
inline data::MicroBatch tiny_row(int64_t vocab) {
  std::mt19937_64 rng(7);
  data::MicroBatch b;
  for (int64_t len : {7, 1, 5, 1, 6}) append_document(b, random_document(rng, len, vocab));
  append_pad(b, 4);
  return b;
}

}  // namespace longtron::testing
