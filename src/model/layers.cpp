// Single-process (dense) versions of the model's ops, built on the kernels of ops.h.
#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/rope_scaling.h"
#include "ops/attention_groups.h"
#include "ops/ops.h"
#include "ops/threads.h"
#include "ops/vocab_check.h"

namespace longtron::model {
namespace {

/// W[out, in] (+ bias[out]) of views `weight`, `bias` (-1 = none).
template <typename T>
class DenseLinear final : public LinearOp<T> {
 public:
  DenseLinear(const ops::ComputeContext& cc, const ParamTable& layout, int weight, int bias)
      : cc_(cc), weight_(weight), bias_(bias), out_(layout.view(weight).shape[0]),
        in_(layout.view(weight).shape[1]) {}
  int64_t in() const override { return in_; }
  int64_t out() const override { return out_; }

  void forward(T* y, const T* x, int64_t N, const Params<T>& p) override {
    ops::linear_forward(cc_, y, x, p.ptr(weight_), p.ptr(bias_), N, in_, out_);
  }

  void backward(T* dx, const T* dy, const T* x, int64_t N, const Params<T>& p, Params<T>* g,
                bool accumulate_dx) override {
    ops::linear_backward(cc_, dx, g ? g->ptr(weight_) : nullptr, g ? g->ptr(bias_) : nullptr, dy, x,
                         p.ptr(weight_), N, in_, out_, accumulate_dx ? T(1) : T(0));
  }
  // Under bf16 its GEMMs read x through its context (shared bits when there are any); the bias
  // gradient reads dy only. Bits shared with another context would not be seen.
  bool reads_shared_input_bits_only(const ops::ComputeContext& cc) const override {
    return &cc == &cc_ && cc_.bf16();
  }

 private:
  const ops::ComputeContext& cc_;
  int weight_, bias_;
  int64_t out_, in_;
};

/// The gate and up projections W1, W3 [F, H] (+ biases, -1 = none) of one input: under bf16 the
/// input is rounded once for both (ops::linear_pair_forward / _backward).
template <typename T>
class DenseGateUp final : public GateUpOp<T> {
 public:
  DenseGateUp(const ops::ComputeContext& cc, const ParamTable& layout, const BlockParamIds& b)
      : cc_(cc), w1_(b.w1), b1_(b.w1_bias), w3_(b.w3), b3_(b.w3_bias),
        F_(layout.view(b.w1).shape[0]), H_(layout.view(b.w1).shape[1]) {}
  int64_t out() const override { return F_; }
  void forward(T* a, T* b, const T* x, int64_t N, const Params<T>& p) override {
    ops::linear_pair_forward(cc_, a, b, x, p.ptr(w1_), p.ptr(b1_), p.ptr(w3_), p.ptr(b3_), N, H_,
                             F_);
  }
  bool forward_out16(uint16_t* a16, uint16_t* b16, const T* x, int64_t N,
                     const Params<T>& p) override {
    if constexpr (std::is_same_v<T, float>)
      return ops::linear_pair_forward_out16(cc_, a16, b16, x, p.ptr(w1_), p.ptr(b1_), p.ptr(w3_),
                                            p.ptr(b3_), N, H_, F_);
    (void)a16, (void)b16, (void)x, (void)N, (void)p;
    return false;
  }
  void backward(T* dx, const T* da, const T* db, const T* x, int64_t N, const Params<T>& p,
                Params<T>* g) override {
    const auto grad = [g](int view) { return g ? g->ptr(view) : nullptr; };
    ops::linear_pair_backward(cc_, dx, grad(w1_), grad(b1_), grad(w3_), grad(b3_), da, db, x,
                              p.ptr(w1_), p.ptr(w3_), N, H_, F_);
  }

