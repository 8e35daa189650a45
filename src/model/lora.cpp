// LoRA adapters inside the model's linears (see lora.h).
#include "model/lora.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <cmath>
#include <random>

#include "core/bf16.h"
#include "core/error.h"
#include "model/families.h"
#include "model/hf_names.h"
#include "ops/lora_kernels.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"
#include "ops/vocab_check.h"

namespace longtron::model {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

/// The bf16 bits of src[0..n) in `bits` (grown as needed; float only).
template <typename T>
const uint16_t* round_bits(std::vector<uint16_t>& bits, const T* src, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    uint16_t* out = grow(bits, n);
    ops::round_to_bf16(src, n, out);
    return out;
  }
  (void)bits, (void)src, (void)n;
  fail("lora: bf16 operands of a double GEMM");
}

/// The frozen versions of the parameter-holding ops: the base op with no gradient buffer.
template <typename T>
class FrozenNorm final : public NormOp<T> {
 public:
  explicit FrozenNorm(std::unique_ptr<NormOp<T>> base) : base_(std::move(base)) {}
  void forward(T* out, T* rstd, const T* x, int64_t N, const Params<T>& p) override {
    base_->forward(out, rstd, x, N, p);
  }
  bool forward_rounded(T* out, uint16_t* out16, T* rstd, const T* x, int64_t N,
                       const Params<T>& p) override {
    return base_->forward_rounded(out, out16, rstd, x, N, p);
  }
  void backward(T* dx, const T* dout, const T* x, const T* rstd, int64_t N, const Params<T>& p,
                Params<T>*) override {
    base_->backward(dx, dout, x, rstd, N, p, nullptr);
  }

 private:
  std::unique_ptr<NormOp<T>> base_;
};

template <typename T>
class FrozenEmbedding final : public EmbeddingOp<T> {
 public:
  FrozenEmbedding(std::unique_ptr<EmbeddingOp<T>> base, const LoraState<T>* state, int view,
                  int64_t V, int64_t H)
      : base_(std::move(base)), state_(state), view_(view), V_(V), H_(H) {}
  void forward(T* x, const int32_t* ids, int64_t N, const Params<T>& p) override {
    const uint16_t* table = bf16_table();
    if (table == nullptr) return base_->forward(x, ids, N, p);
    ops::check_token_ids(ids, N, V_);
    for (int64_t n = 0; n < N; ++n) {
      const uint16_t* row = table + int64_t(ids[n]) * H_;
      for (int64_t h = 0; h < H_; ++h) x[n * H_ + h] = T(bf16_to_float(row[h]));
    }
  }
  void backward(const T* dx, const int32_t* ids, int64_t N, Params<T>*) override {
    base_->backward(dx, ids, N, nullptr);
  }

 private:
  const uint16_t* bf16_table() const {
    return state_ && !state_->base16.empty() ? state_->base16.at(size_t(view_)) : nullptr;
  }
  std::unique_ptr<EmbeddingOp<T>> base_;
  const LoraState<T>* state_ = nullptr;
  int view_ = -1;
  int64_t V_ = 0, H_ = 0;
};

template <typename T>
class FrozenHead final : public HeadLossOp<T> {
 public:
  FrozenHead(std::unique_ptr<HeadLossOp<T>> base, const LoraState<T>* state, int view, int64_t V,
             int64_t H)
      : base_(std::move(base)), state_(state), view_(view), V_(V), H_(H) {}
  LossSum forward_backward(T* dxf, const T* xf, const int32_t* labels, int64_t N,
                           const Params<T>& p, Params<T>*, double loss_scale,
                           double* token_losses) override {
    if constexpr (std::is_same_v<T, float>) {
      if (const uint16_t* W16 = bf16_weight()) {
        ops::check_labels(labels, N, V_);
        // Every GEMM reads W16 (no weight gradient). Under bf16 compute the chunk step of a bf16
        // context: the same roundings of x and of the logits' gradient, with W16 packed once for
        // all chunks and the cross-entropy's gradient made in bf16.
        const ops::ComputeContext& cc = state_->compute != nullptr && state_->compute->bf16()
                                            ? *state_->compute
                                            : ops::ComputeContext::fp32();
        return chunked_head_loss<T>(cc, chunks_, dxf, nullptr, xf, nullptr, labels, N, V_, H_,
                                    head_chunk_rows(V_, N), loss_scale, token_losses, W16,
                                    this->token_scale_);
      }
    }
    // The wrapped head reads the same factors (set on every call, so never left stale).
    base_->set_token_scale(this->token_scale_);
    const LossSum loss =
        base_->forward_backward(dxf, xf, labels, N, p, nullptr, loss_scale, token_losses);
    base_->set_token_scale(nullptr);
    return loss;
  }
  bool supports_token_scale() const override {
    return bf16_weight() != nullptr || base_->supports_token_scale();
  }
  void logits_row(T* logits, const T* xf, const Params<T>& p) override {
    if constexpr (std::is_same_v<T, float>) {
      if (const uint16_t* W16 = bf16_weight())
        return ops::linear_forward_bf16(logits, xf, W16, nullptr, 1, H_, V_);
    }
    base_->logits_row(logits, xf, p);
  }

 private:
  const uint16_t* bf16_weight() const {
    return state_ && !state_->base16.empty() ? state_->base16.at(size_t(view_)) : nullptr;
  }
  std::unique_ptr<HeadLossOp<T>> base_;
  const LoraState<T>* state_ = nullptr;
  int view_ = -1;
  int64_t V_ = 0, H_ = 0;
  HeadChunks<T> chunks_;
};

