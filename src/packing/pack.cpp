// build_pack / build_unpack (docs/data.md). The hot path copies each document piece with one
// read_tokens call (a memcpy for mapped int32 files) and then derives inputs and labels in one
// branch-free pass, so the cost per token is a few instructions (bench/bench_pack.cpp).
#include "packing/pack.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "data/validate.h"
#include "packing/balanced_pack.h"
#include "packing/pair_pack.h"
#include "packing/row_fill.h"
#include "packing/shuffle.h"

namespace longtron::data {

using detail::append_segments;
using detail::input_of;
using detail::label_of;
using detail::resize_row;

PackTail parse_pack_tail(const std::string& value) {
  if (const auto tail = find_enum(kPackTailNames, value)) return *tail;
  fail("data.pack_tail must be \"pad\" or \"drop\", got \"{}\"", value);
}

void PackConfig::validate() const {
  check(seq_len > 0, "data.seq_len must be > 0, got {}", seq_len);
  check(micro_bsz > 0, "data.micro_bsz must be > 0, got {}", micro_bsz);
  check(seq_len <= std::numeric_limits<int32_t>::max() / micro_bsz,
        "packed_length = data.micro_bsz x data.seq_len = {} x {} exceeds 2^31-1 (int32 cu_seqlens)",
        micro_bsz, seq_len);
  check(balance_window_rows >= 0, "balance window of {} rows", balance_window_rows);
  if (balance_window_rows == 0) return;
  check(use_packed_dataset,
        "data.balance = \"documents\" packs documents into rows: it needs packed rows "
        "(data.use_packed_dataset = true); use data.balance = \"rows\" with unpacked rows");
  check(!pack_sample_into_one,
        "data.balance = \"documents\" cannot be combined with data.pack_sample_into_one = true "
        "(attention there ignores documents, so every row costs the same)");
  check(split_documents,
        "data.balance = \"documents\" cuts documents at row edges: it needs "
        "data.split_documents = true");
}

std::vector<int64_t> document_order(const DocumentSource& source, int64_t min_length, bool shuffle,
                                    uint32_t seed, ProgressHook* progress, int64_t progress_base) {
  std::vector<int64_t> order;
  const size_t n = source.num_documents();
  order.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (progress && i % kProgressStepDocuments == 0)
      progress->update(progress_base + static_cast<int64_t>(i));
    const auto len = static_cast<int64_t>(source.document_length(i));
    if (len > 0 && len >= min_length) order.push_back(static_cast<int64_t>(i));
  }
  if (shuffle) numpy_shuffle(order, seed);
  return order;
}

namespace {

void check_row(int64_t k, int64_t rows, const DocumentSource& source) {
  check(k >= 0 && k < rows, "{}: row {} out of range (the file has {} rows)",
        source.path().string(), k, rows);
}

}  // namespace

PackedRows::PackedRows(const DocumentSource& source, std::vector<int64_t> order,
                       const PackConfig& config)
    : source_(source), order_(std::move(order)), config_(config) {
  config_.validate();
  P_ = config_.packed_length();
  place_documents();
  const int64_t total = starts_.back();
  num_rows_ = config_.pack_tail == PackTail::kPad ? (total + P_ - 1) / P_ : total / P_;
  raw_.resize(P_ + 1);
}

// Stream offsets of the ordered documents. Split (InternEvo): back to back. Not split: a document
// that does not fit the rest of the current row moves to the next row start (the skipped rest is a
// pad gap); one longer than P starts on a fresh row and runs on, cut into P-long pieces.
void PackedRows::place_documents() {
  starts_.resize(order_.size() + 1);
  lengths_.resize(order_.size());
  int64_t at = 0;
  num_tokens_ = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    check(order_[i] >= 0 && static_cast<size_t>(order_[i]) < source_.num_documents(),
          "{}: document order names document {} of {}", source_.path().string(), order_[i],
          source_.num_documents());
    const auto len = static_cast<int64_t>(source_.document_length(order_[i]));
    const int64_t used = at % P_;
    if (!config_.split_documents && used > 0 && len > P_ - used) at += P_ - used;
    starts_[i] = at;
    lengths_[i] = len;
    at += len;
    num_tokens_ += len;
  }
  starts_.back() = at;
}