 private:
  const ops::ComputeContext& cc_;
  int w1_, b1_, w3_, b3_;
  int64_t F_, H_;
};

/// RMSNorm with weight view `weight` [H].
template <typename T>
class DenseNorm final : public NormOp<T> {
 public:
  DenseNorm(const ParamTable& layout, int weight)
      : weight_(weight), H_(layout.view(weight).shape[0]),
        eps_(static_cast<T>(layout.config().norm_eps)) {}
  void forward(T* out, T* rstd, const T* x, int64_t N, const Params<T>& p) override {
    ops::rms_norm_forward(out, rstd, x, p.ptr(weight_), N, H_, eps_);
  }
  bool forward_rounded(T* out, uint16_t* out16, T* rstd, const T* x, int64_t N,
                       const Params<T>& p) override {
    if (!std::is_same_v<T, float>) return NormOp<T>::forward_rounded(out, out16, rstd, x, N, p);
    ops::rms_norm_forward(out, rstd, x, p.ptr(weight_), N, H_, eps_, out16);
    return true;
  }
  void backward(T* dx, const T* dout, const T* x, const T* rstd, int64_t N, const Params<T>& p,
                Params<T>* g) override {
    ops::rms_norm_backward(dx, g ? g->ptr(weight_) : nullptr, dout, x, p.ptr(weight_), rstd, N,
                           H_);
  }

 private:
  int weight_;
  int64_t H_;
  T eps_;
};

/// Split of the grouped qkv rows [Hkv, q_per_kv + 2, d] (docs/model.md) into [q heads | k heads |
/// v heads] per token, so q, k and v are dense head ranges with token stride Q for the kernel.
template <typename T>
class DenseAttention final : public AttentionOp<T> {
 public:
  /// `window`: this block's sliding window (ModelConfig::window_of), 0 = none.
  DenseAttention(const ops::ComputeContext& cc, const ModelConfig& c, int64_t window)
      : cc_(cc), hq_(c.num_attention_heads), hkv_(c.num_kv_attention_heads), d_(c.head_dim()),
        q_(c.qkv_size()), config_(c), inv_freq_(rope_inv_freq(c)), window_(window),
        group_tokens_(attention_group_tokens(c)) {}
  int64_t qkv_features() const override { return q_; }
  int64_t out_features() const override { return hq_ * d_; }
  int64_t saved_qkv_size(int64_t N) const override { return N * q_; }
  int64_t saved_lse_size(int64_t N) const override { return N * hq_; }

  /// qkv may be qkv_s itself (the split is made token by token in place), and in backward dqkv,
  /// dqkv_s and qkv_s may be one buffer (ops/attention_groups.h): the model's chunked
  /// recomputation keeps one row-sized qkv buffer (ModelOps::token_chunks).
  void forward(T* out, T* qkv_s, T* lse, const T* qkv, const AttentionBatch& b) override {
    prepare_forward(qkv_s, qkv, b);
    ops::varlen_attention_forward_groups(cc_, out, lse, qkv_s, qkv_s + hq_ * d_,
                                         qkv_s + (hq_ + hkv_) * d_, shape(b), group_tokens_);
  }

  bool forward_rounded(T* out, T* qkv_s, uint16_t* qkv_s16, T* lse, const T* qkv,
                       const AttentionBatch& b) override {
    if constexpr (!std::is_same_v<T, float>) {
      return AttentionOp<T>::forward_rounded(out, qkv_s, qkv_s16, lse, qkv, b);
    } else {
      prepare_forward(qkv_s, qkv, b, qkv_s16);
      ops::varlen_attention_forward_groups(cc_, out, lse, qkv_s, qkv_s + hq_ * d_,
                                           qkv_s + (hq_ + hkv_) * d_, shape(b), group_tokens_);
      return true;
    }
  }

  void backward(T* dqkv, T* dqkv_s, const T* dout, const T* qkv_s, const T* out, const T* lse,
                const AttentionBatch& b) override {
    backward_rounded(dqkv, nullptr, dqkv_s, dout, qkv_s, out, lse, b);
  }

  bool backward_rounded(T* dqkv, uint16_t* dqkv16, T* dqkv_s, const T* dout, const T* qkv_s,
                        const T* out, const T* lse, const AttentionBatch& b) override {
    const ops::AttentionShape s = shape(b);
    ops::varlen_attention_backward_groups(cc_, dqkv_s, dqkv_s + hq_ * d_,
                                          dqkv_s + (hq_ + hkv_) * d_,
                                          dout, qkv_s, qkv_s + hq_ * d_,
                                          qkv_s + (hq_ + hkv_) * d_, out, lse, s, group_tokens_);
    if constexpr (!std::is_same_v<T, float>) dqkv16 = nullptr;
    finish_backward(dqkv, dqkv_s, b, dqkv16);
    return dqkv16 != nullptr;
  }