/// One adapter on one linear, as this rank holds it.
struct Piece {
  int a_view = -1, b_view = -1, layer = 0, id = 0;
  int64_t b_rows = 0;  ///< local rows of B
  struct Seg {
    int64_t y_col, b_row, count;  ///< y columns [y_col, +count) ← local B rows [b_row, +count)
  };
  std::vector<Seg> segs;
};

/// The adapters of one linear: y += s · (u Bᵀ) on their rows, u = dropout(x) Aᵀ.
template <typename T>
class Adapters {
 public:
  Adapters(std::vector<Piece> pieces, LoraLinearSpec<T> spec, int64_t in_local, int64_t out_local,
           std::shared_ptr<LoraState<T>> state)
      : pieces_(std::move(pieces)), spec_(std::move(spec)), in_(in_local), out_(out_local),
        state_(std::move(state)), r_(state_->config.rank) {}

  bool empty() const { return pieces_.empty(); }
  /// Whether the GEMMs read x itself (not dropout(x), which each adapter rounds for itself).
  bool reads_x() const {
    return !pieces_.empty() && !(state_->training && state_->config.dropout > 0.0);
  }

  /// y += the adapters' outputs. x_rounded: x16 already holds x's bf16 bits (under bf16 compute,
  /// rounded by the caller for the base's GEMM too).
  void forward(T* y, const T* x, int64_t N, bool x_rounded = false) {
    if (pieces_.empty() || state_->adapters_off) return;
    // Under bf16 compute the GEMMs read bf16 operands (torch.autocast's rule): x is rounded once
    // for all of the linear's adapters (once per adapter under dropout), A, B and u at each use.
    LoraState<T>& st = *state_;
    const int64_t nx = rows_x(N), ny = rows_y(N);
    const T s = T(st.config.scale());
    const T* rounded = x_rounded ? x : nullptr;  // the input x16 holds
    for (const Piece& p : pieces_) {
      if (fused(p)) {
        if constexpr (std::is_same_v<T, float>) {
          const T* xd = dropped(x, nx, N, p);
          ops::lora_forward(y, xd, weight(p.a_view, false), weight(p.b_view, false), s, nx, in_,
                            p.b_rows, r_, bf16(), bits_of(xd, x, rounded == x), outputs(p));
        }
        continue;
      }
      Operand xd;
      T* u = down_project(x, N, nx, ny, p, weight_a(p, false), &xd, &rounded);
      if (p.b_rows == 0) continue;
      const Operand B{weight(p.b_view, false)};
      if (whole(p)) {  // B covers every output column: y += s·u·Bᵀ in place
        mm(false, true, ny, out_, r_, s, {u}, B, T(1), y);
        continue;
      }
      T* t = grow(st.t, ny * p.b_rows);
      mm(false, true, ny, p.b_rows, r_, s, {u}, B, T(0), t);
      add_segments(y, t, ny, p);
    }
  }

  /// dx += the adapters' input gradients, their A and B gradients accumulated. x_rounded: x16
  /// holds x's bf16 bits; dy16: dy's bf16 bits (nullptr: rounded where needed), both under bf16
  /// compute, read by the fused passes (a bf16 base, which rounds them, is held in one process
  /// or data parallelism only, where every adapter runs fused).
  void backward(T* dx, const T* dy, const T* x, int64_t N, bool x_rounded = false,
                const uint16_t* dy16 = nullptr) {
    if (pieces_.empty()) return;
    LoraState<T>& st = *state_;
    const int64_t nx = rows_x(N), ny = rows_y(N);
    const T s = T(st.config.scale());
    const T* rounded = x_rounded ? x : nullptr;  // the input x16 holds
    for (const Piece& p : pieces_) {
      if (fused(p)) {
        backward_fused(dx, dy, x, N, p, rounded == x, bf16() ? dy16 : nullptr);
        continue;
      }
      Operand xd;
      const T* A = weight_a(p, true);
      // u recomputed: nothing kept since forward.
      T* u = down_project(x, N, nx, ny, p, A, &xd, &rounded);
      T* du = grow(st.du, ny * r_);
      if (p.b_rows > 0) {
        Operand dym{dy};  // B covers every output column: dy itself
        if (!whole(p)) dym.f = rows_of(st.dym, dy, ny, p);
        if (bf16()) dym.h = round_bits(st.dy16, dym.f, ny * p.b_rows);  // read by both GEMMs
        // dB += s · dymᵀ u; du = s · dym B.
        const Operand B{weight(p.b_view, true)};
        add_gradient(p.b_view, p.b_rows * r_, [&](T* dB, T beta) {
          if (!bf16()) return mm(true, false, p.b_rows, r_, ny, s, dym, {u}, beta, dB);
          // Under bf16 as dBᵀ = s · uᵀ dym: oneDNN runs this shape in one parallel region where
          // dymᵀ u takes two (each costs a synchronisation of the threads, dear on a busy CPU).
          T* t = grow(st.t, r_ * p.b_rows);
          mm(true, false, r_, p.b_rows, ny, s, {u}, dym, T(0), t);
          for (int64_t i = 0; i < p.b_rows; ++i)
            for (int64_t k = 0; k < r_; ++k)
              dB[i * r_ + k] = (beta == T(0) ? T(0) : dB[i * r_ + k]) + t[k * p.b_rows + i];
        });
        mm(false, false, ny, r_, p.b_rows, s, dym, B, T(0), du);
      } else {
        std::fill(du, du + ny * r_, T(0));
      }
      T* dux = du;
      if (spec_.backward_du) {
        dux = grow(st.dux, nx * r_);
        spec_.backward_du(dux, du, N, r_);
      }
      // dA += duᵀ dropout(x); dx += dropout'(du A).
      add_gradient(p.a_view, r_ * in_, [&](T* dA, T beta) {
        mm(true, false, r_, in_, nx, T(1), {dux}, xd, beta, dA);
      });
      if (xd.f == x) {
        mm(false, false, nx, in_, r_, T(1), {dux}, {A}, T(1), dx);
      } else {
        T* g = grow(st.xd, nx * in_);  // xd is no longer needed
        mm(false, false, nx, in_, r_, T(1), {dux}, {A}, T(0), g);
        apply_mask(dx, g, nx, N, p, /*accumulate=*/true);
      }
    }
  }

