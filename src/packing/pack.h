// Rows from documents (docs/data.md): `build_pack` (packed rows) and `build_unpack` (one document
// per SEQ_LEN slot). A row is located from prefix sums of document lengths (binary search), never by
// replaying the stream, so any row of a dataset of any size costs O(log documents + P).
// Upstream: InternEvo `PackedDatasetWithCut`, `PackedDatasetWithoutCuSeqlen`, `build_unpack`
// (internlm/data/tokenized/packed_dataset.py); the padded tail is what InternEvo's data-flow
// walkthrough prints (docs/data.md).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "data/dataset.h"
#include "data/progress_hook.h"
#include "packing/balance.h"
#include "packing/batch.h"

namespace longtron::data {

/// What happens to the last partial packed row: padded (default) or dropped (InternEvo).
enum class PackTail { kPad, kDrop };
/// The config spellings of PackTail.
inline constexpr std::array<EnumName<PackTail>, 2> kPackTailNames{
    {{PackTail::kPad, "pad"}, {PackTail::kDrop, "drop"}}};

/// Parses "pad" / "drop" (config key `data.pack_tail`); anything else is an Error naming the key.
PackTail parse_pack_tail(const std::string& value);

/// The packing settings of `data.*` (docs/configuration.md). P = packed_length() = micro_bsz × seq_len.
struct PackConfig {
  int64_t seq_len = 0;     ///< L, the longest attention segment (SEQ_LEN)
  int64_t micro_bsz = 0;   ///< rows of L per packed row
  bool use_packed_dataset = true;
  bool pack_sample_into_one = false;
  PackTail pack_tail = PackTail::kPad;
  /// `data.split_documents`: true (InternEvo) cuts documents at row edges; false starts a document
  /// that does not fit the rest of a row on the next row (the rest is one pad segment). A document
  /// longer than P starts on a fresh row and is still cut into P-long pieces.
  bool split_documents = true;
  /// `data.balance = "documents"`: rows per balancing window (data.balance_window × micro_num ×
  /// dp size; balanced_pack.h). 0: plain packing.
  int64_t balance_window_rows = 0;
  /// How "documents" counts a segment's attention pairs (RowCost::pairs: with the model's sliding
  /// window only the visible ones; the loader passes data.balance's cost).
  RowCost balance_pairs;
  /// Preference pairs (pair_pack.h): TRL's max_length per sequence (0: none; a longer sequence
  /// is refused) and its truncation_mode (true: "keep_end", false: "keep_start").
  int64_t pair_max_length = 0;
  bool pair_keep_end = false;
  /// Throws Error ("data.seq_len must be > 0, got 0") for seq_len or micro_bsz <= 0 or P > 2^31-1,
  /// and, with balance_window_rows > 0, for unpacked rows, pack_sample_into_one or
  /// split_documents = false (naming the keys).
  void validate() const;
  int64_t packed_length() const { return seq_len * micro_bsz; }
};

/// Document order of one file (docs/data.md): ids of documents with length >= min_length
/// (empty documents are dropped too: they hold no token and would give empty segments), then, if
/// `shuffle`, permuted exactly as InternEvo does: `RandomState(seed).shuffle` of the surviving list,
/// reseeded per file. `progress` (may be null) gets update(`progress_base` + documents scanned)
/// every kProgressStepDocuments documents (no begin/end: the caller's pass spans files).
std::vector<int64_t> document_order(const DocumentSource& source, int64_t min_length, bool shuffle,
                                    uint32_t seed, ProgressHook* progress = nullptr,
                                    int64_t progress_base = 0);

/// Rows of one packing mode. row_into() fills `out` (buffers reused) with a normalized micro-batch:
/// input_ids/labels/indexes [P], cu_seqlens [k+1] (0 … P), max_seqlen (docs/data.md).
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual int64_t num_rows() const = 0;
  /// Fills row k (0 <= k < num_rows(), else Error). Reads only the documents the row covers.
  virtual void row_into(int64_t k, MicroBatch& out) const = 0;
  /// Row k as a new MicroBatch.
  MicroBatch row(int64_t k) const {
    MicroBatch b;
    row_into(k, b);
    return b;
  }
  virtual int64_t packed_length() const = 0;
  /// Only the cu_seqlens of row k (row-local, 0 … P), as row_into would give them. The default
  /// builds the row; the packers override it with arithmetic on document offsets (no token read),
  /// so a step's costs (data.balance) are cheap to know on every rank.
  virtual void segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const {
    MicroBatch b;
    row_into(k, b);
    cu_seqlens = std::move(b.cu_seqlens);
  }
};