  void forward_bf16_out(uint16_t* out16, T* qkv_s, uint16_t* qkv_s16, T* lse, const T* qkv,
                        const AttentionBatch& b) override {
    if constexpr (std::is_same_v<T, float>) {
      prepare_forward(qkv_s, qkv, b, qkv_s16);
      ops::varlen_attention_forward_groups_bf16_out(cc_, out16, lse, qkv_s, qkv_s + hq_ * d_,
                                                    qkv_s + (hq_ + hkv_) * d_, shape(b),
                                                    group_tokens_);
    } else {
      AttentionOp<T>::forward_bf16_out(out16, qkv_s, qkv_s16, lse, qkv, b);
    }
  }

  bool backward_bf16_out(T* dqkv, uint16_t* dqkv16, T* dqkv_s, const T* dout, const T* qkv_s,
                         const uint16_t* out16, const T* lse, const AttentionBatch& b) override {
    if constexpr (std::is_same_v<T, float>) {
      ops::varlen_attention_backward_groups_bf16_out(
          cc_, dqkv_s, dqkv_s + hq_ * d_, dqkv_s + (hq_ + hkv_) * d_, dout, qkv_s,
          qkv_s + hq_ * d_, qkv_s + (hq_ + hkv_) * d_, out16, lse, shape(b), group_tokens_);
      finish_backward(dqkv, dqkv_s, b, dqkv16);
      return dqkv16 != nullptr;
    } else {
      return AttentionOp<T>::backward_bf16_out(dqkv, dqkv16, dqkv_s, dout, qkv_s, out16, lse, b);
    }
  }

  bool keeps_bf16_out() const override {
    return std::is_same_v<T, float> && ops::attention_bf16_runs(cc_);
  }

 private:
  /// qkv → qkv_s: split, and RoPE on the q and k heads (adjacent in the split layout) of each
  /// token as it is split, while its row is in cache; with bits (a float model), each row's
  /// round_to_bf16 into bits too.
  void prepare_forward(T* qkv_s, const T* qkv, const AttentionBatch& b,
                       uint16_t* bits = nullptr) const {
    const int64_t N = b.num_tokens;
    check_rope_positions(config_, b.indexes, N);
    const ops::RopeRotation<T> rope(b.indexes, N, d_, inv_freq_.data(), 1.0);
    permute(qkv_s, qkv, b, /*to_split=*/true, rope, bits);
  }
  /// dqkv_s (the kernels' gradients of the split q, k, v) → dqkv: each token's RoPE backward,
  /// then its regrouping (dqkv_s itself is left as the kernels wrote it, or is dqkv); with bits
  /// (a float model), each row's round_to_bf16 into bits too.
  void finish_backward(T* dqkv, T* dqkv_s, const AttentionBatch& b,
                       uint16_t* bits = nullptr) const {
    const ops::RopeRotation<T> rope(b.indexes, b.num_tokens, d_, inv_freq_.data(), -1.0);
    permute(dqkv, dqkv_s, b, /*to_split=*/false, rope, bits);
  }
  ops::AttentionShape shape(const AttentionBatch& b) const {
    ops::AttentionShape s{b.num_tokens, hq_, hkv_, d_, q_, q_, b.cu_seqlens, b.num_segments,
                          1.0 / std::sqrt(static_cast<double>(d_))};
    s.window = window_;
    return s;
  }
  /// grouped → split (to_split) or split → grouped; dst and src are [N, Q] (they may be the
  /// same buffer: then each token's row goes through a copy, as it does before the regrouping,
  /// which rotates it first). The q and k heads of the split row are rotated by `rope` (after
  /// the split; before the regrouping). With bits, each dst row is then rounded into them (a
  /// float model).
  void permute(T* dst, const T* src, const AttentionBatch& b, bool to_split,
               const ops::RopeRotation<T>& rope, uint16_t* bits = nullptr) const {
    const int64_t N = b.num_tokens;
    const int64_t qpk = hq_ / hkv_;
    const bool via_row = dst == src || !to_split;
#pragma omp parallel if (N * q_ > kParallelMinWork)
    {
      std::vector<T> row(via_row ? static_cast<size_t>(q_) : 0);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const T* in = src + n * q_;
        if (via_row) in = std::copy(in, in + q_, row.data()) - q_;
        if (!to_split) rope.rotate(row.data(), hq_ + hkv_, b.indexes[n]);
        for (int64_t g = 0; g < hkv_; ++g) {
          for (int64_t j = 0; j < qpk + 2; ++j) {
            const int64_t grouped = (g * (qpk + 2) + j) * d_;
            const int64_t head = j < qpk ? g * qpk + j : (j == qpk ? hq_ + g : hq_ + hkv_ + g);
            const int64_t split = head * d_;
            const T* s = in + (to_split ? grouped : split);
            T* o = dst + n * q_ + (to_split ? split : grouped);
#pragma omp simd  // a head's d elements: inline, not a library call per head
            for (int64_t x = 0; x < d_; ++x) o[x] = s[x];
          }
        }
        if (to_split) rope.rotate(dst + n * q_, hq_ + hkv_, b.indexes[n]);
        if constexpr (std::is_same_v<T, float>)
          if (bits != nullptr) ops::round_to_bf16_serial(dst + n * q_, q_, bits + n * q_);
      }
    }
  }
  const ops::ComputeContext& cc_;
  int64_t hq_, hkv_, d_, q_;
  ModelConfig config_;
  std::vector<double> inv_freq_;  // RoPE inverse frequencies (model/rope_scaling.h)
  int64_t window_;
  int64_t group_tokens_;  // queries per attention kernel call (whole segments)
};

template <typename T>
class DenseEmbedding final : public EmbeddingOp<T> {
 public:
  DenseEmbedding(const ParamTable& layout, int table)
      : table_(table), V_(layout.view(table).shape[0]), H_(layout.view(table).shape[1]) {}
  void forward(T* x, const int32_t* ids, int64_t N, const Params<T>& p) override {
    ops::check_token_ids(ids, N, V_);
    ops::embedding_forward(x, ids, p.ptr(table_), N, H_);
  }
  void backward(const T* dx, const int32_t* ids, int64_t N, Params<T>* g) override {
    if (g) ops::embedding_backward(g->ptr(table_), dx, ids, N, H_);
  }

