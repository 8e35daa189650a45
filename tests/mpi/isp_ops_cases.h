// ISP ops on their own (isp_ops_np2_test.cpp, isp_ops_np4_test.cpp): each op's forward and
// backward against the dense op on the same full tensors, where every rank of the world holds a
// different slice of the tokens; the Ulysses all-to-all pair against a direct computation.
// Weight gradients are compared after the engine's data-parallel step (a SUM over WEIGHT_DATA)
// so that every token of the world counts once. Errors are max-norm relative and printed.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bf16_here.h"
#include "core/error.h"
#include "model/layers.h"
#include "model/params.h"
#include "modes/isp_ops.h"
#include "modes/isp_weights.h"
#include "mpi_test_main.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "parallel/isp_attention.h"
#include "parallel/layout.h"
#include "parallel/mappings.h"

namespace longtron::testing {

using Vec = std::vector<float>;
using parallel::Layout;
using parallel::TensorMode;

inline Vec random_vec(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Vec v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

/// max|a − b| / max|b| over a[n] and b[n].
inline double rel_err(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Largest error over the world (so every rank asserts the same).
inline double world_max(double e) {
  world()->all_reduce(&e, 1, comm::ReduceOp::kMax);
  return e;
}

inline void report(const std::string& what, double err, double tol) {
  if (world()->rank() == 0) std::printf("[isp-op] %-46s max rel err %.2e\n", what.c_str(), err);
  EXPECT_LT(err, tol) << what;
}

/// vocab 37 (uneven head rows over 2 and 4), hidden 32, 4 heads, FFN 85 (uneven), 1 layer.
inline model::ModelConfig op_model(int kv_heads) {
  model::ModelConfig c;
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.num_layers = 1;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = kv_heads;
  c.multiple_of = 1;
  return c;
}

inline Layout isp_layout(int T, int W, bool overlap = false) {
  Layout l;
  l.tensor_size = T;
  l.tensor_mode = TensorMode::kIsp;
  l.weight_size = W;
  l.weight_overlap = overlap;
  return l;
}

inline std::string name_of(const Layout& l) {
  return "T=" + std::to_string(l.tensor_size) + " W=" + std::to_string(l.weight_size);
}

/// Every rank's slice of a full buffer of world·n rows (tokens distinct across the world).
inline Vec rows_of(const Vec& full, int64_t n, int64_t cols, int rank) {
  return Vec(full.begin() + rank * n * cols, full.begin() + (rank + 1) * n * cols);
}

/// Sums a sharded gradient over WEIGHT_DATA (the engine's data-parallel step under ISP).
inline void data_sum(float* g, int64_t n, const parallel::Grid& grid) {
  if (grid.weight_data->size() > 1) grid.weight_data->all_reduce(g, n);
}

/// Where every weight-parallel case starts: the grid of `layout`, the op model's full layout, its
/// full parameters (seeded), this rank's shards of them (local), a gradient of the local layout
/// and the shard plan. Used through a structured binding; never copied (Params keep the layout).
struct IspCase {
  parallel::Grid grid;
  model::ParamTable full;
  model::Params<float> params, local, grads;
  std::vector<parallel::IspShard> plan;
  IspCase(const Layout& layout, uint64_t seed)
      : grid(parallel::make_grid(world(), layout)), full(op_model(2)), params(full), local(full),
        grads(full) {
    model::init_params(params, seed);
    plan = parallel::isp_shard_plan(full, layout.weight_size, grid.weight->rank());
    parallel::isp_scatter_params(local, params, plan);
  }
  IspCase(const IspCase&) = delete;
  IspCase& operator=(const IspCase&) = delete;
};

/// A weight-parallel linear (view `view` of the full layout used as [out, in]) against dense.
inline void check_linear(const Layout& layout, int view, bool overlap) {
  const int R = world()->size(), r = world()->rank();
  IspCase setup(layout, 5);
  auto& [grid, full, params, local, grads, plan] = setup;
  const auto& v = full.view(view);
  const int64_t out = v.shape[0], in = v.shape[1], n = 6;
  auto store = std::make_shared<parallel::IspWeightStore>(grid.weight, overlap);
  parallel::IspLinear lin(store, view, -1, out, in);
  const Vec X = random_vec(R * n * in, 1), dY = random_vec(R * n * out, 2);
  Vec Y(size_t(R * n * out)), dX(size_t(R * n * in)), dW(size_t(out * in), 0.f);
  ops::linear_forward<float>(Y.data(), X.data(), params.ptr(view), nullptr, R * n, in, out);
  ops::linear_backward<float>(dX.data(), dW.data(), nullptr, dY.data(), X.data(), params.ptr(view),
                       R * n, in, out);
  const Vec x = rows_of(X, n, in, r), dy = rows_of(dY, n, out, r);
  Vec y(size_t(n * out)), dx(size_t(n * in));
  for (int rep = 0; rep < 2; ++rep) {  // twice: the second pass may use prefetched weights
    grads.zero();
    store->begin_pass();  // the model's embedding would start the pass
    lin.forward(y.data(), x.data(), n, local);
    lin.backward(dx.data(), dy.data(), x.data(), n, local, &grads, false);
  }
  const parallel::IspShard& s = plan[size_t(view)];
  data_sum(grads.ptr(view), s.count * in, grid);
  const Vec g(grads.ptr(view), grads.ptr(view) + s.count * in);  // the second pass's gradient
  const std::string tag = name_of(layout) + " " + v.name + (overlap ? " overlap" : "");
  report(tag + " y", world_max(rel_err(y.data(), Y.data() + r * n * out, n * out)), 1e-5);
  report(tag + " dx", world_max(rel_err(dx.data(), dX.data() + r * n * in, n * in)), 1e-5);
  report(tag + " dW shard", world_max(rel_err(g.data(), dW.data() + s.start * in, s.count * in)),
         1e-5);
}

/// A packed row of P tokens with 3 documents (one crossing every shard edge).
inline void make_segments(int64_t P, std::vector<int32_t>& cu, std::vector<int32_t>& idx) {
  cu = {0, int32_t(P / 3), int32_t(P / 3 + P / 2), int32_t(P)};
  idx.clear();
  for (size_t s = 1; s < cu.size(); ++s)
    for (int32_t i = 0; i < cu[s] - cu[s - 1]; ++i) idx.push_back(i);
}

/// Ulysses attention (TENSOR group) against the dense attention on the whole row; with
/// `group_tokens` > 0 its kernels run over groups of whole documents of that many queries.
inline void check_attention(const Layout& layout, int kv_heads, int64_t group_tokens = 0) {
  parallel::Grid grid = parallel::make_grid(world(), layout);
  const int T = grid.tensor->size(), t = grid.tensor->rank();
  const model::ModelConfig c = op_model(kv_heads);
  model::ParamTable full(c);
  auto dense = model::make_dense_ops<float>(full);
  model::AttentionOp<float>& ref = *dense.blocks[0].attention;
  parallel::ContextOptions options;
  options.group_tokens = group_tokens;
  parallel::UlyssesAttention isp(c, grid.tensor, nullptr, nullptr, data::ContextBalance::kZigzag,
                                 0, options);
  const int64_t n = 5, P = T * n, Q = c.qkv_size(), A = c.hidden_size;
  std::vector<int32_t> cu, idx;
  make_segments(P, cu, idx);
  const Vec qkv = random_vec(P * Q, 3), dout = random_vec(P * A, 4);
  Vec out(size_t(P * A)), saved(size_t(ref.saved_qkv_size(P))), lse(size_t(ref.saved_lse_size(P)));
  Vec dqkv(size_t(P * Q)), scratch(size_t(ref.saved_qkv_size(P)));
  const model::AttentionBatch gb{idx.data(), cu.data(), int64_t(cu.size()) - 1, P};
  ref.forward(out.data(), saved.data(), lse.data(), qkv.data(), gb);
  ref.backward(dqkv.data(), scratch.data(), dout.data(), saved.data(), out.data(), lse.data(), gb);

  const Vec q = rows_of(qkv, n, Q, t), dy = rows_of(dout, n, A, t);
  const model::AttentionBatch lb{idx.data() + t * n, cu.data(), int64_t(cu.size()) - 1, n};
  Vec o(size_t(n * A)), s2(size_t(isp.saved_qkv_size(n))), l2(size_t(isp.saved_lse_size(n)));
  Vec dq(size_t(n * Q)), sc2(size_t(isp.saved_qkv_size(n)));
  isp.forward(o.data(), s2.data(), l2.data(), q.data(), lb);
  isp.backward(dq.data(), sc2.data(), dy.data(), s2.data(), o.data(), l2.data(), lb);
  const std::string tag = name_of(layout) + " ulysses attention kv=" + std::to_string(kv_heads) +
                          (group_tokens > 0 ? " groups " + std::to_string(group_tokens) : "");
  report(tag + " out", world_max(rel_err(o.data(), out.data() + t * n * A, n * A)), 1e-5);
  report(tag + " dqkv", world_max(rel_err(dq.data(), dqkv.data() + t * n * Q, n * Q)), 1e-5);
}

/// Hidden-split embedding against the dense embedding.
inline void check_embedding(const Layout& layout) {
  const int R = world()->size(), r = world()->rank();
  IspCase setup(layout, 6);
  auto& [grid, full, params, local, grads, plan] = setup;
  const int64_t V = full.config().vocab_size, H = full.config().hidden_size, n = 7;
  auto store = std::make_shared<parallel::IspWeightStore>(grid.weight, false);
  parallel::IspEmbedding emb(store, full.tok_embeddings, V, H);
  std::mt19937 gen(9);
  std::vector<int32_t> ids(size_t(R * n));
  for (auto& id : ids) id = int32_t(gen() % V);
  const Vec dX = random_vec(R * n * H, 8);
  Vec X(size_t(R * n * H)), dT(size_t(V * H), 0.f);
  ops::embedding_forward<float>(X.data(), ids.data(), params.ptr(full.tok_embeddings), R * n, H);
  ops::embedding_backward<float>(dT.data(), dX.data(), ids.data(), R * n, H);
  Vec x(size_t(n * H));
  const Vec dx = rows_of(dX, n, H, r);
  emb.forward(x.data(), ids.data() + r * n, n, local);
  emb.backward(dx.data(), ids.data() + r * n, n, &grads);
  const parallel::IspShard& s = plan[size_t(full.tok_embeddings)];
  float* g = grads.ptr(full.tok_embeddings);
  data_sum(g, V * s.count, grid);
  Vec want(size_t(V * s.count));
  for (int64_t v = 0; v < V; ++v)
    for (int64_t c = 0; c < s.count; ++c) want[size_t(v * s.count + c)] = dT[size_t(v * H + s.start + c)];
  const std::string tag = name_of(layout) + " embedding";
  report(tag + " x", world_max(rel_err(x.data(), X.data() + r * n * H, n * H)), 1e-6);
  report(tag + " dtable shard", world_max(rel_err(g, want.data(), V * s.count)), 1e-5);
}

/// Weight-parallel head + local-token loss against the dense head on all tokens; world rank 1's
/// tokens have no valid label (its shard is all padding): it must return (0, 0), not NaN.
inline void check_head(const Layout& layout) {
  const int R = world()->size(), r = world()->rank();
  IspCase setup(layout, 7);
  auto& [grid, full, params, local, grads, plan] = setup;
  model::Params<float> dgrads(full);
  const int64_t V = full.config().vocab_size, H = full.config().hidden_size, n = 9;
  auto store = std::make_shared<parallel::IspWeightStore>(grid.weight, false);
  parallel::IspHeadLoss head(store, full.output, V, H);
  auto dense = model::make_dense_ops<float>(full);
  std::mt19937 gen(11);
  std::vector<int32_t> labels(size_t(R * n));
  for (int64_t i = 0; i < R * n; ++i)
    labels[size_t(i)] = (i / n == 1 || gen() % 5 == 0) ? -100 : int32_t(gen() % V);
  const Vec XF = random_vec(R * n * H, 12);
  Vec dXF(size_t(R * n * H)), dxf(size_t(n * H));
  const double scale = 1.0 / 17.0;
  const model::LossSum want = dense.head->forward_backward(dXF.data(), XF.data(), labels.data(),
                                                           R * n, params, &dgrads, scale, nullptr);
  const Vec xf = rows_of(XF, n, H, r);
  const model::LossSum got = head.forward_backward(dxf.data(), xf.data(), labels.data() + r * n, n,
                                                   local, &grads, scale, nullptr);
  if (r == 1) {
    EXPECT_EQ(got.count, 0);
    EXPECT_EQ(got.sum, 0.0);  // no valid label: exactly 0, never NaN
  }
  double sum = got.sum;
  int64_t count = got.count;
  world()->all_reduce(&sum, 1);
  world()->all_reduce(&count, 1);
  EXPECT_EQ(count, want.count);
  const parallel::IspShard& s = plan[size_t(full.output)];
  data_sum(grads.ptr(full.output), s.count * H, grid);
  const std::string tag = name_of(layout) + " head";
  report(tag + " loss sum", std::abs(sum - want.sum) / std::abs(want.sum), 1e-6);
  report(tag + " dxf", world_max(rel_err(dxf.data(), dXF.data() + r * n * H, n * H)), 1e-5);
  report(tag + " dW shard", world_max(rel_err(grads.ptr(full.output),
                                              dgrads.ptr(full.output) + s.start * H, s.count * H)),
         1e-5);
}

/// max|a − b| over a[n] and b[n] (0: bitwise equal, for finite values).
inline double max_abs_diff(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

/// Mixed precision: under kBFloat16 the linears and the head gather bf16. The all-gathers of a
/// pass move exactly half the bytes of the float32 pass, the gradient reduce-scatters the same
/// (fp32), and y, dx, the head's loss and dxf are bitwise those of the path that gathers fp32
/// and rounds inside the GEMM (the dense ops on the full fp32 weight and this rank's rows), with
/// the shards taken from the context's bf16 weight copy (ops::ComputeContext) or rounded at the
/// gather.
inline void check_bf16_gathers(const Layout& layout, bool step_copy, bool overlap) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const int r = world()->rank();
  IspCase setup(layout, 13);
  auto& [grid, full, params, local, grads, plan] = setup;
  const model::BlockParamIds& b = full.layers[0];
  const int64_t H = full.config().hidden_size, V = full.config().vocab_size, n = 6;
  const int64_t Q = full.view(b.wqkv).shape[0], F = full.view(b.w1).shape[0];  // F = 85: uneven
  const Vec x = random_vec(n * H, 20 + r), dq = random_vec(n * Q, 30 + r), df = random_vec(n * F, 40 + r);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[size_t(i)] = int32_t((7 * i + 3 * r) % V);
  struct Out {
    Vec q, f, dxq, dxf, dhead;
    double loss = 0;
    comm::CommStats stats;
    int64_t used = 0;
  };
  auto run = [&](bool bf16) {
    Out o;
    o.q.resize(size_t(n * Q));
    o.f.resize(size_t(n * F));
    for (Vec* v : {&o.dxq, &o.dxf, &o.dhead}) v->resize(size_t(n * H));
    ops::ComputeContext cc(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32);
    if (step_copy) cc.weights().attach(local.data(), local.numel());
    auto store = std::make_shared<parallel::IspWeightStore>(grid.weight, overlap, cc);
    parallel::IspLinear wqkv(store, b.wqkv, -1, Q, H), w1(store, b.w1, -1, F, H);
    parallel::IspHeadLoss head(store, full.output, V, H);
    grid.weight->reset_stats();
    for (int rep = 0; rep < 2; ++rep) {  // twice: the second pass may use prefetched weights
      grads.zero();
      store->begin_pass();
      wqkv.forward(o.q.data(), x.data(), n, local);
      w1.forward(o.f.data(), x.data(), n, local);
      o.loss = head.forward_backward(o.dhead.data(), x.data(), labels.data(), n, local, &grads,
                                     0.25, nullptr).sum;
      w1.backward(o.dxf.data(), df.data(), x.data(), n, local, &grads, false);
      wqkv.backward(o.dxq.data(), dq.data(), x.data(), n, local, &grads, false);
    }
    if (bf16 && step_copy) {
      EXPECT_GT(cc.weight_copy_bytes(), 0) << "the shards came from the context's copy";
    }
    o.stats = grid.weight->stats();
    o.used = store->prefetches_used();
    return o;
  };
  const Out f32 = run(false), bf = run(true);
  const int AG = int(comm::Kind::kAllGather), RS = int(comm::Kind::kReduceScatter);
  const std::string tag = name_of(layout) + (step_copy ? " step copy" : " rounded at gather") +
                          (overlap ? " overlap" : "");
  if (grid.weight->size() > 1) {
    EXPECT_GT(f32.stats.bytes[AG], 0u) << tag;
    EXPECT_EQ(2 * bf.stats.bytes[AG], f32.stats.bytes[AG]) << tag;
  }
  EXPECT_EQ(bf.stats.bytes[RS], f32.stats.bytes[RS]) << tag << ": gradients stay fp32";
  EXPECT_EQ(bf.stats.calls[AG], f32.stats.calls[AG]) << tag;
  if (overlap) {
    EXPECT_GT(bf.used, 0) << tag << ": prefetches of bf16 weights were used";
  }

  // The reference: fp32 weights rounded inside the GEMM, on this rank's rows.
  const ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  Vec q(size_t(n * Q)), f(size_t(n * F)), dxq(size_t(n * H)), dxf(size_t(n * H)), dhead(size_t(n * H));
  ops::linear_forward<float>(bf16, q.data(), x.data(), params.ptr(b.wqkv), nullptr, n, H, Q);
  ops::linear_forward<float>(bf16, f.data(), x.data(), params.ptr(b.w1), nullptr, n, H, F);
  ops::gemm<float>(bf16, false, false, n, H, Q, 1.f, dq.data(), params.ptr(b.wqkv), 0.f,
                   dxq.data());
  ops::gemm<float>(bf16, false, false, n, H, F, 1.f, df.data(), params.ptr(b.w1), 0.f, dxf.data());
  model::HeadChunks<float> chunks;
  const double loss =
      model::chunked_head_loss(bf16, chunks, dhead.data(), static_cast<float*>(nullptr), x.data(),
                               params.ptr(full.output), labels.data(), n, V, H,
                               model::head_chunk_rows(V, n), 0.25, nullptr).sum;
  double worst = std::abs(loss - bf.loss);
  worst = std::max(worst, max_abs_diff(bf.q.data(), q.data(), n * Q));
  worst = std::max(worst, max_abs_diff(bf.f.data(), f.data(), n * F));
  worst = std::max(worst, max_abs_diff(bf.dxq.data(), dxq.data(), n * H));
  worst = std::max(worst, max_abs_diff(bf.dxf.data(), dxf.data(), n * H));
  worst = std::max(worst, max_abs_diff(bf.dhead.data(), dhead.data(), n * H));
  worst = world_max(worst);
  if (r == 0)
    std::printf("[isp-op] %-46s bf16 gather bytes %llu vs fp32 %llu, max diff to rounding after "
                "the gather %.1e\n",
                (tag + " bf16").c_str(), (unsigned long long)bf.stats.bytes[AG],
                (unsigned long long)f32.stats.bytes[AG], worst);
  EXPECT_EQ(worst, 0.0) << tag << ": not bitwise the values of rounding after the gather";
  // bf16 really ran: the float32 pass differs.
  EXPECT_GT(world_max(max_abs_diff(f32.q.data(), q.data(), n * Q)), 0.0) << tag;
}

/// ulysses_scatter_heads / ulysses_gather_heads against a direct computation of the full tensor.
inline void check_all_to_all() {
  comm::Communicator& c = *world();
  const int T = c.size(), t = c.rank();
  const int64_t n = 3, heads = 2 * T, d = 4;
  auto value = [&](int64_t token, int64_t h, int64_t e) {
    return float(token * 1000 + h * 10 + e);  // exactly representable
  };
  Vec in(size_t(n * heads * d)), out(size_t(T * n * (heads / T) * d)), back(in.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t e = 0; e < d; ++e) in[size_t((i * heads + h) * d + e)] = value(t * n + i, h, e);
  parallel::ulysses_scatter_heads(out.data(), in.data(), n, heads, d, c);
  int64_t wrong = 0;
  const int64_t hl = heads / T;
  for (int64_t token = 0; token < T * n; ++token)
    for (int64_t h = 0; h < hl; ++h)
      for (int64_t e = 0; e < d; ++e)
        wrong += out[size_t((token * hl + h) * d + e)] != value(token, t * hl + h, e);
  parallel::ulysses_gather_heads(back.data(), out.data(), n, heads, d, c);
  wrong += back != in;
  EXPECT_EQ(wrong, 0) << "all-to-all pair on " << T << " ranks";
  if (t == 0) std::printf("[isp-op] all-to-all pair on %d ranks: %lld mismatches\n", T, (long long)wrong);
}

}  // namespace longtron::testing
