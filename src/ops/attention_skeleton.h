// The loop structure that every varlen attention kernel shares (fp32/double in attention.cpp and
// attention_backward.cpp, bf16 in attention_bf16.cpp), over a tile-math policy that supplies the
// packing and the tile products. Forward: FlashAttention-2's Algorithm 1 (Dao 2023), one work
// item = (segment, kv head, query block), visiting the key blocks with a visible pair. Backward:
// Algorithm 2, one item = (segment, kv head, key block), the query blocks inner, dQ tiles added
// in key-block order (attention_dq_order.h) so the result does not depend on the thread count.
//
// A forward policy `Tile` (one per thread, made from the call `C`) provides:
//   Tile(const C&); pack_keys(item of p.k_side); pack_query_row(row, src);
//   begin(M, no_keys); groups() (room for 4·G RowGroups); key_block(ForwardBlock); o(), m(),
//   l() and base2() for the output rows.
// The call C: out, lse, q (the caller's element type T), s (AttentionShape), p (AttnPlan);
// optionally out16 (bf16 bits; when set, the output goes there instead of out).
// A backward policy: the call C (BackwardCall below plus pack_row(row, n, head) and
// pack_tile(tile, base, M)), and its Tile: Tile(C&); begin(segment, item, c0, k0, bj);
// key_range(plan, segment, r0, bi, c0, bj) → [lo, hi); products(BackwardBlock);
// add_dq(BackwardBlock, accumulate); end(offset of the block's first key row in dk/dv, bj).
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "ops/attention_blocks.h"
#include "ops/attention_dq_order.h"
#include "ops/attention_plan.h"
#include "ops/attention_rows.h"
#include "ops/kernel_isa.h"
#include "ops/ops.h"

LONGTRON_ISA_BEGIN

/// One key block of a forward item (keys [c0, c0 + bj) of segment g against the item's query
/// tile: queries [r0, r0 + bi), the G heads of the kv head stacked as rows h·bi + r, M = G·bi).
struct ForwardBlock {
  const AttnPlan* p;
  const AttnSegment* g;
  int64_t r0, bi, M, c0, bj;
  int64_t index;  // (global key block) · num_kv_heads + kv head: the packed K/V tile
  bool first;     // the item's first key block: O is written, not rescaled and added to
  bool full;      // every row sees the block's last key
  /// The rows' PV products in groups that stop at the last 16 keys they see (the causal edge,
  /// edge_row_groups); one group of the whole tile when `full`.
  const RowGroup* groups;
  int64_t n_groups;
};

/// dst[x] = o[x] · inv for x < d, in the output's element type.
template <typename T, typename A>
void scale_output_row(T* dst, const A* o, A inv, int64_t d) {
  for (int64_t x = 0; x < d; ++x) dst[x] = o[x] * inv;
}
/// The same row stored as bf16 bits: the fp32 values rounded as round_to_bf16 rounds them, so a
/// bf16 output is bitwise the rounding of the fp32 one (64 values at a time through the stack).
inline void scale_output_row(uint16_t* dst, const float* o, float inv, int64_t d) {
  float row[64];
  for (int64_t x0 = 0; x0 < d; x0 += 64) {
    const int64_t n = std::min<int64_t>(64, d - x0);
    for (int64_t x = 0; x < n; ++x) row[x] = o[x0 + x] * inv;
    round_to_bf16_serial(row, n, dst + x0);
  }
}

/// Writes an item's output rows: out = O / l (0 where l = 0, a row that saw no key) and lse =
/// m + ln l (m · ln 2 + ln l for base-2 maxima; −inf where l = 0). o [G·bi, d], m and l per row.
/// `out` is T or, for a float kernel, bf16 bits (uint16_t).
template <typename O, typename T, typename A>
void store_output_rows(O* out, T* lse, const A* o, const A* m, const A* l, bool base2,
                       const AttentionShape& s, int64_t kv_head, int64_t q0, int64_t bi) {
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, N = s.num_tokens;
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = kv_head * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = h * bi + r;
      const A inv = l[row] > A(0) ? A(1) / l[row] : A(0);
      scale_output_row(out + (q0 + r) * s.num_heads * d + head * d, o + row * d, inv, d);
      const A lse_row = !(l[row] > A(0)) ? -std::numeric_limits<A>::infinity()
                        : base2          ? m[row] * A(kLn2) + std::log(l[row])
                                         : m[row] + std::log(l[row]);
      lse[head * N + q0 + r] = lse_row;
    }
  }
}

