// InternLM2 forward and backward over the ops of model/layers.h (docs/model.md; structure after llm.c).
#include "model/internlm2.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/compute_context.h"
#include "ops/threads.h"

namespace longtron::model {
namespace {

template <typename T>
void add_into(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void accumulate(T* out, const T* a, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) out[i] += a[i];
}

void check_batch(const data::MicroBatch& b, int64_t sp) {
  const size_t N = b.input_ids.size();
  check(N > 0, "micro-batch has no tokens");
  check(b.labels.size() == N && b.indexes.size() == N,
        "micro-batch arrays disagree: input_ids {}, labels {}, indexes {} tokens", N,
        b.labels.size(), b.indexes.size());
  check(b.cu_seqlens.size() >= 2, "cu_seqlens needs at least 2 entries (0 and the {} tokens of the "
        "micro-batch), got {}", static_cast<int64_t>(N) * sp, b.cu_seqlens.size());
  // Only now may the message read front() and back(): its arguments are evaluated either way.
  check(b.cu_seqlens.front() == 0 &&
            static_cast<int64_t>(b.cu_seqlens.back()) == static_cast<int64_t>(N) * sp,
        "cu_seqlens must run from 0 to the {} tokens of the micro-batch (got {} … {})",
        static_cast<int64_t>(N) * sp, b.cu_seqlens.front(), b.cu_seqlens.back());
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i)
    check(b.cu_seqlens[i] >= b.cu_seqlens[i - 1], "cu_seqlens decreases at entry {} ({} < {})",
          i, b.cu_seqlens[i], b.cu_seqlens[i - 1]);
  for (size_t n = 0; n < N; ++n)
    check(b.indexes[n] >= 0, "indexes[{}] = {} is negative", n, b.indexes[n]);
}

}  // namespace

template <typename T>
InternLM2<T>::InternLM2(const ParamTable& layout, const Params<T>& params)
    : InternLM2(layout, params, make_dense_ops<T>(layout)) {}

template <typename T>
InternLM2<T>::InternLM2(const ParamTable& layout, const Params<T>& params, ModelOps<T> ops)
    : layout_(layout), params_(params), ops_(std::move(ops)),
      checkpoint_(layout.config().checkpoint) {
  check(static_cast<int64_t>(ops_.blocks.size()) == layout.config().num_layers,
        "model ops have {} blocks, model.num_layers is {}", ops_.blocks.size(),
        layout.config().num_layers);
  const BlockOps<T>& b = ops_.blocks.front();
  H_ = b.wqkv->in();
  Q_ = b.wqkv->out();
  F_ = b.gate_up->out();
  A_ = b.attention->out_features();
}

template <typename T>
void InternLM2<T>::set_checkpoint(bool on) {
  checkpoint_ = on;
}

template <typename T>
bool InternLM2<T>::bf16_mode() const {
  return std::is_same_v<T, float> && ops_.compute->bf16();
}

template <typename T>
WorkspaceShape InternLM2<T>::workspace_shape(int64_t N, bool want_all, bool bf16) const {
  const AttentionOp<T>& att = *ops_.blocks.front().attention;
  // R: rows of the residual stream (N, or this rank's share under sequence parallel).
  const int64_t R = (N + ops_.residual_split - 1) / ops_.residual_split;
  return WorkspaceShape{double(ops_.blocks.size()), double(N), double(R), double(H_), double(Q_),
                        double(F_), double(A_), double(att.saved_qkv_size(N)),
                        double(att.saved_lse_size(N)), want_all, bf16};
}

template <typename T>
void InternLM2<T>::reserve(int64_t N, bool want_all, bool bf16) {
  if (N <= capacity_ && want_all == saved_all_ && bf16 == bf16_) return;
  ck_ = Chunked{};  // the chunked path's buffers (model.checkpoint switched off, generation)
  // Grow geometrically so generation (one token longer per call) reallocates O(log n) times.
  if (N > capacity_ && capacity_ > 0) N = std::max(N, capacity_ + capacity_ / 2);
  N = std::max(N, capacity_);
  const WorkspaceShape shape = workspace_shape(N, want_all, bf16);
  arena_ = {}, arena16_ = {};
  arena_.assign(static_cast<size_t>(workspace_elements(shape)), T(0));
  arena16_.assign(static_cast<size_t>(workspace_bf16_elements(shape)), 0);
  const size_t L = ops_.blocks.size();
  acts_.assign(want_all ? L : 1, BlockActs{});
  xs_.assign(bf16 ? (want_all ? 0 : L) : L + 1, nullptr);
  xs16_.assign(bf16 && want_all ? L : 0, nullptr);
  T* p = arena_.data();
  uint16_t* p16 = arena16_.data();
  for (const WorkspaceBuffer& b : workspace_table(shape)) {
    bind(b, p, p16, N);
    if (b.bf16) p16 += static_cast<int64_t>(b.elements);
    else p += static_cast<int64_t>(b.elements);
  }
  capacity_ = N;
  saved_all_ = want_all;
  bf16_ = bf16;
}

