// Balanced batches (`data.balance`, docs/balance.md): a row's modelled cost, the assignment of a
// step's rows to (dp rank, micro-batch) slots, and the cost-balanced packing of one window of
// documents into P-long rows. Pure functions, deterministic (ties broken by index), no timing, so
// every rank computes the same answer without communication.
// Methods: longest-processing-time greedy (Graham, "Bounds on multiprocessing timing anomalies",
// 1969); balanced packing as in WLB-LLM (arXiv:2503.17924) with fixed row length instead of its
// variable lengths, and Hierarchical Balance Packing (arXiv:2503.07680).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"

namespace longtron::data {

/// `data.balance`: "none" (InternEvo order), "rows" (re-assign a step's rows), "documents"
/// (cost-balanced packing within a window, then "rows").
enum class BalanceMode { kNone, kRows, kDocuments };
/// The config spellings of BalanceMode.
inline constexpr std::array<EnumName<BalanceMode>, 3> kBalanceModeNames{
    {{BalanceMode::kNone, "none"}, {BalanceMode::kRows, "rows"}, {BalanceMode::kDocuments, "documents"}}};

/// Parses "none" / "rows" / "documents"; anything else is an Error naming `key`.
BalanceMode parse_balance_mode(const std::string& value, const std::string& key = "data.balance");
/// The config spelling of a mode ("none", "rows", "documents").
std::string balance_mode_name(BalanceMode mode);

/// Causal (query, key) pairs of one attention segment of l tokens: l(l+1)/2.
inline int64_t causal_pairs(int64_t l) { return l * (l + 1) / 2; }

/// Causal pairs of a document piece of `len` tokens cut into attention segments of at most
/// `seq_len` tokens from its start (as the packer cuts it; seq_len <= 0: one segment).
int64_t piece_pairs(int64_t len, int64_t seq_len);

/// The modelled cost of a row: per_token · tokens + per_pair · Σ causal pairs over its segments.
/// From the model's FLOP count (linear layers per token, attention per causal pair; see
/// model::balance_cost) or `data.balance_cost = [a, b]`. Both >= 0, not both 0.
/// With a sliding window (model.sliding_window, in the share `windowed` of the layers) a segment
/// counts only its visible pairs (ops::visible_pairs) in those layers, as the kernel computes.
struct RowCost {
  double per_token = 0.0;
  double per_pair = 1.0;
  int64_t window = 0;     ///< keys a query sees in windowed layers (0 = none)
  double windowed = 1.0;  ///< share of the layers with the window, in [0, 1]
  /// Pairs of a segment of l tokens, averaged over layers: l(l+1)/2 without a window.
  double pairs(int64_t l) const;
  /// Cost of a row given its cu_seqlens (row-local offsets 0 … P; every segment counts, the pad
  /// included, since it is computed).
  double of(std::span<const int32_t> cu_seqlens) const;
  /// Throws Error naming `key` unless both are finite, >= 0 and not both 0.
  void validate(const std::string& key = "data.balance_cost") const;
};

/// piece_pairs with each segment counted by cost.pairs (only the pairs a window leaves visible).
double piece_pairs(int64_t len, int64_t seq_len, const RowCost& cost);

/// `data.balance*` settings. window: steps' worth of rows per "documents" window (>= 1).
struct BalanceConfig {
  BalanceMode mode = BalanceMode::kNone;
  int64_t window = 8;
  RowCost cost;
  /// Throws Error naming data.balance_window / data.balance_cost for bad values.
  void validate() const;
};

/// Assigns the G = dp_size × micro_num rows of one step (costs[i], i in canonical order) to dp
/// ranks, micro_num each, by longest-processing-time greedy: rows by cost descending (ties: lower
/// i first) each go to the least-loaded rank that still has room (ties: lower rank). Returns
/// [dp_size][micro_num] indices into `costs`, each rank's in ascending i. Throws Error if
/// costs.size() != dp_size × micro_num or a size is <= 0.
std::vector<std::vector<int64_t>> assign_rows(const std::vector<double>& costs, int64_t dp_size,
                                              int64_t micro_num);

/// Tokens [offset, offset + count) of the document at position `doc` of a file's order.
struct Piece {
  int64_t doc = 0;
  int64_t offset = 0;
  int64_t count = 0;
  friend bool operator==(const Piece&, const Piece&) = default;
};

/// Packs the pieces of one window (stream order, Σ count == Σ capacities) into rows of the given
/// capacities so that the rows' attention pairs (segments cut at seq_len, each counted by
/// pairs.pairs(l): the causal pairs, or with a sliding window only the visible ones, as the
/// kernel computes and RowCost::of counts) are near-equal. A piece whose
/// pairs alone exceed a row's fair share (the window's pairs ÷ rows) is first cut into near-equal
/// chunks within it. Then pieces by length descending (ties: stream order) each go whole to the
/// row that most needs pairs per remaining token to reach its share (ties: lower row), never to a
/// row that already holds a piece of the same document; a row shorter than row_length starts with
/// its pad segment's pairs. A piece that fits no row fills the row with the most room and its rest
/// is placed again (a cut at a row edge, as the plain packer makes). Returns, per row, its pieces
/// in stream order, adjacent pieces of one document merged back into one; every row is filled
/// exactly to its capacity. Throws Error if the totals differ.
std::vector<std::vector<Piece>> pack_window(const std::vector<Piece>& pieces,
                                            const std::vector<int64_t>& capacities,
                                            int64_t seq_len, int64_t row_length = 0,
                                            const RowCost& pairs = RowCost{});

/// max over ranks ÷ mean of `rank_costs` (1.0 = perfect; 1.0 for an empty or all-zero list).
double imbalance_of(const std::vector<double>& rank_costs);

}  // namespace longtron::data