/// The forward of one work item (a query tile against its key blocks).
template <typename Tile, typename C>
void forward_item(Tile& w, const C& c, const AttnItem& it) {
  const AttentionShape& s = c.s;
  const AttnPlan& p = c.p;
  const AttnSegment& g = p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads;
  const int64_t r0 = it.block * kAttnBlock, q0 = g.q_begin + r0;
  const int64_t bi = std::min(kAttnBlock, g.q_len - r0), M = G * bi;
  // Pack the query tile: row h·bi + r holds query head kv_head·G + h at token q0 + r.
  for (int64_t h = 0; h < G; ++h)
    for (int64_t r = 0; r < bi; ++r)
      w.pack_query_row(h * bi + r, c.q + (q0 + r) * s.q_stride + (it.kv_head * G + h) * d);
  // The first key block writes O (no zero fill); an item without one leaves zeros.
  w.begin(M, it.first == it.last);
  RowGroup* groups = w.groups();  // ≤ 4 per head (64 keys = 4 × 16)
  for (int64_t j = it.first; j < it.last; ++j) {
    const int64_t c0 = j * kAttnBlock, bj = std::min(kAttnBlock, g.k_len - c0);
    // Where a row does not see every key of the block (the causal edge), its PV product stops
    // at the last 16 keys it sees: rows in groups, the same values (the keys left out hold
    // P = 0). Whether the S product stops there too is the policy's choice: the fp32 one
    // stops it by the same row groups; the bf16 one keeps it whole (its narrower register
    // blocks ran slower).
    const bool full = p.key_hi(g, r0) >= c0 + bj;
    const int64_t n_groups = full ? 1 : edge_row_groups(groups, p, g, r0, bi, G, c0, bj);
    if (full) groups[0] = {0, M, (bj + 15) / 16};
    w.key_block(ForwardBlock{&p, &g, r0, bi, M, c0, bj,
                             (g.k_block0 + j) * s.num_kv_heads + it.kv_head, j == it.first,
                             full, groups, n_groups});
  }
  // A call with out16 (the bf16 kernel's) may store its output as bf16 bits instead.
  if constexpr (requires { c.out16; })
    if (c.out16 != nullptr)
      return store_output_rows(c.out16, c.lse, w.o(), w.m(), w.l(), w.base2(), s, it.kv_head, q0,
                               bi);
  store_output_rows(c.out, c.lse, w.o(), w.m(), w.l(), w.base2(), s, it.kv_head, q0, bi);
}

/// The parallel forward: every (key block, kv head) packed once, then the items, largest first.
template <typename Tile, typename C>
void run_forward(const C& c) {
  const int64_t n_items = static_cast<int64_t>(c.p.items.size());
  const int64_t n_keys = static_cast<int64_t>(c.p.k_side.size());
#pragma omp parallel
  {
    Tile w(c);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_keys; ++i) w.pack_keys(c.p.k_side[i]);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i) forward_item(w, c, c.p.items[i]);
  }
}

/// One query tile of a backward item: queries [r0, r0 + bi) of segment g (rows h·bi + r, M =
/// G·bi, packed at row `base` of the call's query tiles, tile index `tile`) against the keys
/// [c0 + lo, c0 + hi) of the item's key block (the only ones it sees).
struct BackwardBlock {
  const AttnPlan* p;
  const AttnSegment* g;
  int64_t r0, bi, M, c0, bj, lo, hi, tile, base;
  bool first;  // the item's first query tile
};

/// The call-level state every backward shares: the caller's dq (element type T) and the
/// query-side tiles, each packed once per call (ChainTiles), in tile order (tile (query block
/// b, kv head g) at index b·Hkv + g, its rows at tile · tile_rows, row h·bi + r for query head
/// g·G + h at token q0 + r): the accumulated dq [rows, d] (element type A) and per tile whether
/// a key block has written it.
template <typename T, typename A>
struct BackwardCall {
  const AttentionShape& s;
  const AttnPlan& p;
  int64_t tile_rows;  // G · 64
  A* dq_tiles;
  // Per tile: whether a key block has written its dq yet. The first add writes instead of adding
  // (no zero fill of dq); read and set only on the tile's turn (DqOrder), so never concurrently.
  uint8_t* dq_written;
};