 private:
  /// A GEMM operand: its values, and under bf16 compute its bf16 bits where already rounded.
  struct Operand {
    const T* f = nullptr;
    const uint16_t* h = nullptr;
  };

  /// Whether `p` runs as the fused kernels (ops/lora_kernels.h; float, fp32 or bf16 compute): rows
  /// where they are (no redistribution of u or du) and whole adapters in the table (no
  /// weight-parallel gather or reduction). Elsewhere the GEMMs below.
  bool fused(const Piece& p) const {
    return std::is_same_v<T, float> && !spec_.forward_u &&
           !spec_.backward_du && !spec_.gather && !spec_.reduce && p.b_rows > 0;
  }

  /// Where B's rows land in y for the fused kernels: all of y's columns (whole), else p's segments.
  ops::LoraOutputs outputs(const Piece& p) const {
    ops::LoraOutputs o;
    if (whole(p)) return o;
    o.ldy = out_;
    for (const Piece::Seg& g : p.segs) o.segments.push_back({g.y_col, g.b_row, g.count});
    return o;
  }

  /// x16's bits when the adapter reads x itself and the caller rounded it there, else nullptr.
  const uint16_t* bits_of(const T* xd, const T* x, bool x_rounded) const {
    return bf16() && x_rounded && xd == x ? state_->x16.data() : nullptr;
  }

  /// The fused backward of `p`: dA, dB into the table's gradients, dx += its input gradient
  /// (under dropout computed into scratch, then masked). dy16: dy's bits, or nullptr.
  void backward_fused(T* dx, const T* dy, const T* x, int64_t N, const Piece& p, bool x_rounded,
                      const uint16_t* dy16) {
    if constexpr (std::is_same_v<T, float>) {
      LoraState<T>& st = *state_;
      const int64_t nx = rows_x(N);
      const T* xd = dropped(x, nx, N, p);
      T* dA = st.grads->ptr(p.a_view);
      T* dB = st.grads->ptr(p.b_view);
      const T* A = weight(p.a_view, true);
      const T* B = weight(p.b_view, true);
      const T s = T(st.config.scale());
      const uint16_t* x16 = bits_of(xd, x, x_rounded);
      const int64_t out = p.b_rows;
      if (xd == x)
        return ops::lora_backward(dx, true, dA, dB, dy, x, A, B, s, nx, in_, out, r_, bf16(), x16,
                                  dy16, outputs(p));
      T* g = grow(st.t, nx * in_);
      ops::lora_backward(g, false, dA, dB, dy, xd, A, B, s, nx, in_, out, r_, bf16(), x16, dy16,
                         outputs(p));
      apply_mask(dx, g, nx, N, p, /*accumulate=*/true);
    }
    (void)dx, (void)dy, (void)x, (void)N, (void)p, (void)x_rounded, (void)dy16;
  }

  /// Float under a kBFloat16 compute context: the adapters' GEMMs take bf16 operands.
  bool bf16() const {
    if constexpr (std::is_same_v<T, float>)
      return state_->compute != nullptr && state_->compute->bf16();
    return false;
  }


