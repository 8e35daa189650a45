// The engine's LoRA adapters (engine.h, "LoRA"; docs/lora.md): their plan in each layout, the
// communication of the small [N, r] intermediate u = dropout(x)·Aᵀ, and the trainable table.
//
// A linear W [out, in] split over a group on dim 0 (column-parallel) holds B's rows of its output
// rows and A whole; on dim 1 (row-parallel) A's columns of its input columns and B whole. Then
//   column: y_local += s·u·B_localᵀ with u from the whole input; backward du = s·dy_local·B_local
//           is a partial sum over the group (all-reduce, or reduce-scatter to the rank's rows
//           under sequence parallel, where u is all-gathered from the rank's rows in forward);
//   row:    u = x_local·A_localᵀ is a partial sum over the group (all-reduce, or reduce-scatter to
//           the rank's output rows under sequence parallel, whose du is all-gathered in backward).
// A copy whose ranks saw different tokens (A of a column linear, B of a row linear under
// sequence parallel) has its gradient summed over the group (ShardPlan::sum_gradient).
//
// 2D tensor parallel (tp2d_ops.h) is both at once: W is split on rows over the group G its input
// rows are gathered over and on columns over the group R its output rows are reduce-scattered
// over (wqkv, w1, w3: G = X, R = Y; wo, w2: G = Y, R = X). A holds the columns of R's split,
// B the rows of G's split; u = x_local·A_localᵀ (partial over R, on the rank's x rows) takes the
// base's path (all-gather over G, reduce-scatter over R) to the rank's y rows, du the reverse
// (all-gather over R, reduce-scatter over G). A is whole over G, whose ranks saw other rows:
// its gradient is summed over G; B's over R.
//
// ISP (weight parallel) shards A and B on rows over WEIGHT like the base's linears; they join the
// base's IspWeightStore (gathered whole before each use, full-shape gradients reduce-scattered).
#include "modes/lora_engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/zeroed_buffer.h"
#include "modes/isp_weights.h"
#include "modes/lora_plan.h"

