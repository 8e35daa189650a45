// `data.balance = "documents"` (docs/balance.md): the rows of one file packed by attention cost
// instead of by order alone. The file's document stream (the plain packer's, with the same number
// of rows and the same tail rule) is cut into windows of `balance_window_rows` rows; inside a window
// its document pieces are re-packed by pack_window (balance.h) so that every row holds exactly P
// tokens and near-equal attention pairs (config.balance_pairs: causal pairs, or under a sliding
// window the visible ones). Document order changes only inside a window, every token
// of the stream appears exactly once, and the rows depend only on the window size, never on a rank.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "packing/balance.h"
#include "packing/pack.h"

namespace longtron::data {

/// Cost-balanced packed rows of one file. Labels follow the plain packer's rule: the next token of
/// the same document, -100 at a document end; a piece cut at a row edge gets its continuation token
/// as its last label. Pieces are cut into attention segments of <= seq_len from the piece start;
/// the padded tail (pack_tail = "pad") is one pad segment. config.balance_window_rows must be > 0
/// (PackConfig::validate refuses unpacked rows, pack_sample_into_one and split_documents = false).
/// Holds one Piece per (document piece, row): O(documents + rows) memory. `source` must outlive it.
class BalancedRows : public RowSource {
 public:
  /// `progress` (may be null) gets update(`progress_base` + documents placed) after each window.
  BalancedRows(const DocumentSource& source, std::vector<int64_t> order, const PackConfig& config,
               ProgressHook* progress = nullptr, int64_t progress_base = 0);
  int64_t num_rows() const override { return static_cast<int64_t>(row_begin_.size()) - 1; }
  void row_into(int64_t k, MicroBatch& out) const override;
  int64_t packed_length() const override { return P_; }
  void segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const override;
  /// The pieces of row k in stream order (Piece::doc is a position in `order`).
  std::span<const Piece> row_pieces(int64_t k) const;

 private:
  const DocumentSource& source_;
  std::vector<int64_t> order_;
  std::vector<int64_t> lengths_;  // token count of each ordered document
  PackConfig config_;
  int64_t P_;
  std::vector<Piece> pieces_;       // all rows' pieces, row after row
  std::vector<int64_t> row_begin_;  // [rows+1] index of each row's first piece in pieces_
  mutable std::vector<int32_t> raw_;  // scratch: one piece + its continuation token
};

}  // namespace longtron::data