template <typename T>
void InternLM2<T>::bind(const WorkspaceBuffer& b, T* at, uint16_t* at16, int64_t N) {
  using S = WorkspaceSlot;
  BlockActs& a = acts_[b.slot >= S::kQkvSaved && b.slot <= S::kB16 ? size_t(b.index) : 0];
  switch (b.slot) {
    case S::kInput: xs_[size_t(b.index)] = at; break;
    case S::kInput16: xs16_[size_t(b.index)] = at16; break;
    case S::kQkvSaved: a.qkv_s = at; break;
    case S::kAttn: a.attn = at; break;
    case S::kA: a.a = at; break;
    case S::kB: a.b = at; break;
    case S::kLse: a.lse = at; break;
    case S::kH: a.h = at; break;
    case S::kRstd1: a.rstd1 = at; break;
    case S::kRstd2: a.rstd2 = at; break;
    case S::kH16: a.h16 = at16; break;
    case S::kQkv16: a.qkv16 = at16; break;
    case S::kAttn16: a.attn16 = at16; break;
    case S::kA16: a.a16 = at16; break;
    case S::kB16: a.b16 = at16; break;
    case S::kXn: xn_ = at; break;
    case S::kQkv: qkv_ = at; break;
    case S::kTmp: tmp_ = at; break;
    case S::kG: g_ = at; break;
    case S::kXf: xf_ = at; break;
    case S::kRstdF: rstdf_ = at; break;
    case S::kRstdScratch: rstd_scratch_ = at; break;
    case S::kDres: dres_ = at; break;
    case S::kDtmp: dtmp_ = at; break;
    case S::kDxn: dxn_ = at; break;
    case S::kDg: dg_ = at; break;
    case S::kDa: da_ = at; break;
    case S::kDb: db_ = at; break;
    case S::kDattn: dattn_ = at; break;
    case S::kDqkvSaved: dqkv_s_ = at; break;
    case S::kPool: bind_pool(at, N); break;
    default: check(false, "internal: {} is not a buffer of the unchunked workspace", b.name);
  }
}

template <typename T>
void InternLM2<T>::bind_pool(T* base, int64_t N) {
  const int64_t R = (N + ops_.residual_split - 1) / ops_.residual_split;
  const int64_t sq = ops_.blocks.front().attention->saved_qkv_size(N);
  const PoolSizes<int64_t> z = pool_sizes<int64_t>(R, N, H_, Q_, F_, A_, sq);
  Bf16Pool& q = pool_;
  q.dres = base;
  T* const after = base + z.rh;  // every phase's area after dres
  q.xn = after, q.res = after + z.rh;
  T* const zf = after + 2 * z.rh;
  q.wide = zf, q.qkv = zf, q.qs = zf + z.nq, q.att = zf + z.nq + z.sq;
  q.ga = zf, q.gb = zf + z.nf;
  q.xf = q.xn, q.dxf = zf;
  q.g = after, q.dg = after + z.nf, q.hw = after;
  q.s1 = after + z.u(), q.s2 = after + z.u() + z.rh;
  q.dqkv = after;
  T* const za = after + z.nq;
  q.datt = za, q.attn_w = za + z.na, q.qkv_w = za + 2 * z.na, q.dqs = za + 2 * z.na + z.sq;
  q.xw = za, q.xn2 = za + z.rh, q.dxn2 = za + 2 * z.rh;
}

