// The decoder's forward and backward over the ops of model/layers.h (docs/model.md; structure after llm.c).
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "model/saved.h"
#include "ops/compute_context.h"
#include "ops/for_blocks.h"
#include "ops/ops.h"
#include "ops/threads.h"

namespace longtron::model {
namespace {
using Sharing = ops::SharedRoundings::Sharing;

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

// accumulate, and out's bits (round_to_bf16) into out16 a block at a time while it is in cache:
// the bits a bf16 GEMM reading out next would round.
void accumulate_rounded(float* out, const float* a, int64_t n, uint16_t* out16) {
  for_blocks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) out[i] += a[i];
    ops::round_to_bf16_serial(out + begin, end - begin, out16 + begin);
  });
}

// The gated FFN's a and b from z: written by gate/up's GEMMs straight into their bf16 saves
// where the op can (returns true; va and vb untouched), else computed into va, vb as T.
template <typename T>
bool gate_up_forward(GateUpOp<T>& op, T* va, T* vb, const Saved<T>& a, const Saved<T>& b,
                     const T* z, int64_t N, const Params<T>& params) {
  if (a.b != nullptr && op.forward_out16(a.b, b.b, z, N, params)) return true;
  op.forward(va, vb, z, N, params);
  return false;
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
Decoder<T>::Decoder(const ParamTable& layout, const Params<T>& params)
    : Decoder(layout, params, make_dense_ops<T>(layout)) {}

template <typename T>
Decoder<T>::Decoder(const ParamTable& layout, const Params<T>& params, ModelOps<T> ops)
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
void Decoder<T>::set_checkpoint(bool on) {
  checkpoint_ = on;
}

template <typename T>
bool Decoder<T>::bf16_mode() const {
  return std::is_same_v<T, float> && ops_.compute->bf16();
}

template <typename T>
WorkspaceShape Decoder<T>::workspace_shape(int64_t N, bool want_all, bool bf16) const {
  const AttentionOp<T>& att = *ops_.blocks.front().attention;
  const QkNorm<T>* qk = ops_.blocks.front().qk_norm.get();
  // R: rows of the residual stream (N, or this rank's share under sequence parallel).
  const int64_t R = (N + ops_.residual_split - 1) / ops_.residual_split;
  WorkspaceShape shape{double(ops_.blocks.size()), double(N), double(R), double(H_), double(Q_),
                       double(F_), double(A_), double(att.saved_qkv_size(N)),
                       double(att.saved_lse_size(N)), want_all, bf16};
  if (qk != nullptr && N > 0)  // per token of the call (a layout may hold fewer qkv rows)
    shape.qk = double(qk->saved_size(N)) / double(N),
    shape.qk_heads = double(qk->rstd_size(N)) / double(N);
  return shape;
}

template <typename T>
void Decoder<T>::reserve(int64_t N, bool want_all, bool bf16) {
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
  s_ = Scratch{};
  T* p = arena_.data();
  uint16_t* p16 = arena16_.data();
  for (const WorkspaceBuffer& b : workspace_table(shape)) {
    bind(b, p, p16, N);
    if (b.bf16) p16 += static_cast<int64_t>(b.elements);
    else p += static_cast<int64_t>(b.elements);
  }
  if (bf16)  // both norms' rstd: recomputed in backward before each read
    for (BlockActs& a : acts_) a.rstd1 = a.rstd2 = rstd_scratch_;
  capacity_ = N;
  saved_all_ = want_all;
  bf16_ = bf16;
}

template <typename T>
void Decoder<T>::bind(const WorkspaceBuffer& b, T* at, uint16_t* at16, int64_t N) {
  using S = WorkspaceSlot;
  BlockActs& a = acts_[b.slot >= S::kQkvSaved && b.slot <= S::kQkRstd ? size_t(b.index) : 0];
  Scratch& s = s_;
  switch (b.slot) {
    case S::kInput: xs_[size_t(b.index)] = at; break;
    case S::kInput16: xs16_[size_t(b.index)] = at16; break;
    case S::kQkvSaved: a.qkv.f = at; break;
    case S::kAttn: a.attn.f = at; break;
    case S::kA: a.a.f = at; break;
    case S::kB: a.b.f = at; break;
    case S::kLse: a.lse = at; break;
    case S::kH: a.h.f = at; break;
    case S::kRstd1: a.rstd1 = at; break;
    case S::kRstd2: a.rstd2 = at; break;
    case S::kH16: a.h.b = at16; break;
    case S::kQkv16: a.qkv.b = at16; break;
    case S::kAttn16: a.attn.b = at16; break;
    case S::kA16: a.a.b = at16; break;
    case S::kB16: a.b.b = at16; break;
    case S::kQkIn: a.qk_in = at; break;
    case S::kQkRstd: a.qk_rstd = at; break;
    // The float layout's temporaries; a name shares a buffer where its life fits in a gap.
    case S::kXn: s.fwd.xn = s.ffn.z = s.att.xn = at; break;
    case S::kQkv: s.fwd.qkv = s.att.dqkv = at; break;
    case S::kTmp: s.fwd.tmp = at; break;
    case S::kG: s.fwd.g = s.ffn.g = at; break;
    case S::kXf: s.head.xf = at; break;
    case S::kRstdF: rstdf_ = at; break;
    case S::kRstdScratch: rstd_scratch_ = at; break;
    case S::kDres: s.dres = at; break;
    case S::kDtmp: s.ffn.dh = s.att.dx = at; break;
    case S::kDxn: s.head.dxf = s.ffn.dz = s.att.dxn = at; break;
    case S::kDg: s.ffn.dg = at; break;
    case S::kDa: s.ffn.da = at; break;
    case S::kDb: s.ffn.db = at; break;
    case S::kDattn: s.att.datt = at; break;
    case S::kDqkvSaved: s.att.dqs = at; break;
    case S::kPool: bind_pool(at, N); break;
    case S::kGemmIn16: s.in16 = at16; break;
    default: check(false, "internal: {} is not a buffer of the unchunked workspace", b.name);
  }
}

template <typename T>
void Decoder<T>::bind_pool(T* base, int64_t N) {
  const int64_t R = (N + ops_.residual_split - 1) / ops_.residual_split;
  const int64_t sq = ops_.blocks.front().attention->saved_qkv_size(N);
  const PoolSizes<int64_t> z = pool_sizes<int64_t>(R, N, H_, Q_, F_, A_, sq);
  Scratch& s = s_;
  s.dres = base;
  T* const after = base + z.rh;  // every phase's area after dres
  // Forward: xn (then the linears' output) | res | the norm's widened input, then qkv | qs | att,
  // or a | b (g over a).
  s.fwd.xn = s.fwd.tmp = after, s.fwd.res = after + z.rh;
  T* const zf = after + 2 * z.rh;
  s.fwd.wide = zf, s.fwd.qkv = zf, s.fwd.qs = zf + z.nq, s.fwd.att = zf + z.nq + z.sq;
  s.fwd.a = s.fwd.g = zf, s.fwd.b = zf + z.nf;
  s.head.xf = after, s.head.dxf = zf;  // res stays where the forward left it
  // FFN backward: g (then da, then h again) | dg (then db) | h widened (then dz) | z (then dh).
  s.ffn.g = s.ffn.da = s.ffn.h2 = after, s.ffn.dg = s.ffn.db = after + z.nf;
  s.ffn.h1 = s.ffn.dz = after + z.u(), s.ffn.z = s.ffn.dh = after + z.u() + z.rh;
  // Attention backward: dqkv | datt | att_w | qkv_w | dqs, then xw | xn (then dx) | dxn over
  // datt's place.
  s.att.dqkv = after;
  T* const za = after + z.nq;
  s.att.datt = za, s.att.att_w = za + z.na, s.att.qkv_w = za + 2 * z.na;
  s.att.dqs = za + 2 * z.na + z.sq;
  s.att.xw = za, s.att.xn = s.att.dx = za + z.rh, s.att.dxn = za + 2 * z.rh;
}

template <typename T>
void Decoder<T>::chunk_reserve(int64_t N, bool train) {
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
      case WorkspaceSlot::kChunkQkIn: ck_.qk_in.resize(n); break;
      case WorkspaceSlot::kChunkQkRstd: ck_.qk_rstd.resize(n); break;
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
std::vector<std::pair<WorkspaceSlot, int64_t>> Decoder<T>::chunk_buffers() const {
  using S = WorkspaceSlot;
  std::vector<std::pair<WorkspaceSlot, int64_t>> r;
  const auto add = [&](S slot, const auto& v) {
    if (!v.empty()) r.emplace_back(slot, int64_t(v.size() * sizeof(v.front())));
  };
  add(S::kChunkInputs, ck_.x), add(S::kChunkInputs16, ck_.x16), add(S::kChunkQkv, ck_.qkv);
  add(S::kChunkOut, ck_.out), add(S::kChunkOut16, ck_.out16), add(S::kChunkLse, ck_.lse);
  add(S::kChunkDout, ck_.dout), add(S::kChunkDres, ck_.dres), add(S::kChunkTemps, ck_.c);
  add(S::kChunkTemps16, ck_.c16), add(S::kChunkQkIn, ck_.qk_in);
  add(S::kChunkQkRstd, ck_.qk_rstd);
  return r;
}

template <typename T>
void Decoder<T>::chunk_load(int64_t slot, int64_t n0, int64_t n, T* dst) const {
  const int64_t off = (slot * ck_.N + n0) * H_;
  if constexpr (std::is_same_v<T, float>) {
    if (ck_.bf16) return ops::widen_bf16(ck_.x16.data() + off, n * H_, dst);
  }
  std::copy(ck_.x.data() + off, ck_.x.data() + off + n * H_, dst);
}

template <typename T>
void Decoder<T>::chunk_store(int64_t slot, int64_t n0, int64_t n, T* src) {
  const int64_t off = (slot * ck_.N + n0) * H_;
  // The forward reads the block input as stored: under bf16 the residual stream is rounded here.
  if (ck_.bf16) return keep_rounded(src, n * H_, ck_.x16.data() + off);
  std::copy(src, src + n * H_, ck_.x.data() + off);
}

template <typename T>
ops::SharedRoundings::Sharing Decoder<T>::share_out(int64_t n0, int64_t n) const {
  return ck_.bf16 ? share_bits(ck_.ow, n * A_, ck_.out16.data() + n0 * A_) : Sharing{};
}

template <typename T>
void Decoder<T>::chunk_attention(int layer, int64_t slot, const AttentionBatch& ab) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  const int64_t N = ab.num_tokens, C = ck_.C;
  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t n = std::min(C, N - n0);
    at_chunk(n0);
    chunk_load(slot, n0, n, ck_.xw);
    o.attention_norm->forward(ck_.xn, ck_.rstd, ck_.xw, n, params_);
    o.wqkv->forward(ck_.qkv.data() + n0 * Q_, ck_.xn, n, params_);
    if (o.qk_norm)
      o.qk_norm->forward(ck_.qkv.data() + n0 * Q_, ck_.qk_in.data() + o.qk_norm->saved_size(n0),
                         ck_.qk_rstd.data() + o.qk_norm->rstd_size(n0), n, params_);
  }
  // Under bf16, wo's GEMM and the attention backward's D read the output rounded to bf16 (as
  // saved by the unchunked bf16 path), so it is kept so.
  if (ck_.bf16)
    o.attention->forward_bf16_out(ck_.out16.data(), ck_.qkv.data(), nullptr, ck_.lse.data(),
                                  ck_.qkv.data(), ab);
  else
    o.attention->forward(ck_.out.data(), ck_.qkv.data(), ck_.lse.data(), ck_.qkv.data(), ab);
}