  /// C = alpha·op(A)·op(B) + beta·C as ops::gemm: in fp32, or under bf16 compute on bf16 operands
  /// with fp32 accumulation (an operand without bits is rounded here; small ones only: A, B, u).
  void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, Operand a, Operand b, T beta,
          T* C) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16()) {
        if (a.h == nullptr && b.h == nullptr)
          return ops::gemm<T>(*state_->compute, ta, tb, M, N, K, alpha, a.f, b.f, beta, C);
        if (a.h == nullptr) a.h = round_bits(state_->w16, a.f, M * K);
        if (b.h == nullptr) b.h = round_bits(state_->w16, b.f, K * N);
        if (M == 0 || N == 0 || K == 0)  // as ops::gemm's edge cases
          return ops::gemm<T>(ta, tb, M, N, K, alpha, a.f, b.f, beta, C);
        return ops::gemm_bf16(ta, tb, M, N, K, alpha, a.h, b.h, beta, C);
      }
    }
    ops::gemm<T>(ta, tb, M, N, K, alpha, a.f, b.f, beta, C);
  }

  /// u = dropout(x)·Aᵀ over y's rows ([ny, r]); *xd is the (dropped) input it read, with its bf16
  /// bits under bf16 compute (x16; *rounded: the input x16 already holds, reused across pieces).
  T* down_project(const T* x, int64_t N, int64_t nx, int64_t ny, const Piece& p, const T* A,
                  Operand* xd, const T** rounded) {
    xd->f = dropped(x, nx, N, p);
    if (bf16()) {
      if (*rounded != x || xd->f != x) round_bits(state_->x16, xd->f, nx * in_);
      *rounded = xd->f == x ? x : nullptr;
      xd->h = state_->x16.data();
    }
    T* ux = grow(state_->u, nx * r_);
    mm(false, true, nx, r_, in_, T(1), *xd, {A}, T(0), ux);
    return to_y(ux, N, nx, ny);
  }

  /// The values of adapter view `view` the GEMMs read: the table's, or gathered (weight parallel;
  /// valid until the next gather).
  const T* weight(int view, bool backward) {
    return spec_.gather ? spec_.gather(view, backward) : state_->params->ptr(view);
  }
  /// A of `p`, kept past B's gather (a gathered A is copied to scratch: [r, in] is small).
  const T* weight_a(const Piece& p, bool backward) {
    const T* A = weight(p.a_view, backward);
    if (!spec_.gather) return A;
    T* kept = grow(state_->a, r_ * in_);
    std::copy(A, A + r_ * in_, kept);
    return kept;
  }
  /// gemm(out, beta) adds a gradient of `n` elements of adapter view `view`: into the table's
  /// gradient (beta 1), or under weight parallel into full-shape scratch (beta 0) then reduced.
  template <typename Gemm>
  void add_gradient(int view, int64_t n, Gemm gemm) {
    if (!spec_.reduce) return gemm(state_->grads->ptr(view), T(1));
    T* full = spec_.grad_scratch(n);
    gemm(full, T(0));
    spec_.reduce(state_->grads->ptr(view), full, view);
  }

  /// One segment over all of y's columns in order (InternLM2's wqkv, every linear but q/k/v).
  bool whole(const Piece& p) const {
    return p.segs.size() == 1 && p.segs[0].y_col == 0 && p.segs[0].b_row == 0 &&
           p.segs[0].count == out_;
  }
  int64_t rows_x(int64_t N) const { return spec_.x_rows ? spec_.x_rows(N) : N; }

  int64_t rows_y(int64_t N) const { return spec_.y_rows ? spec_.y_rows(N) : N; }

  /// u over y's rows (complete) from u over x's rows.
  T* to_y(T* ux, int64_t N, int64_t nx, int64_t ny) {
    if (!spec_.forward_u) return ux;
    (void)nx;
    T* u = grow(state_->uy, ny * r_);
    spec_.forward_u(u, ux, N, r_);
    return u;
  }

  /// x itself without dropout (or outside training), else dropout(x) in scratch.
  const T* dropped(const T* x, int64_t nx, int64_t N, const Piece& p) {
    const LoraState<T>& st = *state_;
    if (!st.training || st.config.dropout <= 0.0) return x;
    T* xd = grow(state_->xd, nx * in_);
    apply_mask(xd, x, nx, N, p, /*accumulate=*/false);
    return xd;
  }

  /// out = (or +=) mask ⊙ in / (1 − p) over [nx, in_] local rows and columns.
  void apply_mask(T* out, const T* src, int64_t nx, int64_t N, const Piece& p, bool accumulate) {
    const LoraState<T>& st = *state_;
    const uint64_t key = lora_dropout_key(st.config.seed, st.step, p.layer, p.id);
    const int64_t pos0 = spec_.x_position ? spec_.x_position(N) : 0;
    const int32_t* positions = st.positions.empty() ? nullptr : st.positions.data();
    const int64_t in = in_;
#pragma omp parallel for schedule(static) if (nx * in > kParallelMinWork)
    for (int64_t n = 0; n < nx; ++n) {
      const int64_t k = st.token_offset + n;
      const int64_t position = positions ? int64_t(positions[k]) : pos0 + k;
      lora_dropout_row(out + n * in, src + n * in, in, key, position, spec_.col0,
                       st.config.dropout, accumulate);
    }
  }

  /// B's rows of y-shaped `src` ([ny, out_] → [ny, b_rows] in `rows`).
  const T* rows_of(std::vector<T>& rows, const T* src, int64_t ny, const Piece& p) const {
    T* out = grow(rows, ny * p.b_rows);
    for (const Piece::Seg& g : p.segs)
      for (int64_t n = 0; n < ny; ++n)
        std::copy(src + n * out_ + g.y_col, src + n * out_ + g.y_col + g.count,
                  out + n * p.b_rows + g.b_row);
    return out;
  }

  void add_segments(T* y, const T* t, int64_t ny, const Piece& p) const {
    const int64_t out = out_, br = p.b_rows;
#pragma omp parallel for schedule(static) if (ny * br > kParallelMinWork)
    for (int64_t n = 0; n < ny; ++n)
      for (const Piece::Seg& g : p.segs)
        for (int64_t j = 0; j < g.count; ++j) y[n * out + g.y_col + j] += t[n * br + g.b_row + j];
  }

  std::vector<Piece> pieces_;
  LoraLinearSpec<T> spec_;
  int64_t in_, out_;
  std::shared_ptr<LoraState<T>> state_;
  int64_t r_;
};