template <typename T>
void InternLM2<T>::chunk_reserve(int64_t N, bool train) {
  const bool bf16 = bf16_mode();
  // A forward-only call reuses a training layout (its block input slot 0); N is a capacity.
  if (ck_.N >= N && (ck_.train || !train) && ck_.bf16 == bf16 && ck_.N > 0) return;
  // The old layout's workspace (another path's, or a shorter row's) goes first.
  arena_ = {}, arena16_ = {}, capacity_ = 0;
  ck_ = Chunked{};
  const int64_t C = std::min(N, chunk_tokens(layout_.config()));
  ck_.N = N, ck_.C = C, ck_.train = train, ck_.bf16 = bf16;
  WorkspaceShape shape = workspace_shape(N, false, bf16);
  shape.chunk = double(C), shape.train = train;
  for (const WorkspaceBuffer& b : workspace_table(shape)) {
    const auto n = static_cast<size_t>(b.elements);
    switch (b.slot) {
      case WorkspaceSlot::kChunkInputs: ck_.x.resize(n); break;
      case WorkspaceSlot::kChunkInputs16: ck_.x16.resize(n); break;
      case WorkspaceSlot::kChunkQkv: ck_.qkv.resize(n); break;
      case WorkspaceSlot::kChunkOut: ck_.out.resize(n); break;
      case WorkspaceSlot::kChunkOut16: ck_.out16.resize(n); break;
      case WorkspaceSlot::kChunkLse: ck_.lse.resize(n); break;
      case WorkspaceSlot::kChunkDout: ck_.dout.resize(n); break;
      case WorkspaceSlot::kChunkDres: ck_.dres.resize(n); break;
      case WorkspaceSlot::kChunkTemps: ck_.c.resize(n); break;
      case WorkspaceSlot::kChunkTemps16: ck_.c16.resize(n); break;
      default: check(false, "internal: {} is not a buffer of the chunked workspace", b.name);
    }
  }
  // The chunk temporaries' views (workspace_table: xw, xn, h, hw, t, rstd, g1…g4, ow).
  const int64_t ch = C * H_, cf = C * F_;
  T* p = ck_.c.data();
  ck_.xw = p, ck_.xn = p + ch, ck_.h = p + 2 * ch, ck_.hw = p + 3 * ch, ck_.t = p + 4 * ch;
  ck_.rstd = p + 5 * ch;
  T* const f = p + 5 * ch + C;
  ck_.g1 = f, ck_.g2 = f + cf, ck_.g3 = f + 2 * cf, ck_.g4 = f + 3 * cf;
  ck_.ow = bf16 ? f + 4 * cf : nullptr;
  ck_.a16 = bf16 ? ck_.c16.data() : nullptr, ck_.b16 = bf16 ? ck_.c16.data() + cf : nullptr;
}

template <typename T>
std::vector<std::pair<WorkspaceSlot, int64_t>> InternLM2<T>::chunk_buffers() const {
  using S = WorkspaceSlot;
  std::vector<std::pair<WorkspaceSlot, int64_t>> r;
  const auto add = [&](S slot, const auto& v) {
    if (!v.empty()) r.emplace_back(slot, int64_t(v.size() * sizeof(v.front())));
  };
  add(S::kChunkInputs, ck_.x), add(S::kChunkInputs16, ck_.x16), add(S::kChunkQkv, ck_.qkv);
  add(S::kChunkOut, ck_.out), add(S::kChunkOut16, ck_.out16), add(S::kChunkLse, ck_.lse);
  add(S::kChunkDout, ck_.dout), add(S::kChunkDres, ck_.dres), add(S::kChunkTemps, ck_.c);
  add(S::kChunkTemps16, ck_.c16);
  return r;
}

template <typename T>
void InternLM2<T>::chunk_load(int64_t slot, int64_t n0, int64_t n, T* dst) const {
  const int64_t off = (slot * ck_.N + n0) * H_;
  if constexpr (std::is_same_v<T, float>) {
    if (ck_.bf16) return ops::widen_bf16(ck_.x16.data() + off, n * H_, dst);
  }
  std::copy(ck_.x.data() + off, ck_.x.data() + off + n * H_, dst);
}

template <typename T>
void InternLM2<T>::chunk_store(int64_t slot, int64_t n0, int64_t n, T* src) {
  const int64_t off = (slot * ck_.N + n0) * H_;
  if constexpr (std::is_same_v<T, float>) {
    if (ck_.bf16) {
      // The forward reads the block input as stored: the residual stream is rounded here.
      ops::round_to_bf16(src, n * H_, ck_.x16.data() + off);
      return ops::widen_bf16(ck_.x16.data() + off, n * H_, src);
    }
  }
  std::copy(src, src + n * H_, ck_.x.data() + off);
}

template <typename T>
void InternLM2<T>::chunk_attention(int layer, int64_t slot, const AttentionBatch& ab) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  const int64_t N = ab.num_tokens, C = ck_.C;
  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t n = std::min(C, N - n0);
    at_chunk(n0);
    chunk_load(slot, n0, n, ck_.xw);
    o.attention_norm->forward(ck_.xn, ck_.rstd, ck_.xw, n, params_);
    o.wqkv->forward(ck_.qkv.data() + n0 * Q_, ck_.xn, n, params_);
  }
  // Under bf16, wo's GEMM and the attention backward's D read the output rounded to bf16 (as
  // saved by the unchunked bf16 path), so it is kept so.
  if (ck_.bf16)
    o.attention->forward_bf16_out(ck_.out16.data(), ck_.qkv.data(), ck_.lse.data(),
                                  ck_.qkv.data(), ab);
  else
    o.attention->forward(ck_.out.data(), ck_.qkv.data(), ck_.lse.data(), ck_.qkv.data(), ab);
}