template <typename T>
void Decoder<T>::chunk_tail(int layer, int64_t slot, int64_t n0, int64_t n, bool output) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  at_chunk(n0);  // also for the FFN and wo backward that follow in the backward pass
  chunk_load(slot, n0, n, ck_.xw);
  if constexpr (std::is_same_v<T, float>) {
    if (ck_.bf16) ops::widen_bf16(ck_.out16.data() + n0 * A_, n * A_, ck_.ow);
  }
  {
    const auto bits = share_out(n0, n);
    o.wo->forward(ck_.t, chunk_out(n0), n, params_);
  }
  add_into(ck_.h, ck_.xw, ck_.t, n * H_);  // h = x + wo(attn)
  // As the unchunked path: the FFN's norm reads h as saved (under bf16 rounded, through a16's
  // place before a is kept there), a and b are saved.
  const Saved<T> hs = ck_.bf16 ? Saved<T>{nullptr, ck_.a16} : Saved<T>{ck_.h, nullptr};
  ck_.hn = hs.save_load(ck_.h, n * H_, ck_.hw);
  o.ffn_norm->forward(ck_.xn, ck_.rstd, ck_.hn, n, params_);
  const Saved<T> a = chunk_a(), b = chunk_b();
  const bool saved = gate_up_forward(*o.gate_up, ck_.g1, ck_.g2, a, b, ck_.xn, n, params_);
  const int64_t nf = n * F_;
  if (!output) {
    if (!saved) a.save(ck_.g1, nf), b.save(ck_.g2, nf);
    return;
  }
  if (saved) swiglu_saved(ck_.g3, a, b, nf);
  else swiglu_saving(ck_.g3, ck_.g1, ck_.g2, a, b, nf);
  o.w2->forward(ck_.t, ck_.g3, n, params_);
  accumulate(ck_.h, ck_.t, n * H_);  // y = h + w2(g)
}