enum class Move { kPack, kStore, kAdd };

/// Packs (kPack) the query block of `it` (c.pack_row per row, then c.pack_tile), or moves its
/// accumulated dq into the caller's dq (layout of q), overwriting (kStore) or adding to (kAdd) it.
template <typename C, typename T>
void move_query_block(C& c, T* dq, const AttnItem& it, Move move) {
  const AttentionShape& s = c.s;
  const AttnSegment& sg = c.p.segments[it.seg];
  const int64_t d = s.head_dim, G = s.num_heads / s.num_kv_heads, g = it.kv_head;
  const int64_t q0 = sg.q_begin + it.block * kAttnBlock;
  const int64_t bi = std::min(kAttnBlock, sg.q_len - it.block * kAttnBlock);
  const int64_t tile = (sg.q_block0 + it.block) * s.num_kv_heads + g;
  const int64_t base = tile * c.tile_rows;
  // A tile no key block added into: its queries see no key (possible with key_offsets).
  if (move != Move::kPack && !c.dq_written[tile])
    std::fill_n(&c.dq_tiles[base * d], G * bi * d, 0);
  for (int64_t h = 0; h < G; ++h) {
    const int64_t head = g * G + h;
    for (int64_t r = 0; r < bi; ++r) {
      const int64_t row = base + h * bi + r, n = q0 + r;
      T* dst = dq + n * s.q_stride + head * d;
      const auto* src = &c.dq_tiles[row * d];
      if (move == Move::kStore) {
        std::memcpy(dst, src, sizeof(T) * d);
      } else if (move == Move::kAdd) {
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) dst[x] += src[x];
      } else {
        c.pack_row(row, n, head);
      }
    }
  }
  if (move == Move::kPack) c.pack_tile(tile, base, G * bi);
}

/// The backward of one work item (a key block against the query tiles that see it): dK and dV
/// accumulated privately and written once, dQ added into the shared tiles on their turn.
template <typename Tile>
void backward_item(Tile& w, DqOrder& order, uint8_t* dq_written, const AttentionShape& s,
                   const AttnPlan& p, int64_t tile_rows, const AttnItem& it) {
  const AttnSegment& sg = p.segments[it.seg];
  const int64_t G = s.num_heads / s.num_kv_heads;
  const int64_t c0 = it.block * kAttnBackwardKeyBlock, k0 = sg.k_begin + c0;
  const int64_t bj = std::min(kAttnBackwardKeyBlock, sg.k_len - c0);
  w.begin(sg, it, c0, k0, bj);
  for (int64_t i = it.first; i < it.last; ++i) {
    const int64_t r0 = i * kAttnBlock, bi = std::min(kAttnBlock, sg.q_len - r0);
    const int64_t tile = DqOrder::tile(p, s.num_kv_heads, it, i);
    const auto [lo, hi] = Tile::key_range(p, sg, r0, bi, c0, bj);
    if (lo >= hi) {  // nothing to add, but the turn still passes through this block
      order.wait(tile, it.block);
      order.pass(tile, it.block);
      continue;
    }
    const BackwardBlock b{&p, &sg, r0, bi, G * bi, c0, bj, lo, hi, tile, tile * tile_rows,
                          i == it.first};
    w.products(b);
    // dQ += dS K, straight into the shared tile on this block's turn (attention_dq_order.h).
    order.wait(tile, it.block);
    w.add_dq(b, dq_written[tile] != 0);
    dq_written[tile] = 1;
    order.pass(tile, it.block);
  }
  w.end(k0 * s.kv_stride + it.kv_head * s.head_dim, bj);
}