template <typename T>
void InternLM2<T>::chunk_tail(int layer, int64_t slot, int64_t n0, int64_t n, bool output) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  at_chunk(n0);  // also for the FFN and wo backward that follow in the backward pass
  chunk_load(slot, n0, n, ck_.xw);
  if constexpr (std::is_same_v<T, float>) {
    if (ck_.bf16) ops::widen_bf16(ck_.out16.data() + n0 * A_, n * A_, ck_.ow);
  }
  o.wo->forward(ck_.t, chunk_out(n0), n, params_);
  add_into(ck_.h, ck_.xw, ck_.t, n * H_);  // h = x + wo(attn)
  const int64_t nf = n * F_;
  if constexpr (std::is_same_v<T, float>) {
    if (ck_.bf16) {
      // The FFN's norm reads h rounded to bf16; a and b are kept rounded (the bf16 path's saves).
      ops::round_to_bf16(ck_.h, n * H_, ck_.a16);
      ops::widen_bf16(ck_.a16, n * H_, ck_.hw);
      o.ffn_norm->forward(ck_.xn, ck_.rstd, ck_.hw, n, params_);
      o.gate_up->forward(ck_.g1, ck_.g2, ck_.xn, n, params_);
      ops::round_to_bf16(ck_.g1, nf, ck_.a16);
      ops::round_to_bf16(ck_.g2, nf, ck_.b16);
      if (!output) return;
      ops::swiglu_forward_bf16(ck_.g3, ck_.a16, ck_.b16, nf);
      o.w2->forward(ck_.t, ck_.g3, n, params_);
      accumulate(ck_.h, ck_.t, n * H_);  // y = h + w2(g)
      return;
    }
  }
  std::copy(ck_.h, ck_.h + n * H_, ck_.hw);
  o.ffn_norm->forward(ck_.xn, ck_.rstd, ck_.hw, n, params_);
  o.gate_up->forward(ck_.g1, ck_.g2, ck_.xn, n, params_);
  if (!output) return;
  ops::swiglu_forward(ck_.g3, ck_.g1, ck_.g2, nf);
  o.w2->forward(ck_.t, ck_.g3, n, params_);
  accumulate(ck_.h, ck_.t, n * H_);
}

template <typename T>
LossSum InternLM2<T>::chunked_pass(const data::MicroBatch& batch, Params<T>* grads,
                                   double loss_scale, double* token_losses) {
  const bool train = grads != nullptr;
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  const int L = static_cast<int>(ops_.blocks.size());
  chunk_reserve(N, train);
  const AttentionBatch ab = attention_batch(batch);
  const int64_t C = ck_.C;
  const auto slot = [&](int layer) -> int64_t { return train ? layer : 0; };
  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t n = std::min(C, N - n0);
    ops_.embedding->forward(ck_.xw, batch.input_ids.data() + n0, n, params_);
    chunk_store(0, n0, n, ck_.xw);
  }
  LossSum loss;
  for (int i = 0; i < L; ++i) {
    chunk_attention(i, slot(i), ab);
    for (int64_t n0 = 0; n0 < N; n0 += C) {
      const int64_t n = std::min(C, N - n0);
      chunk_tail(i, slot(i), n0, n, true);
      if (i + 1 < L) {
        chunk_store(slot(i + 1), n0, n, ck_.h);
        continue;
      }
      // The final norm, head and cross-entropy of the chunk; in training dL/dy into dres.
      ops_.norm->forward(ck_.xn, ck_.rstd, ck_.h, n, params_);
      T* const dxf = train ? ck_.t : nullptr;
      const LossSum part = ops_.head->forward_backward(
          dxf, ck_.xn, batch.labels.data() + n0, n, params_, grads, loss_scale,
          token_losses ? token_losses + n0 : nullptr);
      loss.sum += part.sum, loss.count += part.count;
      if (train)
        ops_.norm->backward(ck_.dres.data() + n0 * H_, dxf, ck_.h, ck_.rstd, n, params_, grads);
    }
  }
  at_chunk(0);
  if (!train) return loss;
  backward_point(L, true);
  T* const dres = ck_.dres.data();
  T* const dout = ck_.dout.data();
  T* const qkv = ck_.qkv.data();
  for (int i = L - 1; i >= 0; --i) {
    BlockOps<T>& o = ops_.blocks[static_cast<size_t>(i)];
    if (i != L - 1) chunk_attention(i, i, ab);  // the last block's attention is still here
    for (int64_t n0 = 0; n0 < N; n0 += C) {
      const int64_t n = std::min(C, N - n0), nf = n * F_;
      T* const dr = dres + n0 * H_;
      chunk_tail(i, i, n0, n, false);
      // FFN: y = h + w2(silu(a) ⊙ b); da, db end in (g3, g4) or, bf16, in (g1, g2).
      T *da = ck_.g3, *db = ck_.g4;
      if constexpr (std::is_same_v<T, float>) {
        if (ck_.bf16) {
          ops::swiglu_forward_bf16(ck_.g1, ck_.a16, ck_.b16, nf);
          o.w2->backward(ck_.g2, dr, ck_.g1, n, params_, grads, false);
          ops::swiglu_backward_bf16(ck_.g1, ck_.g2, ck_.g2, ck_.a16, ck_.b16, nf);
          da = ck_.g1, db = ck_.g2;
        }
      }
      if (!ck_.bf16) {
        ops::swiglu_forward(ck_.g3, ck_.g1, ck_.g2, nf);
        o.w2->backward(ck_.g4, dr, ck_.g3, n, params_, grads, false);
        ops::swiglu_backward(ck_.g3, ck_.g4, ck_.g4, ck_.g1, ck_.g2, nf);
      }
      o.gate_up->backward(ck_.t, da, db, ck_.xn, n, params_, grads);
      o.ffn_norm->backward(ck_.xn, ck_.t, ck_.hw, ck_.rstd, n, params_, grads);
      accumulate(dr, ck_.xn, n * H_);  // dres = dL/dh
      o.wo->backward(dout + n0 * A_, dr, chunk_out(n0), n, params_, grads, false);
    }
    backward_point(i, false);
    // In place: qkv becomes dqkv (ModelOps::token_chunks).
    if (ck_.bf16)
      o.attention->backward_bf16_out(qkv, qkv, dout, qkv, ck_.out16.data(), ck_.lse.data(), ab);
    else
      o.attention->backward(qkv, qkv, dout, qkv, ck_.out.data(), ck_.lse.data(), ab);
    for (int64_t n0 = 0; n0 < N; n0 += C) {
      const int64_t n = std::min(C, N - n0);
      T* const dr = dres + n0 * H_;
      at_chunk(n0);
      chunk_load(i, n0, n, ck_.xw);
      o.attention_norm->forward(ck_.xn, ck_.rstd, ck_.xw, n, params_);
      o.wqkv->backward(ck_.t, qkv + n0 * Q_, ck_.xn, n, params_, grads, false);
      o.attention_norm->backward(ck_.xn, ck_.t, ck_.xw, ck_.rstd, n, params_, grads);
      accumulate(dr, ck_.xn, n * H_);  // dres = dL/dx
    }
    backward_point(i, true);
  }
  at_chunk(0);
  ops_.embedding->backward(dres, batch.input_ids.data(), N, grads);
  backward_point(-1, true);
  return loss;
}