 private:
  int table_;
  int64_t V_, H_;
};

/// Head + cross-entropy over chunks of rows; logits exist for one chunk at a time.
template <typename T>
class DenseHeadLoss final : public HeadLossOp<T> {
 public:
  DenseHeadLoss(const ops::ComputeContext& cc, const ParamTable& layout, int weight)
      : cc_(cc), weight_(weight), V_(layout.view(weight).shape[0]),
        H_(layout.view(weight).shape[1]) {}

  LossSum forward_backward(T* dxf, const T* xf, const int32_t* labels, int64_t N,
                           const Params<T>& p, Params<T>* g, double loss_scale,
                           double* token_losses) override {
    ops::check_labels(labels, N, V_);
    return chunked_head_loss(cc_, chunks_, dxf, dxf && g ? g->ptr(weight_) : nullptr, xf,
                             p.ptr(weight_), labels, N, V_, H_, head_chunk_rows(V_, N),
                             loss_scale, token_losses, nullptr, this->token_scale_);
  }
  bool supports_token_scale() const override { return true; }

  void logits_row(T* logits, const T* xf, const Params<T>& p) override {
    ops::gemm<T>(cc_, false, true, 1, V_, H_, T(1), xf, p.ptr(weight_), T(0), logits);
  }

 private:
  const ops::ComputeContext& cc_;
  int weight_;
  int64_t V_, H_;
  HeadChunks<T> chunks_;
};

}  // namespace

template <typename T>
double DenseChunkCrossEntropy<T>::forward(T* lse, int64_t* count, const T* logits,
                                          const int32_t* labels, int64_t rows) {
  return ops::cross_entropy_forward(lse, count, logits, labels, rows, V_);
}

template <typename T>
void DenseChunkCrossEntropy<T>::token_losses(double* out, const T* logits, const T* lse,
                                             const int32_t* labels, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t y = labels[r];
    out[r] = y < 0 ? 0.0 : double(lse[r]) - double(logits[r * V_ + y]);
  }
}

template <typename T>
void DenseChunkCrossEntropy<T>::backward(T* dlogits, const T* logits, const T* lse,
                                         const int32_t* labels, int64_t rows, T scale) {
  ops::cross_entropy_backward(dlogits, logits, lse, labels, rows, V_, scale);
}