namespace longtron::parallel {
namespace {

/// B's rows [first, first + count) of module m that land in base rows [row0, row0 + rows).
std::pair<int64_t, int64_t> b_rows_in(const model::LoraModule& m, int64_t row0, int64_t rows) {
  int64_t b = 0, first = -1, count = 0;
  for (const auto& [r, n] : m.rows) {
    const int64_t lo = std::max(r, row0), hi = std::min(r + n, row0 + rows);
    if (lo < hi) {
      if (first < 0) first = b + (lo - r);
      count += hi - lo;
    }
    b += n;
  }
  return {std::max<int64_t>(first, 0), count};
}

/// The adapters' spec of a 2D tensor-parallel linear whose base is split by `base` (see above).
model::LoraLinearSpec<float> spec_2d(const TensorPlan& base, const Grid& grid) {
  model::LoraLinearSpec<float> sp;
  comm::CommPtr G, R;
  for (const Split& s : base.splits) {
    if (s.dim == 0) {
      sp.row0 = s.start;
      sp.rows = s.count;
      G = grid.get(s.group);
    } else {
      sp.col0 = s.start;
      sp.cols = s.count;
      R = grid.get(s.group);
    }
  }
  check(G != nullptr && R != nullptr, "lora: a 2D tensor-parallel linear not split on both dims");
  const int g = G->size(), g_rank = G->rank(), rs = R->size();
  sp.x_rows = [g](int64_t N) { return N / g; };
  sp.y_rows = [rs](int64_t N) { return N / rs; };
  sp.x_position = [g, g_rank](int64_t N) { return N / g * g_rank; };
  auto whole = std::make_shared<std::vector<float>>();  // u or du over all N rows (partial)
  auto rows = [whole](int64_t n) {
    if (int64_t(whole->size()) < n) whole->resize(size_t(n));
    return whole->data();
  };
  sp.forward_u = [G, R, rows](float* uy, float* ux, int64_t N, int64_t r) {
    float* u = rows(N * r);
    G->all_gather(u, ux, N / G->size() * r);
    R->reduce_scatter(uy, u, N / R->size() * r);
  };
  sp.backward_du = [G, R, rows](float* dux, float* duy, int64_t N, int64_t r) {
    float* du = rows(N * r);
    R->all_gather(du, duy, N / R->size() * r);
    G->reduce_scatter(dux, du, N / G->size() * r);
  };
  return sp;
}

}  // namespace

void plan_lora(ShardPlan& plan, const std::vector<model::LoraModule>& modules,
               const ShardPlan& base, const std::string& mode) {
  if (mode == "isp") {
    // Sharded on rows over WEIGHT as the base's linears (isp_weights.h): gathered before each
    // use, the full-shape gradient of this rank's tokens reduce-scattered onto the shard (the SUM
    // over WEIGHT), then summed over WEIGHT_DATA by finish_gradients.
    for (int v = 0; v < plan.num_views(); ++v) plan.split(v, 0, comm::Group::kWeight);
    return;
  }
  const bool sharded_tokens = mode == "msp" || mode == "fsp" || mode == "2d";
  for (const model::LoraModule& m : modules) {
    for (const Split& s : base.tensor(m.base_view).splits) {
      if (s.dim == 0) {
        const auto [first, count] = b_rows_in(m, s.start, s.count);
        plan.split_range(m.b_view, 0, s.group, first, count);
        if (sharded_tokens) plan.sum_gradient(m.a_view, s.group);
      } else {
        plan.split_range(m.a_view, 1, s.group, s.start, s.count);
        if (sharded_tokens) plan.sum_gradient(m.b_view, s.group);
      }
    }
  }
}

ParallelEngine::Lora::Lora(const model::ParamTable& base, const model::LoraConfig& config,
                           const Grid& grid)
    : modules(model::lora_modules(base, config)),
      full(model::lora_table(base, modules, config.rank)),
      plan(full, grid),
      local(full) {}

void ParallelEngine::build_lora(model::ModelOps<float>& ops) {
  const model::LoraConfig& config = full_.config().lora;
  check(config.dropout >= 0.0 && config.dropout < 1.0, "lora.dropout: {} is outside [0, 1)",
        config.dropout);
  const bool sequence_parallel = mode_ == "msp" || mode_ == "fsp";
  const bool isp = mode_ == "isp", tp2d = mode_ == "2d";
  check(mode_ == "dense" || mode_ == "mtp" || sequence_parallel || isp || tp2d,
        "[lora] under the '{}' parallel layout is not implemented (it runs in one process, with data "
        "parallelism and ZeRO-1, under parallel.tensor mode mtp, msp, fsp and isp, with "
        "2D-Attention and under parallel.tensor_2d)",
        mode_);
  lora_ = std::make_unique<Lora>(full_, config, grid_);
  Lora& L = *lora_;
  plan_lora(L.plan, L.modules, plan_, mode_);
  L.local = L.plan.local_layout();
  L.params = std::make_unique<model::Params<float>>(L.local);
  L.grads = std::make_unique<model::Params<float>>(L.local);
  // A drawn as one process draws it (each view from its own generator), then sliced; B zero.
  for (int v = 0; v < L.plan.num_views(); ++v) {
    const model::ParamView& fv = L.full.view(v);
    std::vector<float> buffer(size_t(fv.numel));
    model::lora_init_tensor(buffer.data(), fv, v, config.seed);
    L.plan.slice(L.params->ptr(v), buffer.data(), v);
  }
  L.state = std::make_shared<model::LoraState<float>>();
  L.state->config = config;
  L.state->params = L.params.get();
  L.state->grads = L.grads.get();
  L.state->compute = &compute_;  // bf16 compute: the adapters' GEMMs on bf16 operands

  // ISP: the adapters join the base's weight store (each pass begun by the embedding, gathers
  // prefetched in the recorded order): gathered whole before each use, gradients reduce-scattered.
  std::shared_ptr<IspWeightStore> store;
  std::vector<int> ids;  // adapter view → store id
  if (isp) {
    const auto* embedding = dynamic_cast<const IspEmbedding*>(ops.embedding.get());
    check(embedding != nullptr, "lora: the isp mode's embedding is not its weight-parallel one");
    store = embedding->store();
    for (int v = 0; v < L.plan.num_views(); ++v) {
      const std::vector<int64_t>& shape = L.full.view(v).shape;
      ids.push_back(store->add(L.params.get(), v, shape[0], shape[1], 0));
    }
  }
  comm::CommPtr tensor = grid_.get(comm::Group::kTensor);
  const ShardPlan& base_plan = plan_;
  const Grid& grid = grid_;
  const model::Params<float>* values = L.params.get();
  auto spec = [tensor, sequence_parallel, isp, tp2d, &base_plan, &grid, store, ids,
               values](int, int view) {
    model::LoraLinearSpec<float> sp;
    if (isp) {  // whole weights (gathered by the base op) and adapters, local tokens
      sp.gather = [store, ids, values](int v, bool backward) {
        return store->acquire(ids[size_t(v)], backward ? WeightUse::kBackward : WeightUse::kForward,
                              *values);
      };
      sp.reduce = [store, ids](float* shard, float* full, int v) {
        store->reduce_grad(shard, full, ids[size_t(v)]);
      };
      sp.grad_scratch = [store](int64_t n) { return store->grad_scratch(n); };
      return sp;
    }
    if (tp2d) return spec_2d(base_plan.tensor(view), grid);
    const int T = tensor->size();
    for (const Split& s : base_plan.tensor(view).splits) {
      check(s.group == comm::Group::kTensor, "lora: a linear split over a group other than TENSOR");
      if (s.dim == 0) {  // column-parallel
        sp.row0 = s.start;
        sp.rows = s.count;
        if (sequence_parallel) {
          const int t = tensor->rank();
          sp.x_rows = [T](int64_t N) { return N / T; };
          sp.x_position = [T, t](int64_t N) { return N / T * t; };
          sp.forward_u = [tensor, T](float* uy, float* ux, int64_t N, int64_t r) {
            tensor->all_gather(uy, ux, N / T * r);
          };
          sp.backward_du = [tensor, T](float* dux, float* duy, int64_t N, int64_t r) {
            tensor->reduce_scatter(dux, duy, N / T * r);
          };
        } else {
          sp.backward_du = [tensor](float* dux, float* duy, int64_t N, int64_t r) {
            std::copy(duy, duy + N * r, dux);
            tensor->all_reduce(dux, N * r);
          };
        }
      } else {  // row-parallel
        sp.col0 = s.start;
        sp.cols = s.count;
        if (sequence_parallel) {
          sp.y_rows = [T](int64_t N) { return N / T; };
          sp.forward_u = [tensor, T](float* uy, float* ux, int64_t N, int64_t r) {
            tensor->reduce_scatter(uy, ux, N / T * r);
          };
          sp.backward_du = [tensor, T](float* dux, float* duy, int64_t N, int64_t r) {
            tensor->all_gather(dux, duy, N / T * r);
          };
        } else {
          sp.forward_u = [tensor](float* uy, float* ux, int64_t N, int64_t r) {
            std::copy(ux, ux + N * r, uy);
            tensor->all_reduce(uy, N * r);
          };
        }
      }
    }
    return sp;
  };
  model::apply_lora<float>(ops, local_, L.modules, L.local, L.state, spec);
}

const std::vector<model::LoraModule>& ParallelEngine::lora_modules() const {
  static const std::vector<model::LoraModule> none;
  return lora_ ? lora_->modules : none;
}
const model::ParamTable& ParallelEngine::train_full_layout() const {
  return lora_ ? lora_->full : full_;
}
const model::ParamTable& ParallelEngine::train_layout() const { return tlocal(); }
const ShardPlan& ParallelEngine::train_plan() const { return tplan(); }
model::Params<float>& ParallelEngine::train_params() { return lora_ ? *lora_->params : params(); }
model::Params<float>& ParallelEngine::train_grads() { return tgrads(); }
model::Params<float>& ParallelEngine::tgrads() { return lora_ ? *lora_->grads : grads_; }
const model::Params<float>& ParallelEngine::tgrads() const { return lora_ ? *lora_->grads : grads_; }
const ShardPlan& ParallelEngine::tplan() const { return lora_ ? lora_->plan : plan_; }
const model::ParamTable& ParallelEngine::tlocal() const { return lora_ ? lora_->local : local_; }

void ParallelEngine::set_lora_step(int64_t step) {
  if (lora_) lora_->state->step = step;
}

void ParallelEngine::set_lora_adapters_off(bool off) {
  if (lora_) lora_->state->adapters_off = off;
}

void ParallelEngine::freeze_lora_base(model::LoraBaseStorage storage) {
  if (!lora_ || storage == model::LoraBaseStorage::kFloat32) return;
  check(mode_ == "dense", "lora.base_dtype = \"bfloat16\": a bf16-only base is held by one process "
        "per model replica (data parallelism); under the '{}' layout set lora.base_dtype = "
        "\"float32\"", mode_);
  Lora& L = *lora_;
  L.state->base16 = model::lora_base_bf16(local_, params_.data(), L.base16);
  compute_.weights().attach(nullptr, 0);  // the ops read base16; no copy mirrors the fp32 zeros
  // The fp32 matrices are not read again: give their whole pages back (they read 0 afterwards).
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  for (const model::ParamView& v : local_.views()) {
    if (!v.is_matrix) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(params_.data() + v.offset);
    const uintptr_t end = reinterpret_cast<uintptr_t>(params_.data() + v.offset + v.numel);
    const uintptr_t lo = (begin + page - 1) / page * page, hi = end / page * page;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  }
}

void ParallelEngine::gather_train_full(model::Params<float>& full,
                                       const model::Params<float>& local) const {
  if (!lora_) return gather_full(full, local);
  const ShardPlan& plan = lora_->plan;
  check(full.numel() == lora_->full.numel() && local.numel() == lora_->local.numel(),
        "gather_train_full: buffers of {} and {} elements, adapter layouts of {} and {}",
        full.numel(), local.numel(), lora_->full.numel(), lora_->local.numel());
  for (int v = 0; v < plan.num_views(); ++v) {
    if (!plan.tensor(v).splits.empty())
      std::fill(full.ptr(v), full.ptr(v) + lora_->full.view(v).numel, 0.0f);
    plan.unslice(full.ptr(v), local.ptr(v), v);
    for (const Split& s : plan.tensor(v).splits) {
      comm::Communicator& c = *grid_.get(s.group);
      if (c.size() > 1) c.all_reduce(full.ptr(v), lora_->full.view(v).numel);
    }
  }
}

void ParallelEngine::scatter_train_full(model::Params<float>& local,
                                        const model::Params<float>& full) const {
  if (!lora_) return scatter_full(local, full);
  check(full.numel() == lora_->full.numel() && local.numel() == lora_->local.numel(),
        "scatter_train_full: buffers of {} and {} elements, adapter layouts of {} and {}",
        full.numel(), local.numel(), lora_->full.numel(), lora_->local.numel());
  for (int v = 0; v < lora_->plan.num_views(); ++v) lora_->plan.slice(local.ptr(v), full.ptr(v), v);
}

}  // namespace longtron::parallel