/// The query tiles of each chain (the query blocks of one (segment, kv head)) are packed just
/// before the chain's first item and their dq moved out just after its last, so that the chain's
/// products and that move find them in cache. Packed for the whole call up front (and moved out
/// after it), the tiles of a long row, several bytes per query element and far more than the
/// caches hold, came back from memory (docs/benchmarks.md). Shared by the threads of the region:
/// a thread that joins a chain another is still packing waits for it.
class ChainTiles {
 public:
  ChainTiles(const AttnPlan& p, int64_t num_kv_heads)
      : p_(p),
        heads_(num_kv_heads),
        items_(p.segments.size() * size_t(num_kv_heads)),
        state_(new std::atomic<int>[items_.size()]),
        left_(new std::atomic<int64_t>[items_.size()]) {
    for (const AttnItem& it : p.items) ++items_[key(it.seg, it.kv_head)];
    for (size_t i = 0; i < items_.size(); ++i) {
      state_[i].store(kUnpacked, std::memory_order_relaxed);
      left_[i].store(items_[i], std::memory_order_relaxed);
    }
  }
  /// Before item `it`: makes sure its chain is packed, pack(q_side index) for each query block
  /// by the first thread to get here. The q_side index is the tile index (DqOrder::tile).
  template <typename Pack>
  void before(const AttnItem& it, Pack&& pack) {
    std::atomic<int>& state = state_[key(it.seg, it.kv_head)];
    int seen = state.load(std::memory_order_acquire);
    if (seen == kPacked) return;
    if (seen == kUnpacked &&
        state.compare_exchange_strong(seen, kPacking, std::memory_order_acquire)) {
      for_each_tile(it, pack);
      state.store(kPacked, std::memory_order_release);
      state.notify_all();
      return;
    }
    for (seen = state.load(std::memory_order_acquire); seen != kPacked;
         seen = state.load(std::memory_order_acquire))
      state.wait(seen, std::memory_order_acquire);
  }
  /// After item `it`: the thread that finishes its chain's last item moves the chain's tiles
  /// out, move(q_side index) (acquire: it sees every dQ add of the chain).
  template <typename Move>
  void after(const AttnItem& it, Move&& move) {
    if (left_[key(it.seg, it.kv_head)].fetch_sub(1, std::memory_order_acq_rel) == 1)
      for_each_tile(it, move);
  }
  /// Whether query tile `q` (a q_side entry) belongs to a chain with items; the tiles of the
  /// others (queries that see no key) are left to the caller.
  bool moved(const AttnItem& q) const { return items_[key(q.seg, q.kv_head)] > 0; }

 private:
  static constexpr int kUnpacked = 0, kPacking = 1, kPacked = 2;
  size_t key(int64_t seg, int64_t kv_head) const { return size_t(seg * heads_ + kv_head); }
  template <typename F>
  void for_each_tile(const AttnItem& it, F& f) const {
    const AttnSegment& g = p_.segments[static_cast<size_t>(it.seg)];
    for (int64_t b = 0; b < g.q_blocks(); ++b) f((g.q_block0 + b) * heads_ + it.kv_head);
  }
  const AttnPlan& p_;
  int64_t heads_;
  std::vector<int64_t> items_;  // per chain: its number of items
  std::unique_ptr<std::atomic<int>[]> state_;
  std::unique_ptr<std::atomic<int64_t>[]> left_;
};

/// The parallel backward: the items claimed chain by chain in block order (ChainClaim, what
/// DqOrder needs), each chain's query tiles packed before its first item and its dq moved into
/// the caller's layout after its last (ChainTiles). `c` is a BackwardCall (derived) whose
/// dq_written has p.q_blocks · num_kv_heads entries.
template <typename Tile, typename C, typename T>
void run_backward(C& c, T* dq, bool add_dq) {
  const AttnPlan& p = c.p;
  std::fill_n(c.dq_written, p.q_blocks * c.s.num_kv_heads, uint8_t(0));
  DqOrder order(p, c.s.num_kv_heads);
  ChainClaim items(p);  // chains in block order, largest first
  ChainTiles chains(p, c.s.num_kv_heads);
  const Move out = add_dq ? Move::kAdd : Move::kStore;
  const auto pack = [&](int64_t q) { move_query_block(c, dq, p.q_side[q], Move::kPack); };
  const auto move_out = [&](int64_t q) { move_query_block(c, dq, p.q_side[q], out); };
  const int64_t n_queries = static_cast<int64_t>(p.q_side.size());
#pragma omp parallel
  {
    Tile w(c);
    int64_t chain = -1;
    for (int64_t i = items.claim(chain); i >= 0; i = items.claim(chain)) {
      chains.before(p.items[i], pack);
      backward_item(w, order, c.dq_written, c.s, p, c.tile_rows, p.items[i]);
      chains.after(p.items[i], move_out);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_queries; ++i)
      if (!chains.moved(p.q_side[i])) move_out(i);
  }
}

LONGTRON_ISA_END
