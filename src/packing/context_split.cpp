// Context-parallel token assignment (see context_split.h).
#include "packing/context_split.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "packing/balance.h"
#include "packing/sequence_split.h"

namespace longtron::data {

ContextBalance parse_context_balance(const std::string& value, const std::string& key) {
  if (const auto balance = find_enum(kContextBalanceNames, value)) return *balance;
  fail("{} must be \"contiguous\", \"zigzag\" or \"document\", got \"{}\"", key, value);
}

std::string context_balance_name(ContextBalance balance) {
  return enum_name(kContextBalanceNames, balance);
}

namespace {

int64_t row_length(std::span<const int32_t> cu) {
  check(!cu.empty() && cu.front() == 0, "context parallel: cu_seqlens must start at 0");
  for (size_t i = 1; i < cu.size(); ++i)
    check(cu[i] >= cu[i - 1], "context parallel: cu_seqlens must not decrease ({} after {})", cu[i],
          cu[i - 1]);
  return cu.back();
}

// Work of the positions [a, b) of a segment starting at s: Σ (p − s + 1).
int64_t piece_work(int64_t s, int64_t a, int64_t b) {
  return (a - s + 1 + b - s) * (b - a) / 2;
}

// A piece [a, b) of the row given to one rank.
struct CpPiece {
  int64_t a, b;
};

// Zigzag of [start, start + n) over C ranks: rank r's total is n/C (the n mod C extra tokens go to
// ranks first, first+1, … cyclically), split into chunk r (the larger half) and chunk 2C−1−r.
// Equal chunks pair up to equal work: chunk r + chunk 2C−1−r.
void zigzag(int64_t start, int64_t n, int64_t C, int64_t first, std::vector<std::vector<CpPiece>>& out) {
  const int64_t base = n / C, extra = n % C;
  std::vector<int64_t> size(static_cast<size_t>(2 * C));
  for (int64_t r = 0; r < C; ++r) {
    const int64_t q = base + (((r - first) % C + C) % C < extra ? 1 : 0);
    size[r] = (q + 1) / 2;
    size[2 * C - 1 - r] = q / 2;
  }
  int64_t p = start;
  for (int64_t i = 0; i < 2 * C; ++i) {
    const int64_t r = i < C ? i : 2 * C - 1 - i;
    if (size[i] > 0) out[r].push_back({p, p + size[i]});
    p += size[i];
  }
}

// "document" (context_split.h): long segments zigzag, short ones greedy by least work with room.
std::vector<std::vector<CpPiece>> document_pieces(std::span<const int32_t> cu, int64_t C) {
  const int64_t P = cu.back(), share = P / C;
  double total = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) total += double(causal_pairs(cu[i + 1] - cu[i]));
  const double long_work = kDocumentSplitShare * total / double(C);
  std::vector<std::vector<CpPiece>> out(static_cast<size_t>(C));
  std::vector<int64_t> room(static_cast<size_t>(C), share), work(static_cast<size_t>(C), 0);
  auto give = [&](int64_t r, int64_t s, int64_t a, int64_t b) {
    out[r].push_back({a, b});
    room[r] -= b - a;
    work[r] += piece_work(s, a, b);
  };
  std::vector<size_t> shorts;
  int64_t first = 0;  // rotates the zigzag's extra tokens so rooms stay even
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t s = cu[i], l = cu[i + 1] - cu[i];
    if (l == 0) continue;
    if (l <= share && double(causal_pairs(l)) <= long_work) {
      shorts.push_back(i);
      continue;
    }
    std::vector<std::vector<CpPiece>> z(static_cast<size_t>(C));
    zigzag(s, l, C, first, z);
    first = (first + l % C) % C;
    for (int64_t r = 0; r < C; ++r)
      for (const CpPiece& p : z[r]) give(r, s, p.a, p.b);
  }
  // Largest first (ties: earlier in the row), so the last, smallest ones even the work out.
  std::stable_sort(shorts.begin(), shorts.end(), [&](size_t x, size_t y) {
    return cu[x + 1] - cu[x] > cu[y + 1] - cu[y];
  });
  for (size_t i : shorts) {
    const int64_t s = cu[i], e = cu[i + 1];
    for (int64_t a = s; a < e;) {
      int64_t best = -1;
      for (int64_t r = 0; r < C; ++r)  // least work among the ranks with room for the rest
        if (room[r] >= e - a && (best < 0 || work[r] < work[best])) best = r;
      if (best < 0)  // fits nowhere whole: fill the rank with the most room
        best = std::max_element(room.begin(), room.end()) - room.begin();
      const int64_t b = std::min(e, a + room[best]);
      give(best, s, a, b);
      a = b;
    }
  }
  return out;
}

std::vector<std::vector<CpPiece>> pieces_of(std::span<const int32_t> cu, int64_t C,
                                          ContextBalance balance) {
  const int64_t P = cu.back();
  std::vector<std::vector<CpPiece>> out(static_cast<size_t>(C));
  switch (balance) {
    case ContextBalance::kContiguous:
      for (int64_t r = 0; r < C; ++r) out[r].push_back({r * P / C, (r + 1) * P / C});
      return out;
    case ContextBalance::kZigzag:
      zigzag(0, P, C, 0, out);
      return out;
    case ContextBalance::kDocument:
      return document_pieces(cu, C);
  }
  return out;
}

}  // namespace