template <typename T>
AttentionBatch InternLM2<T>::attention_batch(const data::MicroBatch& b) const {
  return AttentionBatch{b.indexes.data(), b.cu_seqlens.data(),
                        static_cast<int64_t>(b.cu_seqlens.size()) - 1,
                        static_cast<int64_t>(b.input_ids.size())};
}

template <typename T>
typename InternLM2<T>::BlockActs& InternLM2<T>::acts(int layer, bool save) {
  return (save && saved_all_) ? acts_[static_cast<size_t>(layer)] : acts_.front();
}

template <typename T>
void InternLM2<T>::block_forward(int layer, BlockActs& A, T* y, const T* x,
                                 const AttentionBatch& ab) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  const int64_t N = ab.num_tokens;
  o.attention_norm->forward(xn_, A.rstd1, x, N, params_);
  o.wqkv->forward(qkv_, xn_, N, params_);
  o.attention->forward(A.attn, A.qkv_s, A.lse, qkv_, ab);
  o.wo->forward(tmp_, A.attn, N, params_);
  const int64_t R = N / ops_.residual_split;  // residual-stream rows
  add_into(A.h, x, tmp_, R * H_);
  o.ffn_norm->forward(xn_, A.rstd2, A.h, N, params_);
  o.gate_up->forward(A.a, A.b, xn_, N, params_);
  ops::swiglu_forward(g_, A.a, A.b, N * F_);
  o.w2->forward(tmp_, g_, N, params_);
  add_into(y, A.h, tmp_, R * H_);
}

template <typename T>
void InternLM2<T>::block_backward(int layer, BlockActs& A, const T* x, const AttentionBatch& ab,
                                  Params<T>& grads) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  const int64_t N = ab.num_tokens;
  // FFN branch: y = h + w2(silu(a) ⊙ b), a = w1 z, b = w3 z, z = RMSNorm(h). g and z are cheap
  // elementwise recomputations rather than saved tensors.
  ops::swiglu_forward(g_, A.a, A.b, N * F_);
  o.w2->backward(dg_, dres_, g_, N, params_, &grads, false);
  ops::swiglu_backward(da_, db_, dg_, A.a, A.b, N * F_);
  o.ffn_norm->forward(xn_, rstd_scratch_, A.h, N, params_);
  o.gate_up->backward(dxn_, da_, db_, xn_, N, params_, &grads);
  o.ffn_norm->backward(dtmp_, dxn_, A.h, A.rstd2, N, params_, &grads);
  const int64_t R = N / ops_.residual_split;  // residual-stream rows
  accumulate(dres_, dtmp_, R * H_);  // dres = dL/dh
  backward_point(layer, false);
  // Attention branch: h = x + wo(Attn(qkv)), qkv = wqkv(RMSNorm(x)).
  o.wo->backward(dattn_, dres_, A.attn, N, params_, &grads, false);
  o.attention->backward(qkv_, dqkv_s_, dattn_, A.qkv_s, A.attn, A.lse, ab);
  o.attention_norm->forward(xn_, rstd_scratch_, x, N, params_);
  o.wqkv->backward(dxn_, qkv_, xn_, N, params_, &grads, false);
  o.attention_norm->backward(dtmp_, dxn_, x, A.rstd1, N, params_, &grads);
  accumulate(dres_, dtmp_, R * H_);  // dres = dL/dx
}