/// The frozen base linear of view `weight` (bias `bias`, -1 = none): the base op, or with a bf16
/// base (LoraState::base16, one process) the bf16-weight GEMMs directly; never a weight gradient.
template <typename T>
class FrozenLinear {
 public:
  FrozenLinear(std::unique_ptr<LinearOp<T>> base, const LoraState<T>* state, int weight, int bias)
      : base_(std::move(base)), state_(state), weight_(weight), bias_(bias) {}
  LinearOp<T>& op() { return *base_; }
  void forward(T* y, const T* x, int64_t N, const Params<T>& p) {
    if constexpr (std::is_same_v<T, float>) {
      if (const uint16_t* W16 = bf16_weight())
        return ops::linear_forward_bf16(y, x, W16, p.ptr(bias_), N, base_->in(), base_->out());
    }
    base_->forward(y, x, N, p);
  }
  void backward(T* dx, const T* dy, const T* x, int64_t N, const Params<T>& p, bool accumulate) {
    if constexpr (std::is_same_v<T, float>) {
      if (const uint16_t* W16 = bf16_weight())
        return ops::linear_backward_bf16(ops::ComputeContext::fp32(), dx, nullptr, nullptr, dy,
                                         x, W16, N, base_->in(),
                                         base_->out(), accumulate ? 1.f : 0.f);
    }
    base_->backward(dx, dy, x, N, p, nullptr, accumulate);
  }
  /// Under LoraState::shares_bf16: the GEMMs read operands the caller rounded once for the base
  /// and its adapters (the bits linear_forward_bf16 and linear_backward_bf16 round).
  void forward(T* y, const uint16_t* x16, int64_t N, const Params<T>& p) {
    if constexpr (std::is_same_v<T, float>)
      ops::linear_forward_bf16(y, x16, bf16_weight(), p.ptr(bias_), N, base_->in(), base_->out());
  }
  void backward(T* dx, const uint16_t* dy16, int64_t N, bool accumulate) {
    if constexpr (std::is_same_v<T, float>)
      ops::linear_input_grad_bf16(dx, dy16, bf16_weight(), N, base_->in(), base_->out(),
                                  accumulate ? 1.f : 0.f);
  }

 private:
  const uint16_t* bf16_weight() const {
    return !state_->base16.empty() ? state_->base16.at(size_t(weight_)) : nullptr;
  }
  std::unique_ptr<LinearOp<T>> base_;
  const LoraState<T>* state_;
  int weight_, bias_;
};

template <typename T>
class LoraLinear final : public LinearOp<T> {
 public:
  LoraLinear(FrozenLinear<T> base, Adapters<T> adapters, LoraState<T>* state)
      : base_(std::move(base)), adapters_(std::move(adapters)), state_(state) {}
  int64_t in() const override { return base_.op().in(); }
  int64_t out() const override { return base_.op().out(); }
  void forward(T* y, const T* x, int64_t N, const Params<T>& p) override {
    if (state_->shares_bf16()) {  // x rounded once for the base and the adapters
      base_.forward(y, round_bits(state_->x16, x, N * in()), N, p);
      return adapters_.forward(y, x, N, /*x_rounded=*/true);
    }
    base_.forward(y, x, N, p);
    adapters_.forward(y, x, N);
  }
  void backward(T* dx, const T* dy, const T* x, int64_t N, const Params<T>& p, Params<T>*,
                bool accumulate_dx) override {
    if constexpr (std::is_same_v<T, float>) {
      if (state_->shares_bf16()) return backward_shared(dx, dy, x, N, accumulate_dx);
    }
    base_.backward(dx, dy, x, N, p, accumulate_dx);
    adapters_.backward(dx, dy, x, N);
  }

 private:
  /// dy (and x) rounded once, in one region, for the base's GEMM and the adapters'.
  void backward_shared(float* dx, const float* dy, const float* x, int64_t N, bool accumulate_dx) {
    uint16_t* dy16 = grow(state_->dy16, N * out());
    const bool x_rounded = adapters_.reads_x();
    const int64_t nx = x_rounded ? N * in() : 0;
    ops::round_to_bf16_all({{dy, N * out(), dy16}, {x, nx, grow(state_->x16, nx)}});
    base_.backward(dx, dy16, N, accumulate_dx);
    adapters_.backward(dx, dy, x, N, x_rounded, dy16);
  }

  mutable FrozenLinear<T> base_;
  Adapters<T> adapters_;
  LoraState<T>* state_;
};

