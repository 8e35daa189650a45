// 2D-Attention (head parallel × context parallel, isp_attention.h + cp_attention.h) against the
// dense attention on the whole row: each rank of a head_size × context_size group (head groups of
// consecutive ranks, InternEvo's head_first) holds its slice of its context share
// (data/context_split.h); its output rows and its dqkv rows must equal the dense ones at the row
// positions it holds, for every balance, on rows with documents longer than a share, documents of
// length 1 and a pad segment. Errors are max-norm relative and printed.
#pragma once
#include "data/context_split.h"
#include "isp_ops_cases.h"

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

inline void check_context_attention(int head_size, int kv_heads, data::ContextBalance balance) {
  const int T = world()->size(), t = world()->rank();
  const int C = T / head_size, h = t % head_size, c = t / head_size;
  comm::CommPtr head = world()->split(c, h), context = world()->split(h, c);
  const model::ModelConfig cfg = op_model(kv_heads);
  model::ParamLayout full(cfg);
  auto dense = model::make_dense_ops<float>(full);
  model::AttentionOp<float>& ref = *dense.blocks[0].attention;
  parallel::UlyssesAttention cp(cfg, head, nullptr, context, balance);
  const int64_t P = 16 * T, n = P / T, Q = cfg.qkv_size(), A = cfg.hidden_size;
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

    const auto share = data::context_assignment(cu, C, balance)[size_t(c)];
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
    const std::string tag = "hp" + std::to_string(head_size) + "xcp" + std::to_string(C) + " " +
                            data::context_balance_name(balance) + " kv=" +
                            std::to_string(kv_heads) + " segs=" + std::to_string(cu.size() - 1);
    report(tag + " out", world_max(rel_err(o.data(), want_out.data(), n * A)), 1e-5);
    report(tag + " dqkv", world_max(rel_err(dq.data(), want_dq.data(), n * Q)), 1e-5);
  }
}

inline void check_context_attention_all(int head_size, int kv_heads) {
  for (data::ContextBalance b : {data::ContextBalance::kContiguous, data::ContextBalance::kZigzag,
                                 data::ContextBalance::kDocument})
    check_context_attention(head_size, kv_heads, b);
}

}  // namespace longtron::testing