template <typename T>
bool DenseChunkCrossEntropy<T>::forward_backward_bf16(double* loss, uint16_t* dlogits16, T* lse,
                                                      int64_t* count, const T* logits,
                                                      const int32_t* labels, int64_t rows,
                                                      T scale) {
  if constexpr (std::is_same_v<T, float>) {
    *loss = ops::cross_entropy_forward_backward_bf16(dlogits16, lse, count, logits, labels, rows,
                                                     V_, scale);
    return true;
  }
  (void)loss, (void)dlogits16, (void)lse, (void)count, (void)logits, (void)labels, (void)rows,
      (void)scale;
  return false;
}

namespace {
/// The one chunk loop of chunked_head_loss: for each chunk of rows, `step` makes the logits,
/// the cross-entropy's forward (fused with its backward where the step can), the token losses,
/// then with a backward the step's input and weight gradients. `Step` is one dtype's GEMMs:
///   void make_logits(int64_t n0, int64_t rows);            // logits of rows [n0, n0 + rows)
///   bool fused_forward_backward(double* sum, int64_t* count, const int32_t* labels,
///                               int64_t rows);             // false: not fused, nothing done
///   void backward(int64_t n0, int64_t rows, const int32_t* labels, bool fused);
template <typename T, typename Step>
LossSum drive_head_chunks(Step& step, ChunkCrossEntropy<T>& ce, const T* logits, T* lse,
                          const int32_t* labels, int64_t N, int64_t C, bool backward,
                          double* token_losses) {
  LossSum loss;
  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t rows = std::min(C, N - n0);
    step.make_logits(n0, rows);
    int64_t count = 0;
    double sum = 0;
    const bool fused = backward && step.fused_forward_backward(&sum, &count, labels + n0, rows);
    if (!fused) sum = ce.forward(lse, &count, logits, labels + n0, rows);
    loss.sum += sum;
    loss.count += count;
    if (token_losses) ce.token_losses(token_losses + n0, logits, lse, labels + n0, rows);
    if (backward) step.backward(n0, rows, labels + n0, fused);
  }
  return loss;
}

/// What every chunk step reads and writes: the head's input xf [N, H], its weight W [V, H] (or
/// its bf16 bits W16), the gradients dxf and dW (nullptr: none), one chunk's logits and lse.
template <typename T>
struct HeadStepArgs {
  const ops::ComputeContext& cc;
  ChunkCrossEntropy<T>& ce;
  T* dxf;
  T* dW;
  const T* xf;
  const T* W;
  const uint16_t* W16;
  int64_t V, H;
  T* logits;
  T* lse;
  double loss_scale;
  const double* token_scale;  ///< [N] per-row gradient factors, or nullptr
};

/// dlogits[rows, V] row r *= token_scale[n0 + r] (no-op without token_scale).
template <typename T>
void scale_rows(T* dlogits, const double* token_scale, int64_t n0, int64_t rows, int64_t V) {
  if (!token_scale) return;
  for (int64_t r = 0; r < rows; ++r) {
    const T f = static_cast<T>(token_scale[n0 + r]);
    T* row = dlogits + r * V;
    for (int64_t v = 0; v < V; ++v) row[v] *= f;
  }
}

/// The chunk step in T's own precision (or the float GEMMs of `cc` rounding per call): logits =
/// xf·Wᵀ (or from W16), dxf = dlogits·W, dW += dlogitsᵀ·xf.
template <typename T>
struct PlainHeadStep {
  HeadStepArgs<T> a;
  T* dlogits;

  // C = A·op(W): from the bf16 weight when given (float only), else gemm.
  void weight_gemm(bool tb, int64_t M, int64_t Nc, int64_t K, const T* A, T* C) const {
    if constexpr (std::is_same_v<T, float>) {
      if (a.W16) return ops::gemm_bf16_weight(false, tb, M, Nc, K, 1.f, A, a.W16, 0.f, C);
    }
    check(a.W != nullptr, "chunked_head_loss: no head weight");
    ops::gemm<T>(a.cc, false, tb, M, Nc, K, T(1), A, a.W, T(0), C);
  }
  void make_logits(int64_t n0, int64_t rows) {
    weight_gemm(true, rows, a.V, a.H, a.xf + n0 * a.H, a.logits);
  }
  bool fused_forward_backward(double*, int64_t*, const int32_t*, int64_t) { return false; }
  void backward(int64_t n0, int64_t rows, const int32_t* labels, bool) {
    a.ce.backward(dlogits, a.logits, a.lse, labels, rows, static_cast<T>(a.loss_scale));
    scale_rows(dlogits, a.token_scale, n0, rows, a.V);
    weight_gemm(false, rows, a.H, a.V, dlogits, a.dxf + n0 * a.H);
    if (a.dW) ops::linear_weight_grad(a.cc, a.dW, dlogits, a.xf + n0 * a.H, rows, a.H, a.V);
  }
};