void PackedRows::row_into(int64_t k, MicroBatch& out) const {
  check_row(k, num_rows_, source_);
  resize_row(out, P_);
  const int64_t filled = fill_tokens(k, out);
  fill_segments(filled, out);
}

// Copies the row's stored ids into raw_ piece by piece (pad gaps as zeros), then derives
// input_ids and labels.
int64_t PackedRows::fill_tokens(int64_t k, MicroBatch& out) const {
  const int64_t begin = k * P_;
  const int64_t filled = std::min(begin + P_, starts_.back()) - begin;
  const auto n = static_cast<int64_t>(order_.size());
  // Last ordered document starting at or before `begin`; one ending before it is skipped below.
  int64_t d = std::max<int64_t>(
      0, std::upper_bound(starts_.begin(), starts_.begin() + n, begin) - starts_.begin() - 1);
  int32_t* raw = raw_.data();
  int32_t* labels = out.labels.data();
  int64_t pos = 0;
  piece_ends_.clear();
  doc_ends_.clear();
  pads_.clear();
  while (pos < filled) {
    const int64_t gap = std::min(starts_[d] - begin, filled) - pos;
    if (gap > 0) {  // a pad gap before document d (split_documents = false)
      std::fill(raw + pos, raw + pos + gap, 0);
      pos += gap;
      piece_ends_.push_back(pos);
      doc_ends_.push_back(true);
      pads_.push_back(true);
      continue;
    }
    const int64_t len = lengths_[d];
    const int64_t offset = begin + pos - starts_[d];
    const int64_t count = std::min(len - offset, filled - pos);
    if (count > 0) {
      source_.read_tokens(order_[d], offset, count, raw + pos);
      pos += count;
      piece_ends_.push_back(pos);
      const bool doc_end = offset + count == len;
      doc_ends_.push_back(doc_end);
      pads_.push_back(false);
      // The row ends inside the document: its last label is the continuation token.
      if (!doc_end) source_.read_tokens(order_[d], offset + count, 1, raw + pos);
    }
    ++d;
  }
  int32_t* input = out.input_ids.data();
  for (int64_t i = 0; i < filled; ++i) {
    input[i] = input_of(raw[i]);
    labels[i] = label_of(raw[i + 1]);
  }
  // -100 at every document end; into-one rows also at the row end (InternEvo
  // PackedDatasetWithoutCuSeqlen labels every piece `piece[1:] + [-100]`); all of a pad gap.
  int64_t from = 0;
  for (size_t p = 0; p < piece_ends_.size(); ++p) {
    if (pads_[p]) std::fill(labels + from, labels + piece_ends_[p], kIgnoreIndex);
    if (doc_ends_[p] || config_.pack_sample_into_one) labels[piece_ends_[p] - 1] = kIgnoreIndex;
    from = piece_ends_[p];
  }
  std::fill(input + filled, input + P_, 0);
  std::fill(labels + filled, labels + P_, kIgnoreIndex);
  return filled;
}

// Mirrors fill_tokens + fill_segments on the document offsets alone.
void PackedRows::segments_into(int64_t k, std::vector<int32_t>& cu) const {
  check_row(k, num_rows_, source_);
  cu.assign(1, 0);
  const int64_t L = config_.seq_len;
  if (config_.pack_sample_into_one) {
    detail::append_segment_ends(0, P_, L, cu);
    return;
  }
  const int64_t begin = k * P_;
  const int64_t filled = std::min(begin + P_, starts_.back()) - begin;
  const auto n = static_cast<int64_t>(order_.size());
  int64_t d = std::max<int64_t>(
      0, std::upper_bound(starts_.begin(), starts_.begin() + n, begin) - starts_.begin() - 1);
  int64_t pos = 0;
  while (pos < filled) {
    const int64_t gap = std::min(starts_[d] - begin, filled) - pos;
    if (gap > 0) {
      detail::append_segment_ends(pos, gap, 0, cu);
      pos += gap;
      continue;
    }
    const int64_t count = std::min(lengths_[d] - (begin + pos - starts_[d]), filled - pos);
    if (count > 0) {
      detail::append_segment_ends(pos, count, L, cu);
      pos += count;
    }
    ++d;
  }
  if (filled < P_) detail::append_segment_ends(filled, P_ - filled, 0, cu);
}