template <typename T>
class LoraGateUp final : public GateUpOp<T> {
 public:
  /// ids: w1, w1 bias, w3, w3 bias views (for a bf16 base, read directly; H the input width).
  LoraGateUp(std::unique_ptr<GateUpOp<T>> base, Adapters<T> w1, Adapters<T> w3,
             LoraState<T>* state, std::array<int, 4> ids, int64_t H)
      : base_(std::move(base)), w1_(std::move(w1)), w3_(std::move(w3)), state_(state), ids_(ids),
        H_(H) {}
  int64_t out() const override { return base_->out(); }
  void forward(T* a, T* b, const T* x, int64_t N, const Params<T>& p) override {
    if (state_->shares_bf16()) {  // x rounded once for both base GEMMs and both adapters
      const int64_t F = base_->out();
      const uint16_t* x16 = round_bits(state_->x16, x, N * H_);
      forward16(a, x16, ids_[0], ids_[1], N, F, p);
      forward16(b, x16, ids_[2], ids_[3], N, F, p);
      w1_.forward(a, x, N, /*x_rounded=*/true);
      return w3_.forward(b, x, N, /*x_rounded=*/true);  // under dropout each rounds its own
    }
    if constexpr (std::is_same_v<T, float>) {
      if (!state_->base16.empty()) {
        const int64_t F = base_->out();
        ops::linear_forward_bf16(a, x, bf16(ids_[0]), p.ptr(ids_[1]), N, H_, F);
        ops::linear_forward_bf16(b, x, bf16(ids_[2]), p.ptr(ids_[3]), N, H_, F);
      } else {
        base_->forward(a, b, x, N, p);
      }
    } else {
      base_->forward(a, b, x, N, p);
    }
    w1_.forward(a, x, N);
    w3_.forward(b, x, N);
  }
  void backward(T* dx, const T* da, const T* db, const T* x, int64_t N, const Params<T>& p,
                Params<T>*) override {
    if constexpr (std::is_same_v<T, float>) {
      if (state_->shares_bf16()) return backward_shared(dx, da, db, x, N);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (!state_->base16.empty()) {
        const int64_t F = base_->out();
        const ops::ComputeContext& fp32 = ops::ComputeContext::fp32();  // no weight gradient
        ops::linear_backward_bf16(fp32, dx, nullptr, nullptr, da, x, bf16(ids_[0]), N, H_, F, 0.f);
        ops::linear_backward_bf16(fp32, dx, nullptr, nullptr, db, x, bf16(ids_[2]), N, H_, F, 1.f);
      } else {
        base_->backward(dx, da, db, x, N, p, nullptr);
      }
    } else {
      base_->backward(dx, da, db, x, N, p, nullptr);
    }
    w1_.backward(dx, da, x, N);
    w3_.backward(dx, db, x, N);
  }

 private:
  const uint16_t* bf16(int view) const { return state_->base16.at(size_t(view)); }
  /// da, db and x rounded once, in one region, for the base's GEMMs and the adapters'.
  void backward_shared(float* dx, const float* da, const float* db, const float* x, int64_t N) {
    const int64_t F = base_->out();
    uint16_t* da16 = grow(state_->dy16, N * F);
    uint16_t* db16 = grow(state_->dy16b, N * F);
    const bool rounded = w1_.reads_x() || w3_.reads_x();
    const int64_t nx = rounded ? N * H_ : 0;
    ops::round_to_bf16_all({{da, N * F, da16}, {db, N * F, db16}, {x, nx, grow(state_->x16, nx)}});
    backward16(dx, da16, ids_[0], N, F, 0.f);
    backward16(dx, db16, ids_[2], N, F, 1.f);
    w1_.backward(dx, da, x, N, rounded, da16);
    w3_.backward(dx, db, x, N, rounded, db16);
  }
  /// out = x16·W16ᵀ + bias of views (weight, bias), the same bits as linear_forward_bf16 on x.
  void forward16(T* out, const uint16_t* x16, int weight, int bias, int64_t N, int64_t F,
                 const Params<T>& p) {
    if constexpr (std::is_same_v<T, float>)
      ops::linear_forward_bf16(out, x16, bf16(weight), p.ptr(bias), N, H_, F);
  }
  /// dx = beta·dx + dy16·W16 of view `weight` (no weight gradient).
  void backward16(T* dx, const uint16_t* dy16, int weight, int64_t N, int64_t F, float beta) {
    if constexpr (std::is_same_v<T, float>)
      ops::linear_input_grad_bf16(dx, dy16, bf16(weight), N, H_, F, beta);
  }
  std::unique_ptr<GateUpOp<T>> base_;
  Adapters<T> w1_, w3_;
  LoraState<T>* state_;
  std::array<int, 4> ids_;
  int64_t H_;
};

}  // namespace

std::vector<std::string> lora_family_targets(const std::string& type) {
  const Family* f = find_family(type);
  check(f != nullptr, "lora: unknown model family '{}'", type);
  return {f->lora_targets.begin(), f->lora_targets.end()};
}

std::vector<std::string> lora_resolve_targets(const std::string& type,
                                              const std::vector<std::string>& requested) {
  const std::vector<std::string> family = lora_family_targets(type);
  check(!requested.empty(), "lora.targets: empty (give module names of {}: {}, or \"all-linear\")",
        type, joined(family));
  std::vector<bool> chosen(family.size(), false);
  for (const std::string& r : requested) {
    if (r == "all-linear") {
      check(requested.size() == 1, "lora.targets: \"all-linear\" stands alone (got {})",
            joined(requested));
      return family;
    }
    const auto it = std::find(family.begin(), family.end(), r);
    check(it != family.end(), "lora.targets: '{}' is not a linear of a {} model ({}, or \"all-linear\")",
          r, type, joined(family));
    const size_t k = size_t(it - family.begin());
    check(!chosen[k], "lora.targets: '{}' is listed twice", r);
    chosen[k] = true;
  }
  std::vector<std::string> out;
  for (size_t k = 0; k < family.size(); ++k)
    if (chosen[k]) out.push_back(family[k]);
  return out;
}