/// The chunk step under a bf16 context: each chunk's xf rounded once (the logits GEMM and the
/// weight gradient read it), the gradient of the logits made in bf16 (fused with the
/// cross-entropy where ce can, else rounded once; the float step's GEMMs would round it twice),
/// the weight packed once for its two GEMMs (ops::SharedBf16B; oneDNN's kernels would copy it
/// again for each chunk). The same roundings and products as the float step under bf16, so the
/// same bits.
struct Bf16HeadStep {
  HeadStepArgs<float> a;
  HeadChunks<float>& s;
  int64_t C;
  uint16_t* dlogits16;
  const uint16_t* x16 = nullptr;  // this chunk's rows, in this thread's operand buffer
  const uint16_t* w16 = nullptr;
  // The weight packed at the first chunk for the two GEMMs that read it (the same bits).
  std::optional<ops::SharedBf16B> w_logits{}, w_dxf{};

  void make_logits(int64_t n0, int64_t rows) {
    const int64_t V = a.V, H = a.H;
    check(a.W16 != nullptr || a.W != nullptr, "chunked_head_loss: no head weight");
    // x16 stays in this thread's operand buffer: only GEMMs run until dW has read it.
    const auto r = ops::bf16_operands(a.cc, {ops::Bf16Operand{a.xf + n0 * H, rows * H},
                                             ops::Bf16Operand{a.W16 ? nullptr : a.W, V * H}});
    x16 = r[0];
    w16 = a.W16 ? a.W16 : r[1];
    if (!w_logits) {  // the first chunk has the chunk's full rows
      w_logits.emplace(s.weight_logits, false, true, rows, V, H, 1.f, 0.f, w16);
      if (a.dxf) w_dxf.emplace(s.weight_dxf, false, false, rows, H, V, 1.f, 0.f, w16);
    }
    w_logits->gemm(rows, x16, w16, a.logits);
  }
  bool fused_forward_backward(double* sum, int64_t* count, const int32_t* labels, int64_t rows) {
    if (a.token_scale) return false;  // the rows are scaled before rounding (backward)
    return a.ce.forward_backward_bf16(sum, dlogits16, a.lse, count, a.logits, labels, rows,
                                      static_cast<float>(a.loss_scale));
  }
  void backward(int64_t n0, int64_t rows, const int32_t* labels, bool fused) {
    const int64_t V = a.V, H = a.H;
    if (!fused) {
      float* const dlogits = s.dlogits.get(C * V + 1);
      a.ce.backward(dlogits, a.logits, a.lse, labels, rows, static_cast<float>(a.loss_scale));
      scale_rows(dlogits, a.token_scale, n0, rows, V);
      ops::round_to_bf16(dlogits, rows * V, dlogits16);
    }
    w_dxf->gemm(rows, dlogits16, w16, a.dxf + n0 * H);
    if (a.dW) ops::gemm_bf16(true, false, V, H, rows, 1.f, dlogits16, x16, 1.f, a.dW);
  }
};
}  // namespace

template <typename T>
LossSum chunked_head_loss(const ops::ComputeContext& cc, HeadChunks<T>& s, T* dxf, T* dW,
                          const T* xf, const T* W, const int32_t* labels, int64_t N, int64_t V,
                          int64_t H, int64_t chunk, double loss_scale, double* token_losses,
                          const uint16_t* W16, const double* token_scale) {
  DenseChunkCrossEntropy<T> ce(V);
  return chunked_head_loss(cc, s, ce, dxf, dW, xf, W, labels, N, V, H, chunk, loss_scale,
                           token_losses, W16, token_scale);
}