void PackedRows::fill_segments(int64_t filled, MicroBatch& out) const {
  const int64_t L = config_.seq_len;
  if (config_.pack_sample_into_one) {  // fixed windows; the pad (if any) stays inside them
    append_segments(0, P_, L, out);
    return;
  }
  int64_t from = 0;
  for (size_t p = 0; p < piece_ends_.size(); ++p) {  // segments counted from each piece start
    append_segments(from, piece_ends_[p] - from, pads_[p] ? 0 : L, out);  // a pad gap: one segment
    from = piece_ends_[p];
  }
  if (filled < P_) append_segments(filled, P_ - filled, 0, out);  // the pad: one segment
}

UnpackedRows::UnpackedRows(const DocumentSource& source, std::vector<int64_t> order,
                           const PackConfig& config)
    : source_(source), order_(std::move(order)), config_(config) {
  config_.validate();
  for (const int64_t id : order_)
    check(id >= 0 && static_cast<size_t>(id) < source_.num_documents(),
          "{}: document order names document {} of {}", source_.path().string(), id,
          source_.num_documents());
  const auto n = static_cast<int64_t>(order_.size());
  num_rows_ = (n + config_.micro_bsz - 1) / config_.micro_bsz;
  raw_.resize(config_.seq_len);
}

void UnpackedRows::row_into(int64_t k, MicroBatch& out) const {
  check_row(k, num_rows_, source_);
  const int64_t P = config_.packed_length();
  const int64_t L = config_.seq_len;
  resize_row(out, P);
  const auto n = static_cast<int64_t>(order_.size());
  const int64_t first = k * config_.micro_bsz;
  const int64_t last = std::min(first + config_.micro_bsz, n);
  int64_t pos = 0;
  for (int64_t d = first; d < last; ++d) {
    const auto doc = order_[d];
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(source_.document_length(doc)), L);
    if (count == 0) continue;
    source_.read_tokens(doc, 0, count, raw_.data());
    for (int64_t i = 0; i < count; ++i) {
      out.input_ids[pos + i] = input_of(raw_[i]);
      out.labels[pos + i] = i + 1 < count ? label_of(raw_[i + 1]) : kIgnoreIndex;
    }
    append_segments(pos, count, 0, out);
    pos += count;
  }
  std::fill(out.input_ids.begin() + pos, out.input_ids.end(), 0);
  std::fill(out.labels.begin() + pos, out.labels.end(), kIgnoreIndex);
  if (pos < P) append_segments(pos, P - pos, 0, out);
}

// Mirrors row_into on the document lengths alone.
void UnpackedRows::segments_into(int64_t k, std::vector<int32_t>& cu) const {
  check_row(k, num_rows_, source_);
  const int64_t P = config_.packed_length();
  cu.assign(1, 0);
  const auto n = static_cast<int64_t>(order_.size());
  int64_t pos = 0;
  for (int64_t d = k * config_.micro_bsz; d < std::min(k * config_.micro_bsz + config_.micro_bsz, n); ++d) {
    const int64_t count =
        std::min<int64_t>(static_cast<int64_t>(source_.document_length(order_[d])), config_.seq_len);
    if (count == 0) continue;
    pos += count;
    cu.push_back(static_cast<int32_t>(pos));
  }
  if (pos < P) cu.push_back(static_cast<int32_t>(P));
}

std::unique_ptr<PackedRows> build_pack(const DocumentSource& source, std::vector<int64_t> order,
                                       const PackConfig& config) {
  return std::make_unique<PackedRows>(source, std::move(order), config);
}

std::unique_ptr<UnpackedRows> build_unpack(const DocumentSource& source,
                                           std::vector<int64_t> order, const PackConfig& config) {
  return std::make_unique<UnpackedRows>(source, std::move(order), config);
}

