// 2D-Attention (parallel.sequence_2D: head parallel × context parallel under isp) through the
// engine against one process, with the contract of isp_parity.h: step-1 loss and gradient norm
// within 1e-5, every gradient within 1e-4, 5 steps of losses within 1e-4.
#pragma once
#include "isp_parity.h"

namespace longtron::testing {

/// isp(T, W) with sequence_2D = {head_size hp, context_size T / hp, balance}.
inline parallel::Layout seq2d(int T, int W, int hp, const std::string& balance,
                          bool head_first = true) {
  parallel::Layout l = isp(T, W);
  l.seq2d = true;
  l.seq2d_head = hp;
  l.seq2d_context = T / hp;
  l.seq2d_balance = data::parse_context_balance(balance);
  l.seq2d_head_first = head_first;
  return l;
}

/// A packed row of the given document lengths (Σ = P), labels as random_row's (next token, -100
/// at document ends).
inline MicroBatch row_of_lengths(const std::vector<int32_t>& lengths, int64_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  MicroBatch b;
  b.cu_seqlens.push_back(0);
  for (int32_t len : lengths) {
    b.cu_seqlens.push_back(b.cu_seqlens.back() + len);
    b.max_seqlen = std::max(b.max_seqlen, len);
    for (int32_t i = 0; i < len; ++i) {
      b.input_ids.push_back(std::uniform_int_distribution<int32_t>(1, int32_t(vocab) - 1)(gen));
      b.indexes.push_back(i);
    }
  }
  b.labels.assign(b.input_ids.size(), data::kIgnoreIndex);
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s)
    for (int32_t n = b.cu_seqlens[s - 1]; n + 1 < b.cu_seqlens[s]; ++n)
      b.labels[size_t(n)] = b.input_ids[size_t(n) + 1];
  return b;
}

/// Rows of 16 tokens that stress the assignment: one document; sixteen of length 1; a document
/// longer than half the row with length-1 neighbours; documents of 3 and 13.
inline RowFn edge_rows(int64_t vocab) {
  return [vocab](int step, int i) {
    static const std::vector<std::vector<int32_t>> kinds = {
        {16}, std::vector<int32_t>(16, 1), {1, 11, 1, 1, 2}, {3, 13}};
    return row_of_lengths(kinds[size_t(i + step) % kinds.size()], vocab, unsigned(31 * step + i));
  };
}

/// A Mistral-type tiny model (no biases) whose sliding window of 3 keys is shorter than most
/// documents of random_row and edge_rows, so a window ignored anywhere changes the losses.
inline model::ModelConfig windowed_model(int kv_heads = 2) {
  model::ModelConfig m = tiny_model(kv_heads);
  m.type = "mistral";
  m.qkv_bias = false;
  m.o_bias = false;
  m.sliding_window = 3;
  return m;
}

const char* const kBalances[] = {"contiguous", "zigzag", "document"};

}  // namespace longtron::testing
