// 2D-Attention (head parallel × context parallel, isp_attention.h + cp_attention.h) against the
// dense attention on the whole row: each rank of a head_size × context_size group (head groups of
// consecutive ranks, InternEvo's head_first) holds its slice of its context share
// (packing/context_split.h); its output rows and its dqkv rows must equal the dense ones at the row
// positions it holds, for every balance, on rows with documents longer than a share, documents of
// length 1 and a pad segment. Errors are max-norm relative and printed.
#pragma once
#include "isp_ops_cases.h"
#include "packing/context_split.h"

namespace longtron::testing {

/// Rows whose length is P: documents longer than a rank's share, length-1 documents, a pad tail.
inline std::vector<std::vector<int32_t>> cp_rows(int32_t P) {
  std::vector<int32_t> ones{0};
  while (ones.back() < P) ones.push_back(ones.back() + (ones.size() % 5 == 0 ? 7 : 1));
  ones.back() = P;
  return {{0, P},                                  // one document
          {0, P / 8, P / 8 + 1, P / 8 + 2, P - 3, P},  // long doc, two of length 1, tail
          ones};                                   // many short ones
}

/// One case: head_size x (world / head_size) context ranks, the form and ring layout, the
/// attention window (0 = none) and the row length per rank (16: one kernel tile; 160: documents
/// across several 64-token tiles and kernel blocks).
struct CpOpCase {
  int head_size, kv_heads;
  data::ContextBalance balance;
  parallel::ContextOptions options = {};
  int64_t window = 0, tokens_per_rank = 16;
};

inline std::string describe(const CpOpCase& k, int C) {
  return "hp" + std::to_string(k.head_size) + "xcp" + std::to_string(C) + " " +
         data::context_balance_name(k.balance) + " kv=" + std::to_string(k.kv_heads) +
         (k.options.form == parallel::ContextForm::kRing ? " ring" : " all-gather") +
         (k.options.window_size > 1 ? " ws" + std::to_string(k.options.window_size) : "") +
         (k.options.interleaved ? " interleaved" : "") +
         (k.window > 0 ? " window " + std::to_string(k.window) : "") +
         (k.options.group_tokens > 0 ? " groups " + std::to_string(k.options.group_tokens) : "") +
         " P/rank " +
         std::to_string(k.tokens_per_rank);
}

inline void check_context_attention(const CpOpCase& k) {
  const int T = world()->size(), t = world()->rank(), head_size = k.head_size;
  const int C = T / head_size, h = t % head_size, c = t / head_size;
  comm::CommPtr head = world()->split(c, h), context = world()->split(h, c);
  model::ModelConfig cfg = op_model(k.kv_heads);
  cfg.sliding_window = k.window;
  model::ParamTable full(cfg);
  auto dense = model::make_dense_ops<float>(full);
  model::AttentionOp<float>& ref = *dense.blocks[0].attention;
  auto scratch = std::make_shared<parallel::UlyssesAttention::Scratch>();
  parallel::UlyssesAttention cp(cfg, head, scratch, context, k.balance, k.window, k.options);
  const int64_t P = k.tokens_per_rank * T, n = P / T, Q = cfg.qkv_size(), A = cfg.hidden_size;
  for (const std::vector<int32_t>& cu : cp_rows(int32_t(P))) {
    std::vector<int32_t> idx;
    for (size_t s = 1; s < cu.size(); ++s)
      for (int32_t i = 0; i < cu[s] - cu[s - 1]; ++i) idx.push_back(i);
    const Vec qkv = random_vec(P * Q, 3), dout = random_vec(P * A, 4);
    Vec out(size_t(P * A)), saved(size_t(ref.saved_qkv_size(P))), lse(size_t(ref.saved_lse_size(P)));
    Vec dqkv(size_t(P * Q)), scratch(size_t(ref.saved_qkv_size(P)));
    const model::AttentionBatch gb{idx.data(), cu.data(), int64_t(cu.size()) - 1, P};
    ref.forward(out.data(), saved.data(), lse.data(), qkv.data(), gb);
    ref.backward(dqkv.data(), scratch.data(), dout.data(), saved.data(), out.data(), lse.data(), gb);

    const auto share = data::context_assignment(cu, C, k.balance)[size_t(c)];
    const std::vector<int32_t> mine(share.begin() + h * n, share.begin() + (h + 1) * n);
    Vec q, dy, want_out, want_dq;
    std::vector<int32_t> lidx;
    for (int32_t p : mine) {
      q.insert(q.end(), qkv.begin() + p * Q, qkv.begin() + (p + 1) * Q);
      dy.insert(dy.end(), dout.begin() + p * A, dout.begin() + (p + 1) * A);
      want_out.insert(want_out.end(), out.begin() + p * A, out.begin() + (p + 1) * A);
      want_dq.insert(want_dq.end(), dqkv.begin() + p * Q, dqkv.begin() + (p + 1) * Q);
      lidx.push_back(idx[size_t(p)]);
    }
    const model::AttentionBatch lb{lidx.data(), cu.data(), int64_t(cu.size()) - 1, n};
    Vec o(size_t(n * A)), s2(size_t(cp.saved_qkv_size(n))), l2(size_t(cp.saved_lse_size(n)));
    Vec dq(size_t(n * Q)), sc2(size_t(cp.saved_qkv_size(n)));
    cp.forward(o.data(), s2.data(), l2.data(), q.data(), lb);
    cp.backward(dq.data(), sc2.data(), dy.data(), s2.data(), o.data(), l2.data(), lb);
    const std::string tag = describe(k, C) + " segs=" + std::to_string(cu.size() - 1);
    report(tag + " out", world_max(rel_err(o.data(), want_out.data(), n * A)), 1e-5);
    report(tag + " dqkv", world_max(rel_err(dq.data(), want_dq.data(), n * Q)), 1e-5);
  }
  // At head size 1 there is no all-to-all, so no staging buffer for one is ever allocated.
  if (head_size == 1) {
    EXPECT_EQ(scratch->split.capacity(), 0u);
    EXPECT_EQ(scratch->packed.capacity(), 0u);
  }
  if (const parallel::RingBytes* b = cp.context() ? cp.context()->ring_bytes() : nullptr) {
    // Every block makes C − 1 hops (forward, and again in backward) and its dK/dV C − 1 hops
    // home: what is not sent is counted as skipped, so each pair adds up to the whole ring.
    const uint64_t rows = cp_rows(int32_t(P)).size(), M = uint64_t(P / C);
    const uint64_t row = uint64_t(2 * parallel::ulysses_heads(4, k.kv_heads, head_size).hkv_local *
                                  (cfg.hidden_size / 4) * 4);
    EXPECT_EQ(b->calls, rows);
    EXPECT_EQ(b->kv_sent + b->kv_skipped, 2 * rows * (C - 1) * M * row);
    EXPECT_EQ(b->dkv_sent + b->dkv_skipped, rows * (C - 1) * M * row);
    EXPECT_GT(b->kv_skipped, 0u) << "many short documents: some K/V rows are invisible";
  }
}

inline void check_context_attention(int head_size, int kv_heads, data::ContextBalance balance) {
  check_context_attention(CpOpCase{head_size, kv_heads, balance});
}

inline constexpr data::ContextBalance kAllBalances[] = {
    data::ContextBalance::kContiguous, data::ContextBalance::kZigzag,
    data::ContextBalance::kDocument};

inline void check_context_attention_all(int head_size, int kv_heads) {
  for (data::ContextBalance b : kAllBalances) check_context_attention(head_size, kv_heads, b);
}

/// Every balance, ring and all-gather forms, with the ring's `window_size` / interleaved layout,
/// without and with sliding windows (3: shorter than a tile; 70: across tiles), on short rows and
/// rows of several tiles per rank.
inline void check_context_attention_forms(int head_size, int kv_heads, int window_size = 1,
                                          bool interleaved = false) {
  for (data::ContextBalance b : kAllBalances)
    for (int64_t tokens : {16, 160})
      for (int64_t window : {0, 3, 70}) {
        if (tokens == 16 && window == 70) continue;
        CpOpCase k{head_size, kv_heads, b};
        k.options.window_size = window_size;
        k.options.interleaved = interleaved;
        k.window = window;
        k.tokens_per_rank = tokens;
        check_context_attention(k);
        if (tokens == 160) {  // the ring's kernels over groups of at most 40 queries
          CpOpCase g = k;
          g.options.group_tokens = 40;
          check_context_attention(g);
        }
        if (window_size == 1 && window == 0 && tokens == 160) {
          k.options.form = parallel::ContextForm::kAllGather;
          check_context_attention(k);
        }
      }
}

}  // namespace longtron::testing