template <typename T>
LossSum Decoder<T>::chunked_pass(const data::MicroBatch& batch, Params<T>* grads,
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
      // FFN: y = h + w2(silu(a) ⊙ b); g, then da, in g3; dg, then db, in g4.
      const Saved<T> a = chunk_a(), b = chunk_b();
      swiglu_saved(ck_.g3, a, b, nf);
      o.w2->backward(ck_.g4, dr, ck_.g3, n, params_, grads, false);
      swiglu_backward_saved(ck_.g3, ck_.g4, ck_.g4, a, b, nf);
      o.gate_up->backward(ck_.t, ck_.g3, ck_.g4, ck_.xn, n, params_, grads);
      o.ffn_norm->backward(ck_.xn, ck_.t, ck_.hn, ck_.rstd, n, params_, grads);
      accumulate(dr, ck_.xn, n * H_);  // dres = dL/dh
      const auto bits = share_out(n0, n);
      o.wo->backward(dout + n0 * A_, dr, chunk_out(n0), n, params_, grads, false);
    }
    backward_point(i, false);
    // In place: qkv becomes dqkv (ModelOps::token_chunks).
    if (ck_.bf16)
      o.attention->backward_bf16_out(qkv, nullptr, qkv, dout, qkv, ck_.out16.data(),
                                     ck_.lse.data(), ab);
    else
      o.attention->backward(qkv, qkv, dout, qkv, ck_.out.data(), ck_.lse.data(), ab);
    for (int64_t n0 = 0; n0 < N; n0 += C) {
      const int64_t n = std::min(C, N - n0);
      T* const dr = dres + n0 * H_;
      at_chunk(n0);
      chunk_load(i, n0, n, ck_.xw);
      o.attention_norm->forward(ck_.xn, ck_.rstd, ck_.xw, n, params_);
      if (o.qk_norm)
        o.qk_norm->backward(qkv + n0 * Q_, ck_.qk_in.data() + o.qk_norm->saved_size(n0),
                            ck_.qk_rstd.data() + o.qk_norm->rstd_size(n0), n, params_, grads);
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
AttentionBatch Decoder<T>::attention_batch(const data::MicroBatch& b) const {
  return AttentionBatch{b.indexes.data(), b.cu_seqlens.data(),
                        static_cast<int64_t>(b.cu_seqlens.size()) - 1,
                        static_cast<int64_t>(b.input_ids.size())};
}

template <typename T>
typename Decoder<T>::BlockActs& Decoder<T>::acts(int layer, bool save) {
  return (save && saved_all_) ? acts_[static_cast<size_t>(layer)] : acts_.front();
}

template <typename T>
ops::SharedRoundings::Sharing Decoder<T>::share_bits(const T* v, int64_t n,
                                                       const uint16_t* bits) const {
  if constexpr (std::is_same_v<T, float>) return ops_.compute->shared().share(v, n, bits);
  (void)v, (void)n, (void)bits;
  return {};
}

template <typename T>
ops::SharedRoundings::Sharing Decoder<T>::share_in16(const T* v, int64_t n) const {
  return share_bits(v, n, s_.in16);
}

template <typename T>
ops::SharedRoundings::Sharing Decoder<T>::norm_for_gemm(NormOp<T>& norm, T* out, T* rstd,
                                                          const T* x, int64_t N) {
  if (!bf16_ || s_.in16 == nullptr) return norm.forward(out, rstd, x, N, params_), Sharing{};
  const bool rounded = norm.forward_rounded(out, s_.in16, rstd, x, N, params_);
  return rounded ? share_in16(out, N * H_) : Sharing{};
}

template <typename T>
ops::SharedRoundings::Sharing Decoder<T>::accumulate_for_gemm(T* dres, const T* d, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    // Split residual rows: the GEMM reads a gathered copy, not dres.
    if (bf16_ && s_.in16 != nullptr && ops_.residual_split == 1) {
      accumulate_rounded(dres, d, n, s_.in16);
      return share_in16(dres, n);
    }
  }
  accumulate(dres, d, n);
  return {};
}