template <typename T>
void InternLM2<T>::block_forward_bf16(int layer, BlockActs& A, const AttentionBatch& ab,
                                      uint16_t* x16) {
  if constexpr (std::is_same_v<T, float>) {
    BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
    const Bf16Pool& q = pool_;
    const int64_t N = ab.num_tokens;
    const int64_t R = N / ops_.residual_split;  // residual-stream rows
    // The residual sum runs in q.res (fp32, the float32 path's values). The norms read it as
    // saved, rounded to bf16 (x16, A.h16) and widened into q.wide, so that backward recomputes
    // exactly the forward's normalised inputs and rstd from the saved values (and a layout that
    // keeps its forward input for the weight gradient, Megatron's MSP, agrees with one that
    // recomputes it).
    // The residual stream itself continues from the rounded input, so that a block input kept
    // in bf16 (the chunked recomputation) is exactly what the forward read.
    ops::round_to_bf16(q.res, R * H_, x16);
    ops::widen_bf16(x16, R * H_, q.wide);
    std::copy(q.wide, q.wide + R * H_, q.res);
    o.attention_norm->forward(q.xn, rstd_scratch_, q.wide, N, params_);
    o.wqkv->forward(q.qkv, q.xn, N, params_);
    o.attention->forward(q.att, q.qs, A.lse, q.qkv, ab);
    ops::round_to_bf16(q.qs, o.attention->saved_qkv_size(N), A.qkv16);
    ops::round_to_bf16(q.att, N * A_, A.attn16);  // wo's GEMM rounds attn to the same values
    o.wo->forward(q.xn, q.att, N, params_);
    accumulate(q.res, q.xn, R * H_);  // h = x + wo(attn)
    ops::round_to_bf16(q.res, R * H_, A.h16);
    ops::widen_bf16(A.h16, R * H_, q.wide);
    o.ffn_norm->forward(q.xn, rstd_scratch_, q.wide, N, params_);
    o.gate_up->forward(q.ga, q.gb, q.xn, N, params_);
    ops::round_to_bf16(q.ga, N * F_, A.a16);
    ops::round_to_bf16(q.gb, N * F_, A.b16);
    ops::swiglu_forward_bf16(q.ga, A.a16, A.b16, N * F_);  // g from the bf16 a, b
    o.w2->forward(q.xn, q.ga, N, params_);
    accumulate(q.res, q.xn, R * H_);  // y = h + w2(g)
  } else {
    (void)layer, (void)A, (void)ab, (void)x16;
    check(false, "internal: bf16 workspace in a double model");
  }
}