std::vector<std::vector<int32_t>> context_assignment(std::span<const int32_t> cu, int64_t C,
                                                     ContextBalance balance) {
  check(C >= 1, "context parallel size must be >= 1, got {}", C);
  const int64_t P = row_length(cu);
  check(P % C == 0,
        "context parallel size {} does not divide the row length {}: pad the row first "
        "(pad_for_sequence_parallel)",
        C, P);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(C));
  const auto pieces = pieces_of(cu, C, balance);
  for (int64_t r = 0; r < C; ++r) {
    for (const CpPiece& p : pieces[r])
      for (int64_t x = p.a; x < p.b; ++x) out[r].push_back(static_cast<int32_t>(x));
    std::sort(out[r].begin(), out[r].end());
    check(static_cast<int64_t>(out[r].size()) == P / C,
          "context parallel: internal error, rank {} holds {} positions, not {}", r, out[r].size(),
          P / C);
  }
  return out;
}

int64_t attention_work(std::span<const int32_t> cu, std::span<const int32_t> positions,
                       int64_t window) {
  const int64_t P = row_length(cu);
  int64_t work = 0;
  for (int32_t p : positions) {
    check(p >= 0 && p < P, "context parallel: position {} outside the row [0, {})", p, P);
    const auto seg = std::upper_bound(cu.begin(), cu.end(), p) - cu.begin() - 1;
    const int64_t keys = p - cu[seg] + 1;
    work += window > 0 ? std::min(keys, window) : keys;
  }
  return work;
}

double context_imbalance(std::span<const int32_t> cu,
                         const std::vector<std::vector<int32_t>>& assignment, int64_t window) {
  if (assignment.empty()) return 1.0;
  int64_t max = 0, sum = 0;
  for (const auto& positions : assignment) {
    const int64_t w = attention_work(cu, positions, window);
    max = std::max(max, w);
    sum += w;
  }
  return sum == 0 ? 1.0 : double(max) * double(assignment.size()) / double(sum);
}

std::pair<double, double> context_work_max_mean(std::span<const int32_t> cu, int64_t C,
                                                int64_t pad_to, ContextBalance balance) {
  check(pad_to >= 1 && pad_to % C == 0, "context parallel: padding to {} is not a multiple of {}",
        pad_to, C);
  std::vector<int32_t> padded(cu.begin(), cu.end());
  const int64_t P = row_length(cu), full = (P + pad_to - 1) / pad_to * pad_to;
  if (full != P) padded.push_back(static_cast<int32_t>(full));
  double max = 0, sum = 0;
  for (const auto& positions : context_assignment(padded, C, balance)) {
    const double w = double(attention_work(padded, positions));
    max = std::max(max, w);
    sum += w;
  }
  return {max, sum / double(C)};
}

ContextSegments context_segments(std::span<const int32_t> cu, std::span<const int32_t> positions) {
  const int64_t P = row_length(cu);
  ContextSegments out;
  out.cu_seqlens_q.push_back(0);
  out.cu_seqlens_k.push_back(0);
  size_t i = 0;
  while (i < positions.size()) {
    const int32_t a = positions[i];
    check(a >= 0 && a < P, "context parallel: position {} outside the row [0, {})", a, P);
    // Guarded, not folded into the condition: the message's arguments are evaluated even when the
    // check passes, and positions[-1] is out of bounds.
    if (i > 0)
      check(a > positions[i - 1], "context parallel: positions must ascend ({} after {})", a,
            positions[i - 1]);
    const auto seg = std::upper_bound(cu.begin(), cu.end(), a) - cu.begin() - 1;
    const int32_t s = cu[seg], e = cu[seg + 1];
    size_t j = i + 1;  // the run: consecutive positions inside [s, e)
    while (j < positions.size() && positions[j] == positions[j - 1] + 1 && positions[j] < e) ++j;
    const int32_t b = positions[j - 1] + 1;
    out.cu_seqlens_q.push_back(static_cast<int32_t>(j));
    out.cu_seqlens_k.push_back(out.cu_seqlens_k.back() + (b - s));
    out.key_ranges.emplace_back(s, b);
    out.max_seqlen_q = std::max(out.max_seqlen_q, b - a);
    out.max_seqlen_k = std::max(out.max_seqlen_k, b - s);
    i = j;
  }
  return out;
}

MicroBatch split_for_context_parallel(const MicroBatch& row, int64_t head_size, int64_t head_rank,
                                      int64_t context_size, int64_t context_rank,
                                      ContextBalance balance) {
  check_sequence_parallel(head_size, head_rank);
  check(context_size >= 1 && context_rank >= 0 && context_rank < context_size,
        "context parallel rank {} out of range: it must be in [0, {}) for size {}", context_rank,
        context_size, context_size);
  MicroBatch padded = row;
  pad_for_sequence_parallel(padded, head_size * context_size);
  check(static_cast<int64_t>(padded.cu_seqlens.size()) >= 2 &&
            padded.cu_seqlens.back() == static_cast<int32_t>(padded.input_ids.size()),
        "context parallel: cu_seqlens must end at the row length {}, got {}",
        padded.input_ids.size(), padded.cu_seqlens.empty() ? 0 : padded.cu_seqlens.back());
  const auto shares = context_assignment(padded.cu_seqlens, context_size, balance);
  const auto& mine = shares[context_rank];
  const size_t n = mine.size() / static_cast<size_t>(head_size);
  MicroBatch out;
  out.cu_seqlens = padded.cu_seqlens;
  out.max_seqlen = padded.max_seqlen;
  for (size_t k = head_rank * n; k < (head_rank + 1) * n; ++k) {
    out.input_ids.push_back(padded.input_ids[mine[k]]);
    out.labels.push_back(padded.labels[mine[k]]);
    out.indexes.push_back(padded.indexes[mine[k]]);
  }
  return out;
}

}  // namespace longtron::data
