#include "packing/balance.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::data {

BalanceMode parse_balance_mode(const std::string& value, const std::string& key) {
  if (const auto mode = find_enum(kBalanceModeNames, value)) return *mode;
  fail("{} must be \"none\", \"rows\" or \"documents\", got \"{}\"", key, value);
}

std::string balance_mode_name(BalanceMode mode) { return enum_name(kBalanceModeNames, mode); }

int64_t piece_pairs(int64_t len, int64_t seq_len) {
  if (seq_len <= 0 || len <= seq_len) return causal_pairs(len);
  return (len / seq_len) * causal_pairs(seq_len) + causal_pairs(len % seq_len);
}

double piece_pairs(int64_t len, int64_t seq_len, const RowCost& cost) {
  if (seq_len <= 0 || len <= seq_len) return cost.pairs(len);
  return static_cast<double>(len / seq_len) * cost.pairs(seq_len) + cost.pairs(len % seq_len);
}

double RowCost::pairs(int64_t l) const {
  const double full = static_cast<double>(causal_pairs(l));
  if (window <= 0 || l <= window) return full;
  const double seen = static_cast<double>(ops::visible_pairs(l, window));
  return (1.0 - windowed) * full + windowed * seen;
}

double RowCost::of(std::span<const int32_t> cu_seqlens) const {
  double tokens = 0, sum = 0;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    const int64_t l = static_cast<int64_t>(cu_seqlens[i]) - cu_seqlens[i - 1];
    tokens += static_cast<double>(l);
    sum += pairs(l);
  }
  return per_token * tokens + per_pair * sum;
}

void RowCost::validate(const std::string& key) const {
  check(std::isfinite(per_token) && std::isfinite(per_pair) && per_token >= 0 && per_pair >= 0 &&
            (per_token > 0 || per_pair > 0),
        "{} = [{}, {}]: expected two finite numbers >= 0, not both 0 (cost per token, per causal "
        "pair)",
        key, per_token, per_pair);
}

void BalanceConfig::validate() const {
  check(window >= 1, "data.balance_window must be >= 1, got {}", window);
  cost.validate();
}

std::vector<std::vector<int64_t>> assign_rows(const std::vector<double>& costs, int64_t dp_size,
                                              int64_t micro_num) {
  check(dp_size > 0 && micro_num > 0, "assign_rows: dp_size {} and micro_num {} must be > 0",
        dp_size, micro_num);
  check(static_cast<int64_t>(costs.size()) == dp_size * micro_num,
        "assign_rows: {} costs for dp_size {} x micro_num {}", costs.size(), dp_size, micro_num);
  std::vector<int64_t> by_cost(costs.size());
  for (size_t i = 0; i < by_cost.size(); ++i) by_cost[i] = static_cast<int64_t>(i);
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](int64_t x, int64_t y) { return costs[x] > costs[y]; });
  std::vector<std::vector<int64_t>> out(dp_size);
  std::vector<double> load(dp_size, 0.0);
  for (const int64_t i : by_cost) {
    int64_t best = -1;
    for (int64_t r = 0; r < dp_size; ++r)
      if (static_cast<int64_t>(out[r].size()) < micro_num && (best < 0 || load[r] < load[best]))
        best = r;
    out[best].push_back(i);
    load[best] += costs[i];
  }
  for (auto& rows : out) std::sort(rows.begin(), rows.end());
  return out;
}

namespace {

// Pieces waiting to be placed: longest first, then stream order (doc, offset).
struct Longer {
  bool operator()(const Piece& x, const Piece& y) const {
    if (x.count != y.count) return x.count > y.count;
    return std::make_pair(x.doc, x.offset) < std::make_pair(y.doc, y.offset);
  }
};

// Longest piece whose pairs stay within `share` (at least 1 token).
int64_t longest_within(double share, int64_t cap, int64_t seq_len, const RowCost& cost) {
  int64_t lo = 1, hi = std::max<int64_t>(cap, 1);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (piece_pairs(mid, seq_len, cost) <= share) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Cuts every piece whose pairs alone exceed a row's fair share (the window's pairs ÷ rows) into
// near-equal chunks no longer than the share allows; the share is recomputed after the cuts
// (cutting lowers it) a few times. Without this, one long document makes its row the slowest
// whatever the rest of the packing does.
std::vector<Piece> cut_to_fair_share(const std::vector<Piece>& pieces, int64_t rows, int64_t cap,
                                     int64_t seq_len, const RowCost& cost) {
  std::vector<Piece> out = pieces;
  for (int round = 0; round < 4; ++round) {
    double pairs = 0;  // whole numbers without a window: exact in double below 2^53
    for (const Piece& p : out) pairs += piece_pairs(p.count, seq_len, cost);
    const int64_t limit = longest_within(std::ceil(pairs / double(rows)), cap, seq_len, cost);
    bool cut = false;
    std::vector<Piece> next;
    for (const Piece& p : pieces) {
      const int64_t k = (p.count + limit - 1) / limit;
      cut = cut || k > 1;
      for (int64_t i = 0, at = 0; i < k; ++i) {
        const int64_t len = p.count / k + (i < p.count % k ? 1 : 0);
        next.push_back({p.doc, p.offset + at, len});
        at += len;
      }
    }
    const bool same = next.size() == out.size();
    out = std::move(next);
    if (!cut || same) break;
  }
  return out;
}

}  // namespace