template <typename T>
void InternLM2<T>::block_backward_bf16(int layer, BlockActs& A, const AttentionBatch& ab,
                                       Params<T>& grads) {
  if constexpr (std::is_same_v<T, float>) {
    BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
    const Bf16Pool& q = pool_;
    const int64_t N = ab.num_tokens;
    const int64_t R = N / ops_.residual_split;  // residual-stream rows
    // FFN branch, as block_backward: g from the bf16 a, b; da and db overwrite g and dg.
    ops::swiglu_forward_bf16(q.g, A.a16, A.b16, N * F_);
    o.w2->backward(q.dg, q.dres, q.g, N, params_, &grads, false);
    ops::swiglu_backward_bf16(q.g, q.dg, q.dg, A.a16, A.b16, N * F_);
    // z = RMSNorm(h) from the widened h, whose rstd serves the norm's backward too.
    ops::widen_bf16(A.h16, R * H_, q.s1);
    o.ffn_norm->forward(q.s2, rstd_scratch_, q.s1, N, params_);
    o.gate_up->backward(q.s1, q.g, q.dg, q.s2, N, params_, &grads);
    ops::widen_bf16(A.h16, R * H_, q.hw);  // h again, where da and db were
    o.ffn_norm->backward(q.s2, q.s1, q.hw, rstd_scratch_, N, params_, &grads);
    accumulate(q.dres, q.s2, R * H_);  // dres = dL/dh
    backward_point(layer, false);
    // Attention branch.
    ops::widen_bf16(A.attn16, N * A_, q.attn_w);
    ops::widen_bf16(A.qkv16, o.attention->saved_qkv_size(N), q.qkv_w);
    o.wo->backward(q.datt, q.dres, q.attn_w, N, params_, &grads, false);
    o.attention->backward(q.dqkv, q.dqs, q.datt, q.qkv_w, q.attn_w, A.lse, ab);
    // x as the forward's norm read it: saved in bf16, or (checkpoint) its fp32 copy rounded
    // again here, through xn2's slot.
    const uint16_t* x16 = xs16_.empty() ? nullptr : xs16_[static_cast<size_t>(layer)];
    if (x16 == nullptr) {
      uint16_t* const rounded = reinterpret_cast<uint16_t*>(q.xn2);
      ops::round_to_bf16(xs_[static_cast<size_t>(layer)], R * H_, rounded);
      x16 = rounded;
    }
    ops::widen_bf16(x16, R * H_, q.xw);
    o.attention_norm->forward(q.xn2, rstd_scratch_, q.xw, N, params_);
    o.wqkv->backward(q.dxn2, q.dqkv, q.xn2, N, params_, &grads, false);
    o.attention_norm->backward(q.xn2, q.dxn2, q.xw, rstd_scratch_, N, params_, &grads);
    accumulate(q.dres, q.xn2, R * H_);  // dres = dL/dx
  } else {
    (void)layer, (void)A, (void)ab, (void)grads;
    check(false, "internal: bf16 workspace in a double model");
  }
}

template <typename T>
void InternLM2<T>::forward_blocks(const data::MicroBatch& batch, bool save) {
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  // Training keeps every block's acts unless checkpointing; a forward-only call keeps whatever
  // layout exists, or the compact one.
  const bool bf16 = bf16_mode();
  if (save) reserve(N, !checkpoint_, bf16);
  else if (N > capacity_ || bf16 != bf16_) reserve(N, capacity_ > 0 && saved_all_, bf16);
  const AttentionBatch ab = attention_batch(batch);
  const int L = static_cast<int>(ops_.blocks.size());
  if (bf16_) {
    ops_.embedding->forward(pool_.res, batch.input_ids.data(), N, params_);
    const int64_t RH = N / ops_.residual_split * H_;
    for (int i = 0; i < L; ++i) {
      const size_t l = static_cast<size_t>(i);
      // Checkpoint: the fp32 input the backward's recomputation starts from (a forward-only
      // call never recomputes, so it keeps none).
      if (save && xs16_.empty()) std::copy(pool_.res, pool_.res + RH, xs_[l]);
      block_forward_bf16(i, acts(i, save), ab, block_input16(i));
    }
    return;
  }
  ops_.embedding->forward(xs_[0], batch.input_ids.data(), N, params_);
  for (int i = 0; i < L; ++i)
    block_forward(i, acts(i, save), xs_[static_cast<size_t>(i) + 1], xs_[static_cast<size_t>(i)],
                  ab);
}

template <typename T>
LossSum InternLM2<T>::forward_backward(const data::MicroBatch& batch, Params<T>& grads,
                                       double loss_scale) {
  check_batch(batch, ops_.sequence_parallel_size);
  check(&grads.layout() == &layout_ || grads.numel() == layout_.numel(),
        "gradient buffer has {} elements, the model {}", grads.numel(), layout_.numel());
  if (chunked()) return chunked_pass(batch, &grads, loss_scale, nullptr);
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  const int L = static_cast<int>(ops_.blocks.size());
  forward_blocks(batch, true);
  const AttentionBatch ab = attention_batch(batch);
  T* const xf = bf16_ ? pool_.xf : xf_;
  T* const dxf = bf16_ ? pool_.dxf : dxn_;
  T* const dres = bf16_ ? pool_.dres : dres_;
  ops_.norm->forward(xf, rstdf_, final_residual(), N, params_);
  const LossSum loss = ops_.head->forward_backward(dxf, xf, batch.labels.data(), N, params_,
                                                   &grads, loss_scale, nullptr);
  ops_.norm->backward(dres, dxf, final_residual(), rstdf_, N, params_, &grads);
  backward_point(L, true);
  const int64_t RH = N / ops_.residual_split * H_;
  for (int i = L - 1; i >= 0; --i) {
    if (bf16_) {
      // Recompute the block from its fp32 input; dres keeps the pool's first slot.
      if (checkpoint_ && i != L - 1) {
        const T* x = xs_[static_cast<size_t>(i)];
        std::copy(x, x + RH, pool_.res);
        block_forward_bf16(i, acts_.front(), ab, block_input16(i));
      }
      block_backward_bf16(i, acts(i, true), ab, grads);
      backward_point(i, true);
      continue;
    }
    const T* x = xs_[static_cast<size_t>(i)];
    // Recompute the block (y discarded); the shared acts still hold the last block's state.
    if (checkpoint_ && i != L - 1) block_forward(i, acts_.front(), dtmp_, x, ab);
    block_backward(i, acts(i, true), x, ab, grads);
    backward_point(i, true);
  }
  ops_.embedding->backward(dres, batch.input_ids.data(), N, &grads);
  backward_point(-1, true);
  return loss;
}