template <typename T>
bool Decoder<T>::output_bits_only(const BlockOps<T>& o, const BlockActs& A) const {
  return A.attn.b != nullptr && A.qkv.b != nullptr && o.attention->keeps_bf16_out() &&
         o.wo->reads_shared_input_bits_only(*ops_.compute);
}

template <typename T>
ops::SharedRoundings::Sharing Decoder<T>::swiglu_for_gemm(T* g, const BlockActs& A, int64_t n,
                                                            const LinearOp<T>& w2, const T* a,
                                                            const T* b) {
  uint16_t* const g16 = bf16_ ? s_.in16 : nullptr;
  if (a != nullptr)
    return swiglu_saving(g, a, b, A.a, A.b, n, g16) ? share_in16(g, n) : Sharing{};
  // g's floats are left unwritten where its bits are all its reader takes.
  const bool bits_only =
      g16 != nullptr && A.a.b != nullptr && w2.reads_shared_input_bits_only(*ops_.compute);
  return swiglu_saved(bits_only ? nullptr : g, A.a, A.b, n, g16) ? share_in16(g, n) : Sharing{};
}

template <typename T>
void Decoder<T>::block_forward(int layer, BlockActs& A, const T* x, T* y,
                                 const AttentionBatch& ab) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  const typename Scratch::Fwd& s = s_.fwd;
  const int64_t N = ab.num_tokens;
  const int64_t R = N / ops_.residual_split;  // residual-stream rows
  const int64_t sq = o.attention->saved_qkv_size(N);
  {
    const auto bits = norm_for_gemm(*o.attention_norm, s.xn, A.rstd1, x, N);
    o.wqkv->forward(s.qkv, s.xn, N, params_);
  }
  if (o.qk_norm) o.qk_norm->forward(s.qkv, A.qk_in, A.qk_rstd, N, params_);
  T* const qs = A.qkv.out(s.qs);
  T* const att = A.attn.out(s.att);
  // Saved in bf16: the attention writes the bits of its split q, k, v as it splits them, and
  // where it can, its output as bits alone (att's floats are then never written).
  const bool att16 = output_bits_only(o, A);
  bool saved = false;
  if (att16) {
    o.attention->forward_bf16_out(A.attn.b, qs, A.qkv.b, A.lse, s.qkv, ab);
    saved = true;
  } else {
    if (A.qkv.b != nullptr)
      saved = o.attention->forward_rounded(att, qs, A.qkv.b, A.lse, s.qkv, ab);
    else
      o.attention->forward(att, qs, A.lse, s.qkv, ab);
    A.attn.save(att, N * A_);
  }
  if (!saved) A.qkv.save(qs, sq);
  {
    const auto bits = share_saved(*ops_.compute, A.attn, att, N * A_);  // wo reads them
    o.wo->forward(s.tmp, att, N, params_);
  }
  // h = x + wo(attn), kept unrounded for the residual sum; the FFN's norm reads it as saved
  // (under bf16 rounded and widened), so backward recomputes exactly the forward's z and rstd.
  T* const h = A.h.out(y);
  add_into(h, x, s.tmp, R * H_);
  T* const a = A.a.out(s.a);
  T* const b = A.b.out(s.b);
  bool in_saves = false;  // a and b written into their saves by the GEMMs
  {
    const T* const hs = A.h.save_load(h, R * H_, s.wide);
    const auto bits = norm_for_gemm(*o.ffn_norm, s.xn, A.rstd2, hs, N);
    in_saves = gate_up_forward(*o.gate_up, a, b, A.a, A.b, s.xn, N, params_);
  }
  {
    // g from the saves; with a and b in fp32, saves them in the same pass.
    const auto bits = in_saves ? swiglu_for_gemm(s.g, A, N * F_, *o.w2)
                               : swiglu_for_gemm(s.g, A, N * F_, *o.w2, a, b);
    o.w2->forward(s.tmp, s.g, N, params_);
  }
  add_into(y, h, s.tmp, R * H_);  // y = h + w2(g)
}