template <typename T>
LossSum chunked_head_loss(const ops::ComputeContext& cc, HeadChunks<T>& s,
                          ChunkCrossEntropy<T>& ce, T* dxf, T* dW,
                          const T* xf, const T* W, const int32_t* labels, int64_t N, int64_t V,
                          int64_t H, int64_t chunk, double loss_scale, double* token_losses,
                          const uint16_t* W16, const double* token_scale) {
  // Every rank of a vocabulary-parallel group takes the same chunks (each issues collectives).
  const int64_t C = std::max<int64_t>(1, std::min(chunk, N));
  // + 1: a rank holding no vocabulary column (Vc = 0) still gets a pointer.
  T* const logits = s.logits.get(C * V + 1);
  T* const lse = s.lse.get(C);
  const bool backward = dxf != nullptr;
  const HeadStepArgs<T> args{cc,  ce, dxf,    dW,  xf,         W,
                             W16, V,  H,      logits, lse, loss_scale, token_scale};
  if constexpr (std::is_same_v<T, float>) {
    if (cc.bf16() && N > 0 && H > 0) {
      Bf16HeadStep step{args, s, C, backward ? s.dlogits16.get(C * V + 1) : nullptr};
      return drive_head_chunks(step, ce, logits, lse, labels, N, C, backward, token_losses);
    }
  }
  PlainHeadStep<T> step{args, backward ? s.dlogits.get(C * V + 1) : nullptr};
  return drive_head_chunks(step, ce, logits, lse, labels, N, C, backward, token_losses);
}

template <typename T>
std::unique_ptr<NormOp<T>> make_dense_norm(const ParamTable& layout, int weight) {
  return std::make_unique<DenseNorm<T>>(layout, weight);
}

template <typename T>
ModelOps<T> make_dense_ops(const ParamTable& layout, const ops::ComputeContext& cc) {
  ModelOps<T> ops;
  ops.compute = &cc;
  ops.embedding = std::make_unique<DenseEmbedding<T>>(layout, layout.tok_embeddings);
  for (const BlockParamIds& b : layout.layers) {
    BlockOps<T> block;
    block.attention_norm = std::make_unique<DenseNorm<T>>(layout, b.attention_norm);
    block.ffn_norm = std::make_unique<DenseNorm<T>>(layout, b.ffn_norm);
    block.wqkv = std::make_unique<DenseLinear<T>>(cc, layout, b.wqkv, b.wqkv_bias);
    block.wo = std::make_unique<DenseLinear<T>>(cc, layout, b.wo, b.wo_bias);
    block.qk_norm = make_qk_norm<T>(layout, b, layout.config().num_attention_heads,
                                    layout.config().num_kv_attention_heads);
    block.gate_up = std::make_unique<DenseGateUp<T>>(cc, layout, b);
    block.w2 = std::make_unique<DenseLinear<T>>(cc, layout, b.w2, b.w2_bias);
    const int64_t layer = &b - layout.layers.data();
    block.attention =
        std::make_unique<DenseAttention<T>>(cc, layout.config(), layout.config().window_of(layer));
    ops.blocks.push_back(std::move(block));
  }
  ops.norm = std::make_unique<DenseNorm<T>>(layout, layout.norm);
  ops.head = std::make_unique<DenseHeadLoss<T>>(cc, layout, layout.output);
  ops.token_chunks = true;
  return ops;
}

#define LONGTRON_INSTANTIATE(T)                                                               \
  template class DenseChunkCrossEntropy<T>;                                                     \
  template LossSum chunked_head_loss<T>(const ops::ComputeContext&, HeadChunks<T>&, T*, T*,      \
                                        const T*, const T*,                                      \
                                        const int32_t*, int64_t, int64_t, int64_t, int64_t,      \
                                        double, double*, const uint16_t*, const double*);        \
  template LossSum chunked_head_loss<T>(const ops::ComputeContext&, HeadChunks<T>&,              \
                                        ChunkCrossEntropy<T>&, T*, T*,                          \
                                        const T*, const T*, const int32_t*, int64_t, int64_t,    \
                                        int64_t, int64_t, double, double*, const uint16_t*,      \
                                        const double*);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE
template ModelOps<float> make_dense_ops<float>(const ParamTable&, const ops::ComputeContext&);
template ModelOps<double> make_dense_ops<double>(const ParamTable&, const ops::ComputeContext&);
template std::unique_ptr<NormOp<float>> make_dense_norm<float>(const ParamTable&, int);
template std::unique_ptr<NormOp<double>> make_dense_norm<double>(const ParamTable&, int);

}  // namespace longtron::model