template <typename T>
LossSum InternLM2<T>::forward_loss(const data::MicroBatch& batch,
                                   std::vector<double>* token_losses) {
  check_batch(batch, ops_.sequence_parallel_size);
  if (chunked()) {
    if (token_losses)
      token_losses->assign(batch.input_ids.size(), 0.0);
    return chunked_pass(batch, nullptr, 0.0, token_losses ? token_losses->data() : nullptr);
  }
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  forward_blocks(batch, false);
  T* const xf = bf16_ ? pool_.xf : xf_;
  ops_.norm->forward(xf, rstdf_, final_residual(), N, params_);
  if (token_losses) token_losses->assign(static_cast<size_t>(N), 0.0);
  return ops_.head->forward_backward(nullptr, xf, batch.labels.data(), N, params_, nullptr, 0.0,
                                     token_losses ? token_losses->data() : nullptr);
}

template <typename T>
std::vector<T> InternLM2<T>::logits_last(std::span<const int32_t> ids) {
  check(!ids.empty(), "generation needs at least one prompt token");
  const int32_t n = static_cast<int32_t>(ids.size());
  data::MicroBatch b;
  b.input_ids.assign(ids.begin(), ids.end());
  b.labels.assign(ids.size(), data::kIgnoreIndex);
  b.indexes.resize(ids.size());
  for (int32_t i = 0; i < n; ++i) b.indexes[static_cast<size_t>(i)] = i;
  b.cu_seqlens = {0, n};
  b.max_seqlen = n;
  forward_blocks(b, false);
  T* const xf = bf16_ ? pool_.xf : xf_;
  ops_.norm->forward(xf, rstdf_, final_residual() + (n - 1) * H_, 1, params_);
  std::vector<T> logits(static_cast<size_t>(layout_.config().vocab_size));
  ops_.head->logits_row(logits.data(), xf, params_);
  return logits;
}

namespace {
// Matmul parameters: every linear of every layer and the head (model_flops' linear term / 6).
double matmul_parameters(const ModelConfig& c) {
  const double H = static_cast<double>(c.hidden_size);
  const double per_layer = static_cast<double>(c.qkv_size()) * H +
                           static_cast<double>(c.attention_size()) * H +
                           3.0 * static_cast<double>(c.ffn_size()) * H;
  return static_cast<double>(c.num_layers) * per_layer + static_cast<double>(c.vocab_size) * H;
}
}  // namespace

double model_flops(const ModelConfig& c, int64_t tokens, double sum_l2) {
  const double A = static_cast<double>(c.attention_size());  // Hq·d (= H unless head_dim is set)
  return 6.0 * matmul_parameters(c) * static_cast<double>(tokens) +
         6.0 * static_cast<double>(c.num_layers) * A * sum_l2;
}

data::RowCost balance_cost(const ModelConfig& c) {
  data::RowCost cost;
  cost.per_token = 6.0 * matmul_parameters(c);
  cost.per_pair = 12.0 * static_cast<double>(c.num_layers) * static_cast<double>(c.attention_size());
  if (c.sliding_window > 0 && c.num_layers > 0) {  // windowed layers: only visible pairs cost
    cost.window = c.sliding_window;
    const int64_t windowed = c.num_layers - std::min(c.first_window_layer, c.num_layers);
    cost.windowed = static_cast<double>(windowed) / static_cast<double>(c.num_layers);
  }
  return cost;
}

double sum_squared_segments(const ModelConfig& c, std::span<const int32_t> cu_seqlens) {
  if (c.sliding_window == 0) return sum_squared_segments(cu_seqlens);
  double s = 0.0;
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
    const int64_t l = cu_seqlens[i + 1] - cu_seqlens[i];
    if (l == 0) continue;
    double share = 0.0;  // visible pairs over causal pairs, summed over layers
    for (int64_t layer = 0; layer < c.num_layers; ++layer)
      share += double(ops::visible_pairs(l, c.window_of(layer))) / double(ops::visible_pairs(l));
    s += double(l) * double(l) * share / double(c.num_layers);
  }
  return s;
}

double sum_squared_segments(std::span<const int32_t> cu_seqlens) {
  double s = 0.0;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    const double l = static_cast<double>(cu_seqlens[i]) - static_cast<double>(cu_seqlens[i - 1]);
    s += l * l;
  }
  return s;
}

template class InternLM2<float>;
template class InternLM2<double>;

}  // namespace longtron::model