template <typename T>
void Decoder<T>::block_backward(int layer, BlockActs& A, const Saved<T>& x,
                                  const AttentionBatch& ab, Params<T>& grads) {
  BlockOps<T>& o = ops_.blocks[static_cast<size_t>(layer)];
  T* const dres = s_.dres;
  const int64_t N = ab.num_tokens;
  const int64_t R = N / ops_.residual_split;  // residual-stream rows
  // FFN branch: y = h + w2(silu(a) ⊙ b), a = w1 z, b = w3 z, z = RMSNorm(h). g and z are cheap
  // elementwise recomputations rather than saved tensors.
  const typename Scratch::Ffn& f = s_.ffn;
  {
    const auto bits = swiglu_for_gemm(f.g, A, N * F_, *o.w2);
    o.w2->backward(f.dg, dres, f.g, N, params_, &grads, false);
  }
  // Under bf16 the saves of a and b take the bits of da and db for gate/up's GEMMs.
  const bool spent = swiglu_backward_saved(f.da, f.db, f.dg, A.a, A.b, N * F_, bf16_);
  {
    const auto da16 = spent ? share_saved(*ops_.compute, A.a, f.da, N * F_) : Sharing{};
    const auto db16 = spent ? share_saved(*ops_.compute, A.b, f.db, N * F_) : Sharing{};
    const auto bits = norm_for_gemm(*o.ffn_norm, f.z, rstd_scratch_, A.h.load(R * H_, f.h1), N);
    o.gate_up->backward(f.dz, f.da, f.db, f.z, N, params_, &grads);
  }
  o.ffn_norm->backward(f.dh, f.dz, A.h.load(R * H_, f.h2), A.rstd2, N, params_, &grads);
  // Attention branch: h = x + wo(Attn(qkv)), qkv = wqkv(RMSNorm(x)).
  const typename Scratch::Att& t = s_.att;
  const bool att16 = output_bits_only(o, A);  // as the forward saved it
  const T* att = nullptr;
  const T* qs = nullptr;
  {
    const auto dy = accumulate_for_gemm(dres, f.dh, R * H_);  // dres = dL/dh: wo's dy
    backward_point(layer, false);  // reduces gradients: dres and its bits stay as they are
    // Bits alone: wo and the attention read them, so att names them without being widened.
    att = att16 ? t.att_w : A.attn.load(N * A_, t.att_w);
    qs = A.qkv.load(o.attention->saved_qkv_size(N), t.qkv_w);
    const auto bits = share_saved(*ops_.compute, A.attn, att, N * A_);
    o.wo->backward(t.datt, dres, att, N, params_, &grads, false);
  }
  // Under bf16 the bits of dqkv go over the save of q, k, v (read above: spent) for wqkv's GEMMs,
  // where that save holds as many elements as dqkv (the dense op's [N, Q]).
  // Not with q/k norms: their backward rewrites dqkv after the attention's.
  uint16_t* const dqkv16 =
      bf16_ && !o.qk_norm && o.attention->saved_qkv_size(N) == N * Q_ ? A.qkv.b : nullptr;
  bool rounded = false;
  if (att16)
    rounded = o.attention->backward_bf16_out(t.dqkv, dqkv16, t.dqs, t.datt, qs, A.attn.b, A.lse,
                                             ab);
  else if (dqkv16 != nullptr)
    rounded = o.attention->backward_rounded(t.dqkv, dqkv16, t.dqs, t.datt, qs, att, A.lse, ab);
  else
    o.attention->backward(t.dqkv, t.dqs, t.datt, qs, att, A.lse, ab);
  if (o.qk_norm) o.qk_norm->backward(t.dqkv, A.qk_in, A.qk_rstd, N, params_, &grads);
  const T* const xv = x.load(R * H_, t.xw);
  {
    const auto dy = rounded ? share_bits(t.dqkv, N * Q_, dqkv16) : Sharing{};
    const auto bits = norm_for_gemm(*o.attention_norm, t.xn, rstd_scratch_, xv, N);
    o.wqkv->backward(t.dxn, t.dqkv, t.xn, N, params_, &grads, false);
  }
  o.attention_norm->backward(t.dx, t.dxn, xv, A.rstd1, N, params_, &grads);
  accumulate(dres, t.dx, R * H_);  // dres = dL/dx
}

