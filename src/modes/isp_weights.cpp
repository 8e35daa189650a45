// ISP weight parallel (see isp_weights.h).
#include "modes/isp_weights.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"
#include "ops/vocab_check.h"

namespace longtron::parallel {

// ---- IspWeightStore ------------------------------------------------------------------------------

IspWeightStore::IspWeightStore(comm::CommPtr weight, bool overlap, const ops::ComputeContext& cc)
    : cc_(cc), comm_(std::move(weight)), W_(comm_->size()), rank_(comm_->rank()),
      overlap_(overlap) {}

IspWeightStore::~IspWeightStore() {
  // A prefetch still in flight must finish before its buffer goes away (Work waits in its
  // destructor, but members are destroyed after this body: wait explicitly, in a fixed order).
  next_.work.wait();
  current_.work.wait();
}

int IspWeightStore::add(int view, int64_t rows, int64_t cols, int dim) {
  check(dim == 0 || dim == 1, "ISP: a weight is sharded on dim 0 or 1, not {}", dim);
  Entry e{view, rows, cols, dim, {}, 0};
  for (int r = 0; r < W_; ++r) {
    if (dim == 0) {
      e.counts.push_back(shard_range(rows, W_, r).count * cols);
    } else {  // the embedding: W divides its hidden columns (validate_isp_sizes)
      e.counts.push_back(rows * (cols / W_));
    }
    e.max_count = std::max(e.max_count, e.counts.back());
  }
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

int IspWeightStore::add(const model::Params<float>* source, int view, int64_t rows, int64_t cols,
                        int dim) {
  const int id = add(view, rows, cols, dim);
  entries_.back().source = source;
  return id;
}

Range IspWeightStore::shard(int id) const {
  const Entry& e = entries_.at(static_cast<size_t>(id));
  return shard_range(e.dim == 0 ? e.rows : e.cols, W_, rank_);
}

float* IspWeightStore::grad_scratch(int64_t n) {
  if (static_cast<int64_t>(grad_.size()) < n) grad_.resize(static_cast<size_t>(n));
  return grad_.data();
}

void IspWeightStore::start_gather(Slot& slot, int id, bool bf16,
                                  const model::Params<float>& params) {
  const Entry& e = entries_[static_cast<size_t>(id)];
  slot.id = id;
  slot.bf16 = bf16;
  slot.buf.resize(static_cast<size_t>(W_ * e.max_count) * (bf16 ? sizeof(uint16_t) : sizeof(float)));
  const float* shard = (e.source != nullptr ? *e.source : params).ptr(e.view);
  const int64_t mine = e.counts[static_cast<size_t>(rank_)];
  if (bf16) {
    auto* recv = reinterpret_cast<uint16_t*>(slot.buf.data());
    // The step's bf16 copy of this shard (rounded once a step). It stays unchanged while the
    // gather is in flight: only the optimizer step invalidates it, between passes, and begin_pass
    // waits for every gather first.
    const uint16_t* step = cc_.weights().of(shard, mine);
    if (step != nullptr && mine == e.max_count) {
      slot.work = comm_->all_gather_async(recv, step, e.max_count);
      return;
    }
    uint16_t* own = recv + rank_ * e.max_count;  // rounded here, or padded: sent in place
    if (step != nullptr)
      std::copy(step, step + mine, own);
    else
      ops::round_to_bf16(shard, mine, own);
    std::fill(own + mine, own + e.max_count, uint16_t{0});
    slot.work = comm_->all_gather_async(recv, own, e.max_count);
    return;
  }
  auto* recv = reinterpret_cast<float*>(slot.buf.data());
  if (mine == e.max_count) {
    slot.work = comm_->all_gather_async(recv, shard, e.max_count);
  } else {  // uneven rows: a padded chunk, sent in place
    float* own = recv + rank_ * e.max_count;
    std::copy(shard, shard + mine, own);
    std::fill(own + mine, own + e.max_count, 0.f);
    slot.work = comm_->all_gather_async(recv, own, e.max_count);
  }
}

void IspWeightStore::finish_gather(Slot& slot) {
  if (!slot.work.pending()) return;
  slot.work.wait();
  const Entry& e = entries_[static_cast<size_t>(slot.id)];
  // Uneven rows: move chunk j from j·max_count down to its packed offset (never moves upward).
  const size_t elem = slot.bf16 ? sizeof(uint16_t) : sizeof(float);
  int64_t offset = e.counts[0];
  for (int j = 1; j < W_; ++j) {
    const int64_t c = e.counts[static_cast<size_t>(j)];
    if (offset != j * e.max_count)
      std::memmove(slot.buf.data() + static_cast<size_t>(offset) * elem,
                   slot.buf.data() + static_cast<size_t>(j * e.max_count) * elem,
                   static_cast<size_t>(c) * elem);
    offset += c;
  }
}

void IspWeightStore::begin_pass() {
  // The one call-order rule of the store: the embedding (which calls this) is the first op of
  // every pass. A pass that gathered for a backward ends with a backward gather (a recomputed
  // forward is followed by its backward), so a forward gather since then came from an op that ran
  // before the embedding of this pass, and read a copy from before the optimizer step.
  check(!forward_after_backward_,
        "ISP: a weight was gathered for a forward after the last pass's backward and before the "
        "embedding began the next pass (the embedding must be the first op of every pass: its "
        "forward drops the gathered copies an optimizer step made stale)");
  backward_seen_ = false;
  current_.work.wait();  // parameters may have changed: no gathered copy survives the pass
  current_.id = -1;
  next_.work.wait();  // a prefetch from the last pass may hold old values
  next_.id = -1;
  if (recording_ && !trace_.empty()) recording_ = false;
  pos_ = 0;
}

IspWeightStore::Slot& IspWeightStore::acquire_slot(const Key& key,
                                                   const model::Params<float>& params) {
  // A prefetch reads its shard from the entry's own source or, for the ops' weights, from the
  // Params the ops last passed (this call's may be another table's: the adapters').
  if (entries_.at(static_cast<size_t>(key.id)).source == nullptr) ops_params_ = &params;
  if (key.use == WeightUse::kBackward) backward_seen_ = true;
  forward_after_backward_ = backward_seen_ && key.use == WeightUse::kForward;
  if (recording_) {
    trace_.push_back(key);
  } else if (pos_ < trace_.size() && trace_[pos_] == key) {
    ++pos_;
  } else {  // this pass differs from the last one: record it from here on
    trace_.resize(pos_);
    trace_.push_back(key);
    recording_ = true;
  }

  // A slot holds a weight in one precision: (id, bf16) is what a gather made.
  auto holds = [](const Slot& s, int id, bool bf16) { return s.id == id && s.bf16 == bf16; };
  if (!holds(current_, key.id, key.bf16)) {
    if (holds(next_, key.id, key.bf16)) {
      std::swap(current_, next_);
      ++used_;
    } else {
      next_.work.wait();  // a wrong guess: finish it (every rank guessed the same) and drop it
      next_.id = -1;
      start_gather(current_, key.id, key.bf16, params);
    }
    next_.id = -1;
    finish_gather(current_);
  }
  if (overlap_ && !recording_ && pos_ < trace_.size()) {
    const Key& predicted = trace_[pos_];
    if (!holds(current_, predicted.id, predicted.bf16) &&
        !holds(next_, predicted.id, predicted.bf16)) {
      next_.work.wait();  // never refill a buffer a gather still writes
      start_gather(next_, predicted.id, predicted.bf16, ops_params_ ? *ops_params_ : params);
      ++started_;
    }
  }
  return current_;
}

const float* IspWeightStore::acquire(int id, WeightUse use, const model::Params<float>& params) {
  return reinterpret_cast<const float*>(acquire_slot({id, use, false}, params).buf.data());
}

const uint16_t* IspWeightStore::acquire_bf16(int id, WeightUse use,
                                             const model::Params<float>& params) {
  check(entries_.at(static_cast<size_t>(id)).dim == 0,
        "ISP: only weights sharded on dim 0 are gathered in bf16 (tensor {})", id);
  return reinterpret_cast<const uint16_t*>(acquire_slot({id, use, true}, params).buf.data());
}

void IspWeightStore::reduce_grad(float* grad_shard, float* full_grad, int id) {
  const Entry& e = entries_.at(static_cast<size_t>(id));
  const int64_t mine = e.counts[static_cast<size_t>(rank_)];
  const float* send = full_grad;
  bool uniform = true;
  for (int64_t c : e.counts) uniform = uniform && c == e.max_count;
  if (!uniform) {  // pad chunk j (rows of rank j) to max_count
    send_.assign(static_cast<size_t>(W_ * e.max_count), 0.f);
    int64_t offset = 0;
    for (int j = 0; j < W_; ++j) {
      const int64_t c = e.counts[static_cast<size_t>(j)];
      std::copy(full_grad + offset, full_grad + offset + c, send_.data() + j * e.max_count);
      offset += c;
    }
    send = send_.data();
  }
  recv_.resize(static_cast<size_t>(e.max_count));
  comm_->reduce_scatter(recv_.data(), send, e.max_count);
  for (int64_t i = 0; i < mine; ++i) grad_shard[i] += recv_[static_cast<size_t>(i)];
}

// ---- IspLinear -----------------------------------------------------------------------------------

IspLinear::IspLinear(std::shared_ptr<IspWeightStore> store, int weight_view, int bias_view,
                     int64_t out, int64_t in)
    : store_(std::move(store)), weight_view_(weight_view), bias_view_(bias_view), out_(out),
      in_(in) {
  id_ = store_->add(weight_view, out, in, 0);
}

// Under bf16 the linears and the head read their weight as gathered bf16 (isp_weights.h).
void IspLinear::forward(float* y, const float* x, int64_t N, const model::Params<float>& p) {
  const ops::ComputeContext& cc = store_->compute();
  if (cc.bf16()) {
    const uint16_t* W16 = store_->acquire_bf16(id_, WeightUse::kForward, p);
    const uint16_t* x16 = ops::bf16_operand(cc, x, N * in_);
    return ops::linear_forward_bf16(y, x16, W16, p.ptr(bias_view_), N, in_, out_);
  }
  const float* W = store_->acquire(id_, WeightUse::kForward, p);
  ops::linear_forward(cc, y, x, W, p.ptr(bias_view_), N, in_, out_);
}

bool IspLinear::forward_out16(uint16_t* y16, const float* x, int64_t N,
                              const model::Params<float>& p) {
  const ops::ComputeContext& cc = store_->compute();
  if (!cc.bf16() || p.ptr(bias_view_) != nullptr) return false;  // the bias is added in fp32
  const uint16_t* W16 = store_->acquire_bf16(id_, WeightUse::kForward, p);
  const uint16_t* x16 = ops::bf16_operand(cc, x, N * in_);
  ops::gemm_bf16_out16(false, true, N, out_, in_, x16, W16, y16);
  return true;
}

void IspLinear::backward(float* dx, const float* dy, const float* x, int64_t N,
                         const model::Params<float>& p, model::Params<float>* g,
                         bool accumulate_dx) {
  // dW into the gathered-form scratch (overwritten, then reduce-scattered onto the shard); the
  // replicated bias gets the partial sum over this rank's tokens (the engine sums it).
  const float beta = accumulate_dx ? 1.f : 0.f;
  const ops::ComputeContext& cc = store_->compute();
  const bool bf16 = cc.bf16();
  const uint16_t* W16 = bf16 ? store_->acquire_bf16(id_, WeightUse::kBackward, p) : nullptr;
  const float* W = bf16 ? nullptr : store_->acquire(id_, WeightUse::kBackward, p);
  float* G = g ? store_->grad_scratch(out_ * in_) : nullptr;
  float* dbias = g ? g->ptr(bias_view_) : nullptr;
  if (bf16) ops::linear_backward_bf16(cc, dx, G, dbias, dy, x, W16, N, in_, out_, beta, 0.f);
  else ops::linear_backward(cc, dx, G, dbias, dy, x, W, N, in_, out_, beta, 0.f);
  if (G) store_->reduce_grad(g->ptr(weight_view_), G, id_);
}

// ---- IspEmbedding --------------------------------------------------------------------------------

IspEmbedding::IspEmbedding(std::shared_ptr<IspWeightStore> store, int table_view, int64_t V,
                           int64_t H, int dim)
    : store_(std::move(store)), view_(table_view), dim_(dim), V_(V), H_(H) {
  id_ = store_->add(table_view, V, H, dim);
  Hl_ = dim == 1 ? H / store_->weight_size() : H;
}

void IspEmbedding::forward(float* x, const int32_t* ids, int64_t N,
                           const model::Params<float>& p) {
  ops::check_token_ids(ids, N, V_);
  store_->begin_pass();  // the embedding is the first op of every pass (checked there)
  const float* table = store_->acquire(id_, WeightUse::kForward, p);  // dim 1: [W][V][H/W]
  if (dim_ == 0) return ops::embedding_forward(x, ids, table, N, H_);  // [V, H]
  const int W = store_->weight_size();
#pragma omp parallel for schedule(static) if (N * H_ > kParallelMinWorkLarge)
  for (int64_t n = 0; n < N; ++n)
    for (int j = 0; j < W; ++j) {
      const float* src = table + (j * V_ + ids[n]) * Hl_;
      std::copy(src, src + Hl_, x + n * H_ + j * Hl_);
    }
}

void IspEmbedding::backward(const float* dx, const int32_t* ids, int64_t N,
                            model::Params<float>* g) {
  if (!g) return;
  const int W = store_->weight_size();
  float* G = store_->grad_scratch(V_ * H_);  // the gathered form, this rank's tokens only
  std::fill(G, G + V_ * H_, 0.f);
  if (dim_ == 0) {
    ops::embedding_backward(G, dx, ids, N, H_);
  } else {
    for (int64_t n = 0; n < N; ++n)
      for (int j = 0; j < W; ++j) {
        float* dst = G + (j * V_ + ids[n]) * Hl_;
        const float* src = dx + n * H_ + j * Hl_;
        for (int64_t c = 0; c < Hl_; ++c) dst[c] += src[c];
      }
  }
  store_->reduce_grad(g->ptr(view_), G, id_);
}

// ---- IspHeadLoss ---------------------------------------------------------------------------------

IspHeadLoss::IspHeadLoss(std::shared_ptr<IspWeightStore> store, int weight_view, int64_t V,
                         int64_t H, comm::CommPtr tensor)
    : store_(std::move(store)), tensor_(std::move(tensor)), view_(weight_view), V_(V), H_(H) {
  id_ = store_->add(weight_view, V, H, 0);
}

model::LossSum IspHeadLoss::forward_backward(float* dxf, const float* xf, const int32_t* labels,
                                             int64_t N, const model::Params<float>& p,
                                             model::Params<float>* g, double loss_scale,
                                             double* token_losses) {
  ops::check_labels(labels, N, V_);
  const bool bf16 = store_->compute().bf16();
  const float* W = bf16 ? nullptr : store_->acquire(id_, WeightUse::kForward, p);
  const uint16_t* W16 = bf16 ? store_->acquire_bf16(id_, WeightUse::kForward, p) : nullptr;
  float* G = nullptr;
  if (dxf && g) {
    G = store_->grad_scratch(V_ * H_);
    std::fill(G, G + V_ * H_, 0.f);
  }
  model::LossSum loss = model::chunked_head_loss(store_->compute(), chunks_, dxf, G, xf, W,
                                                 labels, N, V_, H_,
                                                 model::head_chunk_rows(V_, N), loss_scale,
                                                 token_losses, W16);
  if (G) store_->reduce_grad(g->ptr(view_), G, id_);
  if (tensor_ && tensor_->size() > 1) {
    double sum = loss.sum;
    tensor_->all_reduce(&sum, 1);
    tensor_->all_reduce(&loss.count, 1);
    loss.sum = sum;
  }
  return loss;
}

void IspHeadLoss::logits_row(float* logits, const float* xf, const model::Params<float>& p) {
  if (store_->compute().bf16()) {
    const uint16_t* W16 = store_->acquire_bf16(id_, WeightUse::kForward, p);
    return ops::gemm_bf16_weight(false, true, 1, V_, H_, 1.f, xf, W16, 0.f, logits);
  }
  const float* W = store_->acquire(id_, WeightUse::kForward, p);
  ops::gemm<float>(store_->compute(), false, true, 1, V_, H_, 1.f, xf, W, 0.f, logits);
}

}  // namespace longtron::parallel