/// build_pack over one file (docs/data.md): the documents of `order`, concatenated; row k is tokens
/// [kP, (k+1)P). Labels are the next token of the same document (also across a row boundary), -100
/// at a document end; pieces are cut into attention segments of <= L from the piece start. With
/// pack_sample_into_one, cu_seqlens is [0, L, …, P], indexes 0..L-1 repeated and labels are -100 at
/// every piece end. The partial tail row is padded (tokens 0, labels -100, one pad segment with
/// indexes 0..k-1; into-one: the fixed windows are kept) or dropped per pack_tail.
/// Token rule (docs/data.md, InternEvo `packed_collate_fn`): input = abs(id); a label id <= 0 is -100.
/// With split_documents = false the stream has pad gaps (tokens 0, labels -100, one segment each)
/// wherever a document was moved to the next row. `source` must outlive the object.
class PackedRows : public RowSource {
 public:
  PackedRows(const DocumentSource& source, std::vector<int64_t> order, const PackConfig& config);
  int64_t num_rows() const override { return num_rows_; }
  void row_into(int64_t k, MicroBatch& out) const override;
  int64_t packed_length() const override { return P_; }
  void segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const override;
  /// Tokens in the stream (sum of the ordered document lengths; pad gaps not counted).
  int64_t num_tokens() const { return num_tokens_; }
  /// [n+1] stream offset where each ordered document starts (row k covers [kP, (k+1)P)); the last
  /// entry is the stream end. Equal to prefix sums of the lengths unless pad gaps were inserted.
  const std::vector<int64_t>& document_starts() const { return starts_; }

 private:
  int64_t fill_tokens(int64_t k, MicroBatch& out) const;  // returns tokens written (< P at tail)
  void fill_segments(int64_t filled, MicroBatch& out) const;
  void place_documents();  // fills starts_/lengths_ (with pad gaps when !split_documents)

  const DocumentSource& source_;
  std::vector<int64_t> order_;
  std::vector<int64_t> starts_;   // [n+1] stream offset of each ordered document; [n] = stream end
  std::vector<int64_t> lengths_;  // [n] their token counts (starts_[d+1] - starts_[d] - gap)
  int64_t num_tokens_ = 0;
  PackConfig config_;
  int64_t P_;
  int64_t num_rows_;
  // Scratch of the row being built (so row_into is not thread-safe: one PackedRows per thread).
  mutable std::vector<int32_t> raw_;  // P+1 stored ids of the row (+ the continuation token)
  mutable std::vector<int64_t> piece_ends_;  // row offset where each document piece ends
  mutable std::vector<char> doc_ends_;       // whether that piece ends its document
  mutable std::vector<char> pads_;           // whether that piece is a pad gap
};

/// build_unpack over one file (docs/data.md): row i holds documents [i·B, (i+1)·B) of `order`, each
/// truncated to its first L tokens (labels shift inside the kept part, -100 at its end), one
/// segment per document, padded to P with one pad segment. A last group of < B documents is kept.
class UnpackedRows : public RowSource {
 public:
  UnpackedRows(const DocumentSource& source, std::vector<int64_t> order, const PackConfig& config);
  int64_t num_rows() const override { return num_rows_; }
  void row_into(int64_t k, MicroBatch& out) const override;
  int64_t packed_length() const override { return config_.packed_length(); }
  void segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const override;

 private:
  const DocumentSource& source_;
  std::vector<int64_t> order_;
  PackConfig config_;
  int64_t num_rows_;
  mutable std::vector<int32_t> raw_;
};

/// Named after InternEvo's builders: packed rows / unpacked rows of one file.
std::unique_ptr<PackedRows> build_pack(const DocumentSource& source, std::vector<int64_t> order,
                                       const PackConfig& config);
std::unique_ptr<UnpackedRows> build_unpack(const DocumentSource& source,
                                           std::vector<int64_t> order, const PackConfig& config);

/// The rows of a whole dataset: each file packed independently (packs never cross a file
/// boundary, docs/data.md), rows of file f after those of file f-1 (InternEvo's ConcatDataset).
class DatasetRows : public RowSource {
 public:
  /// One RowSource per file (packed or unpacked per config.use_packed_dataset), document order
  /// from document_order(file, min_length, shuffle, seed); a file of preference pairs gives
  /// PairRows (pair_pack.h; settings that would separate a pair are an Error naming the key). Throws Error if no row results
  /// ("dataset has no rows: N tokens < packed_length P with pack_tail=drop" or no documents).
  /// `progress` (may be null) sees one pass "building the row index" counted in documents
  /// (updated while each file's documents are scanned and when its rows are built).
  DatasetRows(const Dataset& dataset, const PackConfig& config, int64_t min_length, bool shuffle,
              uint32_t seed, ProgressHook* progress = nullptr);
  int64_t num_rows() const override { return row_starts_.back(); }
  void row_into(int64_t k, MicroBatch& out) const override;
  int64_t packed_length() const override { return config_.packed_length(); }
  void segments_into(int64_t k, std::vector<int32_t>& cu_seqlens) const override;
  /// Whether the dataset holds preference pairs (pair_pack.h): its rows carry MicroBatch::pairs.
  bool has_pairs() const { return pairs_; }

 private:
  PackConfig config_;
  bool pairs_ = false;
  std::vector<std::unique_ptr<RowSource>> files_;
  std::vector<int64_t> row_starts_;  // [files+1]
};

}  // namespace longtron::data