template <typename T>
void Decoder<T>::forward_blocks(const data::MicroBatch& batch, bool save) {
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  // Training keeps every block's acts unless checkpointing; a forward-only call keeps whatever
  // layout exists, or the compact one.
  const bool bf16 = bf16_mode();
  if (save) reserve(N, !checkpoint_, bf16);
  else if (N > capacity_ || bf16 != bf16_) reserve(N, capacity_ > 0 && saved_all_, bf16);
  const AttentionBatch ab = attention_batch(batch);
  const int L = static_cast<int>(ops_.blocks.size());
  const int64_t RH = N / ops_.residual_split * H_;
  T* const res = s_.fwd.res;
  ops_.embedding->forward(bf16_ ? res : xs_[0], batch.input_ids.data(), N, params_);
  for (int i = 0; i < L; ++i) {
    const auto l = static_cast<size_t>(i);
    if (!bf16_) {
      block_forward(i, acts(i, save), xs_[l], xs_[l + 1], ab);
      continue;
    }
    // The stream continues from the block input rounded to bf16, so the input kept for
    // backward is exactly what the forward read: in bf16 with per-block acts; under checkpoint
    // in fp32 (the recomputation's start; rounded through xn's place, free until the block's
    // first norm), which a forward-only call, never recomputing, does not keep.
    const bool kept16 = !xs16_.empty();
    keep_rounded(res, RH, kept16 ? xs16_[l] : reinterpret_cast<uint16_t*>(s_.fwd.xn));
    if (save && !kept16) std::copy(res, res + RH, xs_[l]);
    block_forward(i, acts(i, save), res, res, ab);
  }
}

