// InternLM2 forward and backward over the ops of layers.h (docs/model.md; structure after llm.c).
#include "model/internlm2.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace longtron::model {
namespace {

template <typename T>
void add_into(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void accumulate(T* out, const T* a, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
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
InternLM2<T>::InternLM2(const ParamLayout& layout, const Params<T>& params)
    : InternLM2(layout, params, make_dense_ops<T>(layout)) {}

template <typename T>
InternLM2<T>::InternLM2(const ParamLayout& layout, const Params<T>& params, ModelOps<T> ops)
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
bool InternLM2<T>::bf16_mode() {
  return std::is_same_v<T, float> && ops::compute_type() == ops::ComputeType::kBFloat16;
}

template <typename T>
void InternLM2<T>::reserve(int64_t N, bool want_all, bool bf16) {
  if (N <= capacity_ && want_all == saved_all_ && bf16 == bf16_) return;
  // Grow geometrically so generation (one token longer per call) reallocates O(log n) times.
  if (N > capacity_ && capacity_ > 0) N = std::max(N, capacity_ + capacity_ / 2);
  N = std::max(N, capacity_);
  const int64_t L = static_cast<int64_t>(ops_.blocks.size());
  const AttentionOp<T>& att = *ops_.blocks.front().attention;
  const int64_t sq = att.saved_qkv_size(N), sl = att.saved_lse_size(N);
  // R: rows of the residual stream (N, or this rank's share under sequence parallel).
  const int64_t R = (N + ops_.residual_split - 1) / ops_.residual_split;
  const int64_t nacts = want_all ? L : 1;
  const auto pad = [](int64_t n) { return (n + 15) / 16 * 16; };
  const WorkspaceShape shape{double(L), double(N),  double(R),  double(H_), double(Q_), double(F_),
                             double(A_), double(sq), double(sl), want_all,  bf16};
  const auto total = static_cast<int64_t>(workspace_elements(shape));
  const auto total16 = static_cast<int64_t>(workspace_bf16_elements(shape));
  arena_.assign(0, T(0));
  arena_.shrink_to_fit();
  arena16_.assign(0, 0);
  arena16_.shrink_to_fit();
  arena_.assign(static_cast<size_t>(total), T(0));
  arena16_.assign(static_cast<size_t>(total16), 0);
  T* p = arena_.data();
  uint16_t* p16 = arena16_.data();
  const auto take = [&](int64_t n) { T* r = p; p += pad(n); return r; };
  const auto take16 = [&](int64_t n) { uint16_t* r = p16; p16 += (n + 31) / 32 * 32; return r; };
  xs_.assign(static_cast<size_t>(L + 1), nullptr);
  for (auto& x : xs_) x = take(R * H_);
  acts_.assign(static_cast<size_t>(nacts), BlockActs{});
  for (auto& a : acts_) {
    if (bf16) {
      a.qkv16 = take16(sq);
      a.attn16 = take16(N * A_);
      a.a16 = take16(N * F_);
      a.b16 = take16(N * F_);
    } else {
      a.qkv_s = take(sq);
      a.attn = take(N * A_);
      a.a = take(N * F_);
      a.b = take(N * F_);
    }
    a.lse = take(sl);
    a.h = take(R * H_);
    a.rstd1 = take(R);
    a.rstd2 = take(R);
  }
  xn_ = take(R * H_), qkv_ = take(N * Q_), tmp_ = take(R * H_), g_ = take(N * F_);
  xf_ = take(R * H_), rstdf_ = take(R), rstd_scratch_ = take(R);
  dres_ = take(R * H_), dtmp_ = take(R * H_), dxn_ = take(R * H_);
  dg_ = take(N * F_);
  // bf16 mode: the FFN's fp32 a, b (forward) and da, db (backward) live in g and dg, and the
  // widened attn and qkv_s of backward in g and dg too when they fit (they are free by then).
  da_ = bf16 ? nullptr : take(N * F_);
  db_ = bf16 ? nullptr : take(N * F_);
  dattn_ = take(N * A_), dqkv_s_ = take(sq);
  attn_wide_ = !bf16 ? nullptr : A_ <= F_ ? g_ : take(N * A_);
  qkv_wide_ = !bf16 ? nullptr : sq <= N * F_ ? dg_ : take(sq);
  check(p <= arena_.data() + arena_.size() && p16 <= arena16_.data() + arena16_.size(),
        "internal: model workspace overflow");
  capacity_ = N;
  saved_all_ = want_all;
  bf16_ = bf16;
}

double workspace_elements(const WorkspaceShape& s) {
  const double N = s.N, R = s.R, H = s.H, F = s.F, A = s.A, sq = s.saved_qkv;
  // Saved per block in float: lse, h, two rstd; and (not in bf16 mode) qkv_s, attn, a, b.
  const double per_acts =
      s.saved_lse + R * H + 2 * R + (s.bf16 ? 0 : sq + N * A + 2 * N * F);
  const double nacts = s.per_layer ? s.L : 1;
  // Each buffer is padded to 16 elements (64-byte boundaries for float).
  const auto pad = [](double n) { return std::ceil(n / 16) * 16; };
  // Backward temporaries of the FFN: dg, da, db (bf16 mode: dg only, plus the widened attn and
  // qkv_s where g and dg cannot hold them).
  double ffn = pad(N * F) * 3;
  if (s.bf16) ffn = pad(N * F) + (A > F ? pad(N * A) : 0) + (sq > N * F ? pad(sq) : 0);
  return (s.L + 1) * pad(R * H) + nacts * (per_acts + 8 * 16) + pad(R * H) * 3 + pad(N * s.Q) +
         pad(N * F) + pad(R) * 2 + pad(R * H) * 3 + ffn + pad(N * A) + pad(sq) + 16 * 16;
}

double workspace_bf16_elements(const WorkspaceShape& s) {
  if (!s.bf16) return 0;
  const double nacts = s.per_layer ? s.L : 1;
  // qkv_s, attn, a, b, each padded to 32 elements (64 bytes).
  return nacts * (s.saved_qkv + s.N * s.A + 2 * s.N * s.F + 4 * 32);
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
  // bf16 mode: attention writes fp32 into the backward temporaries, then qkv_s and attn are kept
  // as bf16 (wo's GEMM rounds attn to the same bf16 values).
  T* qkv_s = bf16_ ? dqkv_s_ : A.qkv_s;
  T* attn = bf16_ ? dattn_ : A.attn;
  o.attention->forward(attn, qkv_s, A.lse, qkv_, ab);
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {
      ops::round_to_bf16(qkv_s, o.attention->saved_qkv_size(N), A.qkv16);
      ops::round_to_bf16(attn, N * A_, A.attn16);
    }
  o.wo->forward(tmp_, attn, N, params_);
  const int64_t R = N / ops_.residual_split;  // residual-stream rows
  add_into(A.h, x, tmp_, R * H_);
  o.ffn_norm->forward(xn_, A.rstd2, A.h, N, params_);
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {  // a, b in fp32 in g and dg, kept as bf16; g from the bf16 a, b
      o.gate_up->forward(g_, dg_, xn_, N, params_);
      ops::round_to_bf16(g_, N * F_, A.a16);
      ops::round_to_bf16(dg_, N * F_, A.b16);
      ops::swiglu_forward_bf16(g_, A.a16, A.b16, N * F_);
    }
  if (!bf16_) {
    o.gate_up->forward(A.a, A.b, xn_, N, params_);
    ops::swiglu_forward(g_, A.a, A.b, N * F_);
  }
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
  T *da = da_, *db = db_;
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {  // da and db overwrite g and dg (read first, elementwise)
      ops::swiglu_forward_bf16(g_, A.a16, A.b16, N * F_);
      o.w2->backward(dg_, dres_, g_, N, params_, &grads, false);
      ops::swiglu_backward_bf16(g_, dg_, dg_, A.a16, A.b16, N * F_);
      da = g_, db = dg_;
    }
  if (!bf16_) {
    ops::swiglu_forward(g_, A.a, A.b, N * F_);
    o.w2->backward(dg_, dres_, g_, N, params_, &grads, false);
    ops::swiglu_backward(da_, db_, dg_, A.a, A.b, N * F_);
  }
  o.ffn_norm->forward(xn_, rstd_scratch_, A.h, N, params_);
  o.gate_up->backward(dxn_, da, db, xn_, N, params_, &grads);
  o.ffn_norm->backward(dtmp_, dxn_, A.h, A.rstd2, N, params_, &grads);
  const int64_t R = N / ops_.residual_split;  // residual-stream rows
  accumulate(dres_, dtmp_, R * H_);  // dres = dL/dh
  // Attention branch: h = x + wo(Attn(qkv)), qkv = wqkv(RMSNorm(x)).
  const T *attn = A.attn, *qkv_s = A.qkv_s;
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {  // widened into g and dg (free now) or their own buffers
      ops::widen_bf16(A.attn16, N * A_, attn_wide_);
      ops::widen_bf16(A.qkv16, o.attention->saved_qkv_size(N), qkv_wide_);
      attn = attn_wide_, qkv_s = qkv_wide_;
    }
  o.wo->backward(dattn_, dres_, attn, N, params_, &grads, false);
  o.attention->backward(qkv_, dqkv_s_, dattn_, qkv_s, attn, A.lse, ab);
  o.attention_norm->forward(xn_, rstd_scratch_, x, N, params_);
  o.wqkv->backward(dxn_, qkv_, xn_, N, params_, &grads, false);
  o.attention_norm->backward(dtmp_, dxn_, x, A.rstd1, N, params_, &grads);
  accumulate(dres_, dtmp_, R * H_);  // dres = dL/dx
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
  ops_.embedding->forward(xs_[0], batch.input_ids.data(), N, params_);
  for (int i = 0; i < static_cast<int>(ops_.blocks.size()); ++i)
    block_forward(i, acts(i, save), xs_[static_cast<size_t>(i) + 1], xs_[static_cast<size_t>(i)],
                  ab);
}

template <typename T>
LossSum InternLM2<T>::forward_backward(const data::MicroBatch& batch, Params<T>& grads,
                                       double loss_scale) {
  check_batch(batch, ops_.sequence_parallel_size);
  check(&grads.layout() == &layout_ || grads.numel() == layout_.numel(),
        "gradient buffer has {} elements, the model {}", grads.numel(), layout_.numel());
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  const int L = static_cast<int>(ops_.blocks.size());
  forward_blocks(batch, true);
  const AttentionBatch ab = attention_batch(batch);
  ops_.norm->forward(xf_, rstdf_, xs_.back(), N, params_);
  const LossSum loss = ops_.head->forward_backward(dxn_, xf_, batch.labels.data(), N, params_,
                                                   &grads, loss_scale, nullptr);
  ops_.norm->backward(dres_, dxn_, xs_.back(), rstdf_, N, params_, &grads);
  for (int i = L - 1; i >= 0; --i) {
    const T* x = xs_[static_cast<size_t>(i)];
    // Recompute the block (y discarded); the shared acts still hold the last block's state.
    if (checkpoint_ && i != L - 1) block_forward(i, acts_.front(), dtmp_, x, ab);
    block_backward(i, acts(i, true), x, ab, grads);
  }
  ops_.embedding->backward(dres_, batch.input_ids.data(), N, &grads);
  return loss;
}

template <typename T>
LossSum InternLM2<T>::forward_loss(const data::MicroBatch& batch,
                                   std::vector<double>* token_losses) {
  check_batch(batch, ops_.sequence_parallel_size);
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  forward_blocks(batch, false);
  ops_.norm->forward(xf_, rstdf_, xs_.back(), N, params_);
  if (token_losses) token_losses->assign(static_cast<size_t>(N), 0.0);
  return ops_.head->forward_backward(nullptr, xf_, batch.labels.data(), N, params_, nullptr, 0.0,
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
  ops_.norm->forward(xf_, rstdf_, xs_.back() + (n - 1) * H_, 1, params_);
  std::vector<T> logits(static_cast<size_t>(layout_.config().vocab_size));
  ops_.head->logits_row(logits.data(), xf_, params_);
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