namespace {
// The data settings that would cut, drop or regroup a pair's sequences are refused with pairs
// (docs/preference.md): a pair is two documents of one row, always.
void check_pair_settings(const PairSource& file, const PackConfig& config, int64_t min_length) {
  const std::string name = file.path().string();
  check(config.use_packed_dataset, "{}: preference pairs need packed rows "
        "(data.use_packed_dataset = true): each row holds whole pairs", name);
  check(!config.pack_sample_into_one, "{}: preference pairs cannot use "
        "data.pack_sample_into_one = true (attention would cross the pair's sequences)", name);
  check(config.balance_window_rows == 0, "{}: data.balance = \"documents\" would separate a "
        "pair's sequences; use \"rows\" or \"none\" with preference pairs", name);
  check(min_length == 0, "{}: data.min_length would drop one sequence of a pair; it must be 0 "
        "with preference pairs (preference.max_length truncates instead)", name);
}
}  // namespace

DatasetRows::DatasetRows(const Dataset& dataset, const PackConfig& config, int64_t min_length,
                         bool shuffle, uint32_t seed, ProgressHook* progress)
    : config_(config) {
  config_.validate();
  check(!dataset.empty(), "the dataset has no files");
  row_starts_.push_back(0);
  int64_t documents = 0, tokens = 0, scanned = 0;
  if (progress) progress->begin("building the row index", count_documents(dataset), "documents");
  for (const auto& file : dataset) {
    // The balanced packer's windows take most of its time: it reports, the scan does not.
    const bool balanced = config_.balance_window_rows > 0;
    if (const auto* pairs = dynamic_cast<const PairSource*>(file.get())) {
      check(pairs_ || documents == 0, "{}: a dataset of preference pairs holds pair files only "
            "(an earlier file holds documents)", file->path().string());
      check_pair_settings(*pairs, config_, min_length);
      pairs_ = true;
      auto rows = std::make_unique<PairRows>(*pairs, pair_order(*pairs, shuffle, seed), config_);
      documents += static_cast<int64_t>(pairs->num_documents());
      scanned += static_cast<int64_t>(file->num_documents());
      if (progress) progress->update(scanned);
      if (rows->num_rows() == 0) continue;
      row_starts_.push_back(row_starts_.back() + rows->num_rows());
      files_.push_back(std::move(rows));
      continue;
    }
    check(!pairs_, "{}: a dataset of preference pairs holds pair files only (this file holds "
          "documents)", file->path().string());
    auto order = document_order(*file, min_length, shuffle, seed, balanced ? nullptr : progress,
                                scanned);
    documents += static_cast<int64_t>(order.size());
    for (const int64_t d : order) tokens += static_cast<int64_t>(file->document_length(d));
    std::unique_ptr<RowSource> rows;
    if (balanced)
      rows = std::make_unique<BalancedRows>(*file, std::move(order), config_, progress, scanned);
    else if (config_.use_packed_dataset)
      rows = build_pack(*file, std::move(order), config_);
    else
      rows = build_unpack(*file, std::move(order), config_);
    scanned += static_cast<int64_t>(file->num_documents());
    if (progress) progress->update(scanned);
    if (rows->num_rows() == 0) continue;
    row_starts_.push_back(row_starts_.back() + rows->num_rows());
    files_.push_back(std::move(rows));
  }
  check(documents > 0, "{}: the dataset has no documents{}", dataset.front()->path().string(),
        min_length > 0 ? fmt::format(" of at least data.min_length = {} tokens", min_length)
                       : std::string());
  check(num_rows() > 0,
        "{}: the dataset has no rows: every file has fewer than packed_length = {} tokens "
        "({} in all) and data.pack_tail = \"drop\"",
        dataset.front()->path().string(), config_.packed_length(), tokens);
  if (progress) progress->end();
}

void DatasetRows::row_into(int64_t k, MicroBatch& out) const {
  check(k >= 0 && k < num_rows(), "row {} out of range (the dataset has {} rows)", k, num_rows());
  out.pairs.clear();
  const auto f = std::upper_bound(row_starts_.begin(), row_starts_.end(), k) - row_starts_.begin() - 1;
  files_[f]->row_into(k - row_starts_[f], out);
}

void DatasetRows::segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const {
  check(k >= 0 && k < num_rows(), "row {} out of range (the dataset has {} rows)", k, num_rows());
  const auto f = std::upper_bound(row_starts_.begin(), row_starts_.end(), k) - row_starts_.begin() - 1;
  files_[f]->segments_into(k - row_starts_[f], cu_seqlens);
}

}  // namespace longtron::data