template <typename T>
LossSum Decoder<T>::head_pass(const data::MicroBatch& batch, int64_t N, Params<T>& grads,
                              double loss_scale) {
  HeadLossOp<T>& head = *ops_.head;
  if (!token_weights_)
    return head.forward_backward(s_.head.dxf, s_.head.xf, batch.labels.data(), N, params_, &grads,
                                 loss_scale, nullptr);
  check(head.supports_token_scale(),
        "per-token loss weights (preference training) are not supported by this layout's head");
  // Pass 1: every token's loss, so that the weights can depend on whole sequences.
  token_losses_.assign(static_cast<size_t>(N), 0.0);
  const LossSum loss = head.forward_backward(nullptr, s_.head.xf, batch.labels.data(), N, params_,
                                             nullptr, 0.0, token_losses_.data());
  token_weights_(token_losses_, token_scale_);
  check(token_scale_.size() == static_cast<size_t>(N), "token weights: {} for {} tokens",
        token_scale_.size(), N);
  // Pass 2: the backward with one factor per token.
  head.set_token_scale(token_scale_.data());
  try {
    head.forward_backward(s_.head.dxf, s_.head.xf, batch.labels.data(), N, params_, &grads,
                          loss_scale, nullptr);
  } catch (...) {
    head.set_token_scale(nullptr);
    throw;
  }
  head.set_token_scale(nullptr);
  return loss;
}