std::vector<std::vector<Piece>> pack_window(const std::vector<Piece>& pieces,
                                            const std::vector<int64_t>& capacities,
                                            int64_t seq_len, int64_t row_length,
                                            const RowCost& cost) {
  int64_t total = 0, room_total = 0;
  for (const Piece& p : pieces) {
    check(p.count > 0, "pack_window: empty piece of document {}", p.doc);
    total += p.count;
  }
  const auto n = static_cast<int64_t>(capacities.size());
  const int64_t cap = capacities.empty() ? 0 : *std::max_element(capacities.begin(), capacities.end());
  std::set<Piece, Longer> todo;
  if (n > 0)
    for (const Piece& p : cut_to_fair_share(pieces, n, cap, seq_len, cost)) todo.insert(p);
  // Each row's share of the window's pairs, in proportion to its capacity.
  double window_pairs = 0;
  for (const Piece& p : todo) window_pairs += piece_pairs(p.count, seq_len, cost);
  std::vector<double> share(n);
  for (int64_t r = 0; r < n; ++r)
    share[r] = total > 0 ? window_pairs * static_cast<double>(capacities[r]) / static_cast<double>(total) : 0;
  std::vector<int64_t> room(capacities);
  std::vector<double> pairs(n, 0.0);
  for (int64_t r = 0; r < n; ++r)  // a row shorter than row_length ends in one pad segment
    if (capacities[r] < row_length) pairs[r] = cost.pairs(row_length - capacities[r]);
  // Rows that still have room, by (-room, row).
  std::set<std::pair<int64_t, int64_t>> by_room;
  for (int64_t r = 0; r < n; ++r) {
    check(room[r] >= 0, "pack_window: negative capacity {}", room[r]);
    room_total += room[r];
    if (room[r] == 0) continue;
    by_room.insert({-room[r], r});
  }
  check(total == room_total, "pack_window: {} tokens for rows of {} tokens", total, room_total);
  std::vector<std::vector<Piece>> rows(n);
  std::set<std::pair<int64_t, int64_t>> holds;  // (doc, row): a row already holds a piece of doc
  auto place = [&](int64_t r, const Piece& p) {
    by_room.erase({-room[r], r});
    rows[r].push_back(p);
    holds.insert({p.doc, r});
    pairs[r] += piece_pairs(p.count, seq_len, cost);
    room[r] -= p.count;
    if (room[r] > 0) by_room.insert({-room[r], r});
  };
  while (!todo.empty()) {
    const Piece p = *todo.begin();
    todo.erase(todo.begin());
    // Among rows the piece fits whole and that hold no other piece of its document (two pieces
    // of one document in a row would be a cut inside the row): the one that most needs pairs per
    // remaining token to reach its share.
    int64_t target = -1;
    double best = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (room[r] < p.count || holds.count({p.doc, r})) continue;
      const double need = (share[r] - pairs[r]) / static_cast<double>(room[r]);
      if (target < 0 || need > best) {
        target = r;
        best = need;
      }
    }
    if (target >= 0) {
      place(target, p);
      continue;
    }
    const int64_t r = by_room.begin()->second;  // fits nowhere: cut it at the roomiest row's edge
    const int64_t head = std::min(room[r], p.count);
    place(r, {p.doc, p.offset, head});
    if (head < p.count) todo.insert({p.doc, p.offset + head, p.count - head});
  }
  for (auto& row : rows) {
    std::sort(row.begin(), row.end(), [](const Piece& x, const Piece& y) {
      return std::make_pair(x.doc, x.offset) < std::make_pair(y.doc, y.offset);
    });
    // Adjacent pieces of one document that ended up in one row (only when nothing else fitted)
    // become one piece again: documents are cut at row edges only.
    std::vector<Piece> merged;
    for (const Piece& p : row) {
      if (!merged.empty() && merged.back().doc == p.doc &&
          merged.back().offset + merged.back().count == p.offset)
        merged.back().count += p.count;
      else
        merged.push_back(p);
    }
    row = std::move(merged);
  }
  return rows;
}

double imbalance_of(const std::vector<double>& rank_costs) {
  if (rank_costs.empty()) return 1.0;
  double sum = 0, top = 0;
  for (const double c : rank_costs) {
    sum += c;
    top = std::max(top, c);
  }
  const double mean = sum / static_cast<double>(rank_costs.size());
  return mean > 0 ? top / mean : 1.0;
}

}  // namespace longtron::data
