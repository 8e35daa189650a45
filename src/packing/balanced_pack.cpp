#include "packing/balanced_pack.h"

#include <algorithm>

#include "core/error.h"
#include "packing/row_fill.h"

namespace longtron::data {

BalancedRows::BalancedRows(const DocumentSource& source, std::vector<int64_t> order,
                           const PackConfig& config, ProgressHook* progress, int64_t progress_base)
    : source_(source), order_(std::move(order)), config_(config) {
  config_.validate();
  check(config_.balance_window_rows > 0, "BalancedRows needs a balance window (rows > 0)");
  P_ = config_.packed_length();
  int64_t total = 0;
  lengths_.reserve(order_.size());
  for (const int64_t id : order_) {
    check(id >= 0 && static_cast<size_t>(id) < source_.num_documents(),
          "{}: document order names document {} of {}", source_.path().string(), id,
          source_.num_documents());
    lengths_.push_back(static_cast<int64_t>(source_.document_length(id)));
    total += lengths_.back();
  }
  // The plain packer's rows: the same count and the same tail (padded or dropped).
  const bool pad = config_.pack_tail == PackTail::kPad;
  const int64_t rows = pad ? (total + P_ - 1) / P_ : total / P_;
  const int64_t used = pad ? total : rows * P_;
  const int64_t W = config_.balance_window_rows;
  row_begin_.assign(1, 0);
  size_t d = 0;       // first ordered document not yet fully placed
  int64_t done = 0;   // tokens of document d already placed
  int64_t reported = 0;
  for (int64_t first = 0; first < rows; first += W) {
    if (progress && static_cast<int64_t>(d) - reported >= kProgressStepDocuments) {
      progress->update(progress_base + static_cast<int64_t>(d));
      reported = static_cast<int64_t>(d);
    }
    const int64_t last = std::min(first + W, rows);
    const int64_t end = std::min(last * P_, used);  // stream tokens [first·P, end) of this window
    std::vector<int64_t> capacities;
    for (int64_t r = first; r < last; ++r) capacities.push_back(std::min(P_, end - r * P_));
    std::vector<Piece> pieces;
    for (int64_t need = end - first * P_; need > 0;) {
      const int64_t take = std::min(lengths_[d] - done, need);
      pieces.push_back({static_cast<int64_t>(d), done, take});
      need -= take;
      done += take;
      if (done == lengths_[d]) {
        ++d;
        done = 0;
      }
    }
    for (auto& row : pack_window(pieces, capacities, config_.seq_len, P_, config_.balance_pairs)) {
      pieces_.insert(pieces_.end(), row.begin(), row.end());
      row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
    }
  }
  raw_.resize(P_ + 1);
}

std::span<const Piece> BalancedRows::row_pieces(int64_t k) const {
  check(k >= 0 && k < num_rows(), "{}: row {} out of range (the file has {} rows)",
        source_.path().string(), k, num_rows());
  return {pieces_.data() + row_begin_[k], pieces_.data() + row_begin_[k + 1]};
}

void BalancedRows::row_into(int64_t k, MicroBatch& out) const {
  const auto pieces = row_pieces(k);
  detail::resize_row(out, P_);
  int64_t pos = 0;
  for (const Piece& p : pieces) {
    const int64_t doc = order_[p.doc];
    const bool doc_end = p.offset + p.count == lengths_[p.doc];
    // The piece and, when the row cuts the document, its continuation token (the last label).
    source_.read_tokens(doc, p.offset, p.count + (doc_end ? 0 : 1), raw_.data());
    for (int64_t i = 0; i < p.count; ++i) {
      out.input_ids[pos + i] = detail::input_of(raw_[i]);
      out.labels[pos + i] = detail::label_of(raw_[i + 1]);
    }
    if (doc_end) out.labels[pos + p.count - 1] = kIgnoreIndex;
    detail::append_segments(pos, p.count, config_.seq_len, out);
    pos += p.count;
  }
  std::fill(out.input_ids.begin() + pos, out.input_ids.end(), 0);
  std::fill(out.labels.begin() + pos, out.labels.end(), kIgnoreIndex);
  if (pos < P_) detail::append_segments(pos, P_ - pos, 0, out);  // the padded tail
}

void BalancedRows::segments_into(int64_t k, std::vector<int32_t>& cu) const {
  const auto pieces = row_pieces(k);
  cu.assign(1, 0);
  int64_t pos = 0;
  for (const Piece& p : pieces) {
    detail::append_segment_ends(pos, p.count, config_.seq_len, cu);
    pos += p.count;
  }
  if (pos < P_) detail::append_segment_ends(pos, P_ - pos, 0, cu);
}

}  // namespace longtron::data
