#include "packing/pair_pack.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "packing/shuffle.h"

namespace longtron::data {

std::vector<int64_t> pair_order(const PairSource& source, bool shuffle, uint32_t seed) {
  std::vector<int64_t> order(source.num_pairs());
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle) numpy_shuffle(order, seed);
  return order;
}

PairRows::Kept PairRows::kept(int64_t document) const {
  const auto d = static_cast<size_t>(document);
  const auto length = static_cast<int64_t>(source_.document_length(d));
  const auto prompt = static_cast<int64_t>(source_.prompt_length(d));
  const int64_t max = config_.pair_max_length;
  if (max <= 0 || length <= max) return {0, length, prompt};
  if (!config_.pair_keep_end) return {0, max, std::min(prompt, max)};
  const int64_t skip = length - max;
  return {skip, max, std::max<int64_t>(0, prompt - skip)};
}

PairRows::PairRows(const PairSource& source, std::vector<int64_t> order, const PackConfig& config)
    : source_(source), order_(std::move(order)), config_(config) {
  const int64_t L = config_.seq_len, P = config_.packed_length();
  row_starts_.push_back(0);
  int64_t used = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    const int64_t p = order_[i];
    const int64_t line = source_.line_of(static_cast<size_t>(p));
    int64_t both = 0;
    for (int64_t d = 2 * p; d < 2 * p + 2; ++d) {
      const Kept k = kept(d);
      const char* which = d % 2 == 0 ? "chosen" : "rejected";
      check(k.length <= L,
            "{}, line {}: the {} sequence (prompt + answer) has {} tokens, more than data.seq_len "
            "= {} (one attention segment); set preference.max_length to truncate it",
            source_.path().string(), line, which, k.length, L);
      // The first token is nobody's target: an answer needs a token after the prompt's first.
      check(k.length - std::max<int64_t>(k.prompt, 1) >= 1,
            "{}, line {}: the {} sequence has no answer token left after truncation to "
            "preference.max_length = {} ({})", source_.path().string(), line, which,
            config_.pair_max_length,
            config_.pair_keep_end ? "keep_end" : "keep_start: the prompt fills it");
      both += k.length;
    }
    check(both <= P,
          "{}, line {}: the pair has {} tokens, more than packed_length = data.micro_bsz x "
          "data.seq_len = {}; a pair is never split across rows", source_.path().string(), line,
          both, P);
    if (used + both > P) {
      row_starts_.push_back(static_cast<int64_t>(i));
      used = 0;
    }
    used += both;
  }
  if (!order_.empty()) row_starts_.push_back(static_cast<int64_t>(order_.size()));
}

void PairRows::segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const {
  check(k >= 0 && k < num_rows(), "row {} out of range ({} rows of pairs)", k, num_rows());
  cu_seqlens.assign(1, 0);
  for (int64_t i = row_starts_[k]; i < row_starts_[k + 1]; ++i)
    for (int64_t d = 2 * order_[i]; d < 2 * order_[i] + 2; ++d)
      cu_seqlens.push_back(cu_seqlens.back() + static_cast<int32_t>(kept(d).length));
  if (cu_seqlens.back() < packed_length()) cu_seqlens.push_back(static_cast<int32_t>(packed_length()));
}

void PairRows::row_into(int64_t k, MicroBatch& out) const {
  segments_into(k, out.cu_seqlens);
  const auto P = static_cast<size_t>(packed_length());
  out.input_ids.assign(P, 0);
  out.labels.assign(P, kIgnoreIndex);
  out.indexes.assign(P, 0);
  out.pairs.clear();
  std::vector<int32_t> stored;
  size_t segment = 0;
  for (int64_t i = row_starts_[k]; i < row_starts_[k + 1]; ++i) {
    PairInRow pair;
    pair.id = order_[i];
    for (int64_t d = 2 * order_[i]; d < 2 * order_[i] + 2; ++d, ++segment) {
      const Kept kp = kept(d);
      stored.resize(static_cast<size_t>(kp.length));
      source_.read_tokens(static_cast<size_t>(d), static_cast<size_t>(kp.skip), stored.size(),
                          stored.data());
      const int32_t begin = out.cu_seqlens[segment], end = out.cu_seqlens[segment + 1];
      for (int32_t t = begin; t < end; ++t) {
        const auto j = static_cast<size_t>(t - begin);
        out.input_ids[t] = stored_input(stored[j]);
        out.indexes[t] = t - begin;
        if (t + 1 < end) out.labels[t] = stored_label(stored[j + 1], kIgnoreIndex);
      }
      // The first answer token is the target of the position before it.
      const int32_t answer = begin + static_cast<int32_t>(std::max<int64_t>(kp.prompt, 1)) - 1;
      if (d % 2 == 0) pair.chosen_begin = begin, pair.chosen_answer = answer, pair.chosen_end = end;
      else pair.rejected_begin = begin, pair.rejected_answer = answer, pair.rejected_end = end;
    }
    out.pairs.push_back(pair);
  }
  // The pad (if any) is the last segment: indexes 0..k-1.
  if (segment + 1 < out.cu_seqlens.size())
    for (int32_t t = out.cu_seqlens[segment]; t < static_cast<int32_t>(P); ++t)
      out.indexes[t] = t - out.cu_seqlens[segment];
  out.max_seqlen = 0;
  for (size_t s = 0; s + 1 < out.cu_seqlens.size(); ++s)
    out.max_seqlen = std::max(out.max_seqlen, out.cu_seqlens[s + 1] - out.cu_seqlens[s]);
}

}  // namespace longtron::data