std::vector<LoraModule> lora_modules(const ParamTable& base, const LoraConfig& lora) {
  const std::string& type = base.config().type;
  const std::vector<std::string> family = lora_family_targets(type);
  const std::vector<std::string> targets = lora_resolve_targets(type, lora.targets);
  std::vector<LoraModule> out;
  for (const HfTensor& t : hf_tensors(base)) {
    const std::string suffix = ".weight";
    if (t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const ParamView& v = base.view(t.view);
    if (v.layer < 0) continue;
    const BlockParamIds& b = base.layers[size_t(v.layer)];
    if (t.view != b.wqkv && t.view != b.wo && t.view != b.w1 && t.view != b.w3 && t.view != b.w2)
      continue;
    LoraModule m;
    m.module = t.name.substr(0, t.name.size() - suffix.size());
    m.target = m.module.substr(m.module.rfind('.') + 1);
    if (std::find(targets.begin(), targets.end(), m.target) == targets.end()) continue;
    m.layer = v.layer;
    m.id = int(std::find(family.begin(), family.end(), m.target) - family.begin());
    m.base_view = t.view;
    m.out = t.shape[0];
    m.in = t.shape[1];
    m.rows = t.rows;
    out.push_back(std::move(m));
  }
  for (size_t k = 0; k < out.size(); ++k) {
    out[k].a_view = int(2 * k);
    out[k].b_view = int(2 * k + 1);
  }
  return out;
}

ParamTable lora_table(const ParamTable& base, const std::vector<LoraModule>& modules, int64_t rank) {
  check(rank > 0, "lora.rank: {} (the adapter table needs rank > 0)", rank);
  std::vector<ParamView> views;
  for (const LoraModule& m : modules) {
    for (int k = 0; k < 2; ++k) {
      ParamView v;
      v.name = m.module + (k == 0 ? ".lora_A.weight" : ".lora_B.weight");
      v.shape = k == 0 ? std::vector<int64_t>{rank, m.in} : std::vector<int64_t>{m.out, rank};
      v.layer = m.layer;
      v.is_matrix = true;
      v.init_std = 0.0;
      views.push_back(std::move(v));
    }
  }
  return base.with_views(std::move(views));
}

template <typename T>
void lora_init_tensor(T* out, const ParamView& view, int index, uint64_t seed) {
  const bool is_a = view.name.size() >= 14 &&
                    view.name.compare(view.name.size() - 14, 14, ".lora_A.weight") == 0;
  if (!is_a) {
    std::fill(out, out + view.numel, T(0));
    return;
  }
  std::mt19937_64 rng(splitmix64(seed + uint64_t(index) * 0x9E3779B97F4A7C15ULL));
  const double bound = 1.0 / std::sqrt(double(view.shape.at(1)));
  for (int64_t i = 0; i < view.numel; ++i) {
    const double u = double(rng() >> 11) * 0x1.0p-53;
    out[i] = T((2.0 * u - 1.0) * bound);
  }
}

std::vector<const uint16_t*> lora_base_bf16(const ParamTable& layout, const float* params,
                                            std::vector<uint16_t>& storage) {
  std::vector<int> views;
  int64_t total = 0;
  for (int v = 0; v < int(layout.views().size()); ++v)
    if (layout.view(v).is_matrix) views.push_back(v), total += layout.view(v).numel;
  storage.assign(size_t(total), 0);
  std::vector<const uint16_t*> out(layout.views().size(), nullptr);
  int64_t at = 0;
  for (int v : views) {
    const ParamView& view = layout.view(v);
    ops::round_to_bf16(params + view.offset, view.numel, storage.data() + at);
    out[size_t(v)] = storage.data() + at;
    at += view.numel;
  }
  return out;
}

uint64_t lora_dropout_key(uint64_t seed, int64_t step, int layer, int module) {
  uint64_t k = splitmix64(seed ^ 0x4C6F5241ULL);  // "LoRA"
  k = splitmix64(k + uint64_t(step));
  k = splitmix64(k + uint64_t(int64_t(layer)));
  return splitmix64(k + uint64_t(int64_t(module)));
}

bool lora_keep(uint64_t key, int64_t position, int64_t feature, double p) {
  const uint64_t h = splitmix64(splitmix64(key + uint64_t(position)) + uint64_t(feature));
  return double(h >> 11) * 0x1.0p-53 >= p;
}

namespace {

/// The smallest 53-bit draw lora_keep keeps: (h >> 11)·2⁻⁵³ ≥ p ⟺ (h >> 11) ≥ ⌈p·2⁵³⌉, both
/// sides exact in double (a draw is below 2⁵³; scaling by 2⁵³ rounds nothing).
uint64_t keep_threshold(double p) { return uint64_t(std::ceil(std::ldexp(p, 53))); }

template <typename T, bool kAccumulate>
void dropout_row(T* out, const T* src, int64_t n, uint64_t row_hash, int64_t col0,
                 uint64_t threshold, T keep_scale) {
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t h = splitmix64(row_hash + uint64_t(col0 + j));
    const T v = (h >> 11) >= threshold ? src[j] * keep_scale : T(0);
    if constexpr (kAccumulate) out[j] += v;
    else out[j] = v;
  }
}

}  // namespace

template <typename T>
void lora_dropout_row(T* out, const T* src, int64_t n, uint64_t key, int64_t position,
                      int64_t col0, double p, bool accumulate) {
  const uint64_t row_hash = splitmix64(key + uint64_t(position));
  const uint64_t threshold = keep_threshold(p);
  const T keep_scale = T(1.0 / (1.0 - p));
  if (accumulate) dropout_row<T, true>(out, src, n, row_hash, col0, threshold, keep_scale);
  else dropout_row<T, false>(out, src, n, row_hash, col0, threshold, keep_scale);
}

