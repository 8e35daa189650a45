// The plan of ring attention over a packed row (docs/isp.md, "2D-Attention"): which K/V block each
// context rank attends to at each step, who sends which rows of it to whom, which queries see
// which keys of it, and how the dK/dV of each block travel home. Pure functions of (cu_seqlens,
// context size, balance, window_size, interleaved, attention window): every rank computes the
// same plan, so a row of K/V that no query downstream can see is neither sent nor computed.
//
// Schedule (LoongTrain's double ring, arXiv 2406.18485 §4.2): the C context ranks form C/w inner
// rings of w = window_size ranks; rank q = (g, i) (inner ring g, place i) attends at step
// k = o·w + t (o < C/w, t < w) to the block of (g − o, i − t). A block reaches the next inner
// place over the inner ring and the first place of the next inner ring over the outer ring, so
// with w = 1 (one rank per inner ring) or w = C it is the plain ring (Liu et al., Ring Attention,
// arXiv 2310.01889; ring-flash-attn). Inner rings: context ranks [g·w, (g+1)·w) (ranks
// g + i·(C/w) when interleaved; the inner ring then spans the outer stride, see docs/isp.md).
// dK/dV of a block (backward) follow the same rings forward: the ranks t = 1 … w−1 of an inner
// ring add their contributions one after the other, the last hands the sum to the ring's first
// place, which adds its own and passes it on the outer ring; the last outer hop reaches home.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "packing/context_split.h"

namespace longtron::parallel {

/// Order of the K/V blocks over C context ranks in inner rings of `window_size` ranks.
class RingSchedule {
 public:
  /// Throws Error unless C >= 1, window_size >= 1 and window_size divides C.
  RingSchedule(int context_size, int window_size, bool interleaved);
  int size() const { return C_; }
  /// The block (owner's context rank) that rank q attends to at step k in [0, C).
  int source(int q, int k) const;
  /// The step at which rank q attends to block s.
  int step(int q, int s) const;
  /// The rank q receives block s from (−1 when q owns it).
  int kv_parent(int q, int s) const;
  /// The rank q sends its dK/dV sum for block s to (−1 when q owns it).
  int dkv_next(int q, int s) const;

 private:
  std::pair<int, int> place(int q) const;  // (inner ring g, place i)
  int rank_at(int g, int i) const;
  int C_, w_, G_;
  bool interleaved_;
};

/// Sorted disjoint row ranges [first, second) of a block (rows = the owner's positions, ascending).
using RowRanges = std::vector<std::pair<int32_t, int32_t>>;
/// Number of rows in `r`.
int64_t row_count(const RowRanges& r);

/// One varlen kernel call of a step: this rank's query runs (all of them, cu_seqlens_q) against
/// keys copied from the block (key_rows, block-local, in key-buffer order; cu_seqlens_k per run,
/// empty for runs that see nothing in this pass) with per-run key_offsets (ops::AttentionShape).
struct RingPass {
  std::vector<int32_t> cu_seqlens_k, key_offsets, key_rows;
};

/// A point-to-point message of a block's rows: to/from `peer`, the rows it carries.
struct RingMessage {
  int block, peer;
  RowRanges rows;
};

/// The plan of context rank `rank` for one row.
struct RingPlan {
  std::vector<int32_t> cu_seqlens;
  int64_t window = 0, M = 0;
  data::ContextSegments segments;               // this rank's query runs
  std::vector<int> source;                      // [step] block attended to
  std::vector<std::vector<RingPass>> passes;    // [step] kernel calls (empty: nothing visible)
  std::vector<RowRanges> received;              // [block] rows this rank receives (own: all)
  std::vector<std::vector<int32_t>> slot;       // [block] block row → row of the received buffer
  std::vector<std::vector<RingMessage>> kv_send;  // [step] forwarded at the start of the step
  std::vector<std::vector<RingMessage>> kv_recv;  // [step] posted at the start of the step
  // dK/dV: dkv_send[k] leave at the end of step k, dkv_recv[k] are posted at the end of step k
  // and waited at the end of step k + 1.
  std::vector<std::vector<RingMessage>> dkv_send, dkv_recv;
  int steps_backward = 0;                       // steps incl. the drain of dK/dV messages
  /// Bytes (per row of K and V) of the hops of a plain ring that sent every block whole, minus
  /// those of this plan: rows this rank does not send (kv: forward, dkv: backward).
  int64_t kv_rows_sent = 0, kv_rows_skipped = 0, dkv_rows_sent = 0, dkv_rows_skipped = 0;
};

/// The plan of context rank `rank` of C (= schedule.size()) for a row with `cu_seqlens`, its
/// assignment `shares` (data::context_assignment) and an attention window (0 = none).
RingPlan make_ring_plan(std::span<const int32_t> cu_seqlens,
                        const std::vector<std::vector<int32_t>>& shares,
                        const RingSchedule& schedule, int rank, int64_t window);

}  // namespace longtron::parallel