template <typename T>
LossSum Decoder<T>::forward_backward(const data::MicroBatch& batch, Params<T>& grads,
                                       double loss_scale) {
  check_batch(batch, ops_.sequence_parallel_size);
  check(&grads.layout() == &layout_ || grads.numel() == layout_.numel(),
        "gradient buffer has {} elements, the model {}", grads.numel(), layout_.numel());
  check(!token_weights_ || !chunked(),
        "per-token loss weights (preference training) need model.checkpoint = false");
  if (chunked()) return chunked_pass(batch, &grads, loss_scale, nullptr);
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  const int L = static_cast<int>(ops_.blocks.size());
  forward_blocks(batch, true);
  const AttentionBatch ab = attention_batch(batch);
  ops_.norm->forward(s_.head.xf, rstdf_, final_residual(), N, params_);
  const LossSum loss = head_pass(batch, N, grads, loss_scale);
  ops_.norm->backward(s_.dres, s_.head.dxf, final_residual(), rstdf_, N, params_, &grads);
  backward_point(L, true);
  const int64_t RH = N / ops_.residual_split * H_;
  for (int i = L - 1; i >= 0; --i) {
    const Saved<T> x = saved_input(i);
    // Checkpoint: recompute the block from its saved input (the shared acts still hold the last
    // block's); its output is not needed: the float layout writes it to a free temporary, the
    // bf16 layout runs on the stream, in place, from the input's fp32 copy.
    if (checkpoint_ && i != L - 1) {
      if (bf16_) {
        std::copy(x.f, x.f + RH, s_.fwd.res);
        block_forward(i, acts_.front(), s_.fwd.res, s_.fwd.res, ab);
      } else {
        block_forward(i, acts_.front(), x.f, s_.ffn.dh, ab);
      }
    }
    block_backward(i, acts(i, true), x, ab, grads);
    backward_point(i, true);
  }
  ops_.embedding->backward(s_.dres, batch.input_ids.data(), N, &grads);
  backward_point(-1, true);
  return loss;
}

template <typename T>
LossSum Decoder<T>::forward_loss(const data::MicroBatch& batch,
                                   std::vector<double>* token_losses) {
  check_batch(batch, ops_.sequence_parallel_size);
  if (chunked()) {
    if (token_losses)
      token_losses->assign(batch.input_ids.size(), 0.0);
    return chunked_pass(batch, nullptr, 0.0, token_losses ? token_losses->data() : nullptr);
  }
  const int64_t N = static_cast<int64_t>(batch.input_ids.size());
  forward_blocks(batch, false);
  T* const xf = s_.head.xf;
  ops_.norm->forward(xf, rstdf_, final_residual(), N, params_);
  if (token_losses) token_losses->assign(static_cast<size_t>(N), 0.0);
  return ops_.head->forward_backward(nullptr, xf, batch.labels.data(), N, params_, nullptr, 0.0,
                                     token_losses ? token_losses->data() : nullptr);
}

template <typename T>
std::vector<T> Decoder<T>::logits_last(std::span<const int32_t> ids) {
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
  T* const xf = s_.head.xf;
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
    cost.windowed = static_cast<double>(c.windowed_layers()) / static_cast<double>(c.num_layers);
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

template class Decoder<float>;
template class Decoder<double>;

}  // namespace longtron::model