template <typename T>
void apply_lora(ModelOps<T>& ops, const ParamTable& base_local, const std::vector<LoraModule>& modules,
                const ParamTable& adapter_local, std::shared_ptr<LoraState<T>> state,
                const std::function<LoraLinearSpec<T>(int layer, int base_view)>& spec) {
  const int64_t r = state->config.rank;
  auto adapters_of = [&](int layer, int view, int64_t in_local, int64_t out_local) {
    std::vector<Piece> pieces;
    LoraLinearSpec<T> sp = spec(layer, view);
    const int64_t full_rows = base_local.view(view).shape[0];  // local rows if split; see below
    (void)full_rows;
    for (const LoraModule& m : modules) {
      if (m.layer != layer || m.base_view != view) continue;
      const int64_t row0 = sp.row0, row1 = sp.rows < 0 ? INT64_MAX : sp.row0 + sp.rows;
      Piece p;
      p.a_view = m.a_view;
      p.b_view = m.b_view;
      p.layer = m.layer;
      p.id = m.id;
      int64_t b_full = 0, b_first = -1;
      for (const auto& [first, count] : m.rows) {
        const int64_t lo = std::max(first, row0), hi = std::min(first + count, row1);
        if (lo < hi) {
          const int64_t b = b_full + (lo - first);  // B's full row of y row lo
          if (b_first < 0) b_first = b;
          p.segs.push_back({lo - row0, b - b_first, hi - lo});
          p.b_rows += hi - lo;
        }
        b_full += count;
      }
      // Shards gathered whole before use (weight parallel) multiply as the whole tensors.
      const std::vector<int64_t> a_shape = sp.gather ? std::vector<int64_t>{r, m.in}
                                                     : adapter_local.view(m.a_view).shape;
      const std::vector<int64_t> b_shape = sp.gather ? std::vector<int64_t>{m.out, r}
                                                     : adapter_local.view(m.b_view).shape;
      check(a_shape == std::vector<int64_t>{r, in_local} &&
                b_shape == std::vector<int64_t>{p.b_rows, r},
            "lora: {} held as [{}, {}] / [{}, {}]; its linear gives [{}, {}] / [{}, {}]", m.module,
            a_shape[0], a_shape[1], b_shape[0], b_shape[1], r, in_local, p.b_rows, r);
      pieces.push_back(std::move(p));
    }
    return Adapters<T>(std::move(pieces), std::move(sp), in_local, out_local, state);
  };
  const ParamView& table = base_local.view(base_local.tok_embeddings);
  const ParamView& head = base_local.view(base_local.output);
  ops.embedding = std::make_unique<FrozenEmbedding<T>>(std::move(ops.embedding), state.get(),
                                                       base_local.tok_embeddings, table.shape[0],
                                                       table.shape[1]);
  ops.norm = std::make_unique<FrozenNorm<T>>(std::move(ops.norm));
  ops.head = std::make_unique<FrozenHead<T>>(std::move(ops.head), state.get(), base_local.output,
                                             head.shape[0], head.shape[1]);
  // Dropout's mask follows each token's row position through the chunked recomputation.
  ops.on_chunk = [state](int64_t first) { state->token_offset = first; };
  for (size_t i = 0; i < ops.blocks.size(); ++i) {
    BlockOps<T>& o = ops.blocks[i];
    const BlockParamIds& b = base_local.layers.at(i);
    const int layer = int(i);
    o.attention_norm = std::make_unique<FrozenNorm<T>>(std::move(o.attention_norm));
    o.ffn_norm = std::make_unique<FrozenNorm<T>>(std::move(o.ffn_norm));
    if (o.qk_norm) o.qk_norm->freeze();  // Qwen3's q/k norms: frozen like the other norms
    auto wrap = [&](std::unique_ptr<LinearOp<T>>& op, int view, int bias) {
      Adapters<T> a = adapters_of(layer, view, op->in(), op->out());
      FrozenLinear<T> frozen(std::move(op), state.get(), view, bias);
      op = std::make_unique<LoraLinear<T>>(std::move(frozen), std::move(a), state.get());
    };
    wrap(o.wqkv, b.wqkv, b.wqkv_bias);
    wrap(o.wo, b.wo, b.wo_bias);
    wrap(o.w2, b.w2, b.w2_bias);
    const int64_t F = o.gate_up->out(), H = o.wqkv->in();
    Adapters<T> a1 = adapters_of(layer, b.w1, H, F);
    Adapters<T> a3 = adapters_of(layer, b.w3, H, F);
    o.gate_up = std::make_unique<LoraGateUp<T>>(std::move(o.gate_up), std::move(a1), std::move(a3),
                                                state.get(),
                                                std::array<int, 4>{b.w1, b.w1_bias, b.w3, b.w3_bias}, H);
  }
}

template void lora_init_tensor<float>(float*, const ParamView&, int, uint64_t);
template void lora_init_tensor<double>(double*, const ParamView&, int, uint64_t);
template void lora_dropout_row<float>(float*, const float*, int64_t, uint64_t, int64_t, int64_t,
                                     double, bool);
template void lora_dropout_row<double>(double*, const double*, int64_t, uint64_t, int64_t, int64_t,
                                      double, bool);
template void apply_lora<float>(ModelOps<float>&, const ParamTable&, const std::vector<LoraModule>&,
                                const ParamTable&, std::shared_ptr<LoraState<float>>,
                                const std::function<LoraLinearSpec<float>(int, int)>&);
template void apply_lora<double>(ModelOps<double>&, const ParamTable&,
                                 const std::vector<LoraModule>&, const ParamTable&,
                                 std::shared_ptr<LoraState<double>>,
                                 const std::function<LoraLinearSpec<double>(int, int)>&);

}  // namespace longtron::model
