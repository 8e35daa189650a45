// The distributed engine (see engine.h): plan, ops, reductions and full-tensor import/export.
#include "modes/engine.h"
#include "modes/lora_engine.h"

#include "packing/context_split.h"
#include "packing/sequence_split.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "ops/sum_squares.h"
#include "ops/threads.h"

namespace longtron::parallel {
namespace {

std::map<std::string, ModeFactory>& registry() {
  static std::map<std::string, ModeFactory> modes;
  return modes;
}

// Checks the layout against the world and the model before anything is allocated.
const Grid& validated(const Grid& grid, const model::ModelConfig& c, int64_t packed_length) {
  ModelShape shape;
  shape.num_heads = c.num_attention_heads;
  shape.num_kv_heads = c.num_kv_attention_heads;
  shape.hidden_size = c.hidden_size;
  shape.packed_length = packed_length;
  shape.tied_embeddings = c.tie_word_embeddings;
  validate_model_layout(grid.layout, grid.world_size, shape);
  return grid;
}

ShardPlan build_plan(const model::ParamTable& full, const Grid& grid,
                     const ModeFactory& factory) {
  ShardPlan plan(full, grid);
  if (factory.plan) factory.plan(plan);
  return plan;
}

// [begin, end) of this zero1 rank's slice under `counts`, checked against the local buffer.
std::pair<int64_t, int64_t> slice_of(const std::vector<int64_t>& counts, int rank, int size,
                                            int64_t numel) {
  check(int64_t(counts.size()) == size, "ZeRO-1 gradient slices: {} counts for {} zero1 ranks",
        counts.size(), size);
  int64_t total = 0, begin = 0;
  for (int r = 0; r < size; ++r) {
    check(counts[size_t(r)] >= 0, "ZeRO-1 gradient slices: negative count {}", counts[size_t(r)]);
    if (r == rank) begin = total;
    total += counts[size_t(r)];
  }
  check(total == numel, "ZeRO-1 gradient slices: counts sum to {}, the local buffer has {}", total,
        numel);
  return {begin, begin + counts[size_t(rank)]};
}

}  // namespace

void validate_model_layout(const Layout& l, int world, const ModelShape& s) {
  validate_layout(l, world);
  check(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0,
        "num_attention_heads ({}) must be a positive multiple of num_kv_attention_heads ({})",
        s.num_heads, s.num_kv_heads);
  const ModeFactory& mode = find_mode(mode_name(l));
  if (mode.validate) mode.validate(l, s);
}

void register_mode(const std::string& name, ModeFactory factory) {
  check(!factory.local_batch == !factory.gather_token_losses,
        "parallel mode '{}': local_batch and gather_token_losses (its inverse) come together", name);
  registry()[name] = std::move(factory);
}

const ModeFactory& find_mode(const std::string& name) {
  register_builtin_modes();
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& [k, _] : registry()) known += (known.empty() ? "" : ", ") + k;
    fail("parallel layout '{}' is not implemented (available: {})", name, known);
  }
  return it->second;
}

std::string mode_name(const Layout& layout) {
  if (layout.is_2d()) return "2d";
  if (layout.tensor_mode == TensorMode::kIsp) return "isp";
  if (layout.tensor_size == 1) return "dense";
  return tensor_mode_name(layout.tensor_mode);
}

ParallelEngine::ParallelEngine(const model::ModelConfig& config, const Grid& grid,
                               int64_t packed_length, Unfilled)
    : grid_(validated(grid, config, packed_length)),
      mode_(mode_name(grid.layout)),
      factory_(&find_mode(mode_)),
      full_(config),
      plan_(build_plan(full_, grid_, *factory_)),
      local_(plan_.local_layout()),
      params_(local_),
      grads_(local_) {
  compute_.weights().attach(params_.data(), params_.numel());
  model::ModelOps<float> ops = factory_->make_ops(context());
  if (config.lora.enabled()) build_lora(ops);
  ops.compute = &compute_;  // the model reads its compute type (the ops were given it above)
  model_ = std::make_unique<model::Decoder<float>>(local_, params_, std::move(ops));
}

ParallelEngine::ParallelEngine(const model::ModelConfig& config, const Grid& grid,
                               uint64_t seed, int64_t packed_length)
    : ParallelEngine(config, grid, packed_length, Unfilled{}) {
  // Every rank draws the full tensors (init_params seeds each tensor on its own) and keeps its
  // slices, so any layout starts from the one-process parameters: an unsplit tensor is drawn in
  // place, a split one into a buffer of its full size (one tensor at a time) and sliced.
  int64_t largest_split = 0;
  for (int v = 0; v < plan_.num_views(); ++v)
    if (!plan_.tensor(v).splits.empty())
      largest_split = std::max(largest_split, full_.view(v).numel);
  // Each tensor has its own generator: the unsplit ones are drawn on the compute threads at once.
#pragma omp parallel for schedule(dynamic, 1)
  for (int v = 0; v < plan_.num_views(); ++v)
    if (plan_.tensor(v).splits.empty()) model::init_tensor(params_.ptr(v), full_.view(v), v, seed);
  ZeroedBuffer<float> buffer(static_cast<size_t>(largest_split));
  for (int v = 0; v < plan_.num_views(); ++v) {
    if (plan_.tensor(v).splits.empty()) continue;
    model::init_tensor(buffer.data(), full_.view(v), v, seed);
    plan_.slice(params_.ptr(v), buffer.data(), v);
  }
}

ParallelEngine::ParallelEngine(const model::ModelConfig& config, const Grid& grid,
                               const model::Params<float>& weights, int64_t packed_length)
    : ParallelEngine(config, grid, packed_length, Unfilled{}) {
  scatter_full(params_, weights);  // checks the buffer's size against the full layout
}

ParallelEngine::~ParallelEngine() = default;

data::MicroBatch ParallelEngine::local_batch(const data::MicroBatch& row) const {
  return factory_->local_batch ? factory_->local_batch(row, context()) : row;
}

model::LossSum ParallelEngine::forward_backward(const data::MicroBatch& row, double loss_scale,
                                                bool last) {
  gradients_finished_ = false;
  const LoraTraining training(lora_ ? lora_state(*lora_) : nullptr, true);
  set_lora_positions(row);
  check(!buckets_ || !buckets_->armed(),
        "ParallelEngine::forward_backward: the step's last micro-batch was already run (its "
        "gradients are being reduced); call finish_gradients() first");
  struct Unhook {  // the hook never outlives the call, even when it throws
    model::Decoder<float>* model = nullptr;
    ~Unhook() {
      if (model) model->set_backward_hook(nullptr);
    }
  } unhook;
  if (last) reduction_times_ = ReductionTimes{};
  if (last && overlaps_gradient_reduction()) {
    arm_buckets();
    model_->set_backward_hook([this](int layer, bool complete) {
      const auto t0 = std::chrono::steady_clock::now();
      buckets_->on_backward(layer, complete);
      reduction_times_.in_backward +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    unhook.model = model_.get();
  }
  if (!factory_->local_batch) return model_->forward_backward(row, grads_, loss_scale);
  return model_->forward_backward(local_batch(row), grads_, loss_scale);
}

bool ParallelEngine::overlaps_gradient_reduction() {
  if (!overlap_) return false;
  if (slice_counts_.empty() ? grid_.get(factory_->data_group)->size() != 2
                            : grid_.zero1->size() != 2 || grid_.zero1_replica->size() > 2)
    return false;
  if (!buckets_)  // views whose gradient takes a plan SUM first are reduced after backward
    buckets_ = std::make_unique<GradientBuckets>(tgrads().layout(), [this](int v) {
      return tplan().tensor(v).grad_sum_groups.empty();
    });
  return true;
}

void ParallelEngine::arm_buckets() {
  if (slice_counts_.empty()) {
    buckets_->start(*grid_.get(factory_->data_group), tgrads().data());
    return;
  }
  const comm::Communicator& z = *grid_.zero1;
  const auto [begin, end] = slice_of(slice_counts_, z.rank(), z.size(), tgrads().numel());
  slice_scratch_.resize(size_t(end - begin));
  buckets_->start_slices(*grid_.zero1, *grid_.zero1_replica, tgrads().data(), slice_counts_,
                         slice_scratch_.data());
}

void ParallelEngine::set_gradient_slices(std::vector<int64_t> counts) {
  check(counts.empty() || shards_gradients(),
        "set_gradient_slices: this grid has no ZeRO-1 gradient slices");
  if (!counts.empty()) {
    const comm::Communicator& z = *grid_.zero1;
    slice_of(counts, z.rank(), z.size(), tgrads().numel());  // checks them
  }
  slice_counts_ = std::move(counts);
}

model::LossSum ParallelEngine::forward_loss(const data::MicroBatch& row,
                                            std::vector<double>* token_losses) {
  const LoraTraining training(lora_ ? lora_state(*lora_) : nullptr, false);
  set_lora_positions(row);
  if (!factory_->local_batch) return model_->forward_loss(row, token_losses);
  const model::LossSum loss = model_->forward_loss(local_batch(row), token_losses);
  if (token_losses != nullptr)
    *token_losses = factory_->gather_token_losses(*token_losses, row, context());
  return loss;
}

void ParallelEngine::set_lora_positions(const data::MicroBatch& row) {
  if (!lora_ || !factory_->local_batch) return;
  // The row's positions as its token ids, through the mode's own split: the ids this rank then
  // holds are the global positions of its tokens (LoRA dropout's mask).
  data::MicroBatch probe = row;
  for (size_t i = 0; i < probe.input_ids.size(); ++i) probe.input_ids[i] = int32_t(i);
  lora_->state->positions = factory_->local_batch(probe, context()).input_ids;
}

void ParallelEngine::finish_gradients() {
  check(!buckets_ || !buckets_->slices(), "finish_gradients: the last backward reduce-scattered "
        "its gradients into ZeRO-1 slices (set_gradient_slices): call finish_gradient_slices()");
  const auto t0 = std::chrono::steady_clock::now();
  plan_gradient_sums();
  // 2. Data parallel: each dp rank saw its own micro-batches; the step gradient is their SUM
  // (the loss scale already divides by the global count). When the last backward started it
  // bucket by bucket, the buckets are completed and the rest (views of the plan's SUMs) summed.
  // A rank whose step had no last micro-batch (no rows) issues the same buckets here, so every
  // rank runs the same collectives.
  comm::Communicator& dp = *grid_.get(factory_->data_group);
  if (slice_counts_.empty() && overlaps_gradient_reduction()) {
    if (!buckets_->armed()) arm_buckets();
    buckets_->finish();
  } else if (dp.size() > 1) {
    dp.all_reduce(tgrads().data(), tgrads().numel());
  }
  gradients_finished_ = true;
  reduction_times_.after_backward =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ParallelEngine::plan_gradient_sums() {
  // 1. The plan's SUMs, one packed all-reduce per group kind (the same order on every rank:
  // every rank has the same plan structure).
  std::map<comm::Group, std::vector<int>> by_group;
  for (int v = 0; v < tplan().num_views(); ++v)
    for (comm::Group g : tplan().tensor(v).grad_sum_groups) by_group[g].push_back(v);
  std::vector<float> pack;
  for (const auto& [group, views] : by_group) {
    comm::Communicator& c = *grid_.get(group);
    if (c.size() == 1) continue;
    pack.clear();
    for (int v : views)
      pack.insert(pack.end(), tgrads().ptr(v), tgrads().ptr(v) + tlocal().view(v).numel);
    c.all_reduce(pack.data(), static_cast<int64_t>(pack.size()));
    const float* src = pack.data();
    for (int v : views) {
      std::copy(src, src + tlocal().view(v).numel, tgrads().ptr(v));
      src += tlocal().view(v).numel;
    }
  }
}

bool ParallelEngine::shards_gradients() const {
  const comm::Communicator& dp = *grid_.get(factory_->data_group);
  // ZeRO-1 groups are cut from WEIGHT_DATA, which is DATA unless there are WEIGHT groups.
  const bool inside = factory_->data_group == comm::Group::kWeightData || grid_.shape.weight == 0;
  return inside && grid_.zero1->size() > 1 &&
         grid_.zero1->size() * grid_.zero1_replica->size() == dp.size();
}

void ParallelEngine::finish_gradient_slices(const std::vector<int64_t>& counts) {
  check(shards_gradients(), "finish_gradient_slices: this grid has no ZeRO-1 gradient slices");
  check(!buckets_ || !buckets_->armed() || (buckets_->slices() && buckets_->slice_counts() == counts),
        "finish_gradient_slices: the last backward {} (forward_backward with last = true): call {}",
        buckets_ && buckets_->slices() ? "reduce-scattered its buckets into other slices"
                                       : "all-reduced its gradients in buckets",
        buckets_ && buckets_->slices() ? "it with the counts given to set_gradient_slices"
                                       : "finish_gradients()");
  const auto t0 = std::chrono::steady_clock::now();
  comm::Communicator& z = *grid_.zero1;
  const auto [begin, end] = slice_of(counts, z.rank(), z.size(), tgrads().numel());
  plan_gradient_sums();
  if (counts == slice_counts_ && overlaps_gradient_reduction()) {
    // The buckets the last backward started (all of them on a rank without rows), then the
    // views of the plan's SUMs.
    if (!buckets_->armed()) arm_buckets();
    buckets_->finish();
  } else {
    slice_scratch_.resize(size_t(end - begin));
    z.reduce_scatter_v(slice_scratch_.data(), tgrads().data(), counts);
    std::copy(slice_scratch_.begin(), slice_scratch_.end(), tgrads().data() + begin);
    comm::Communicator& replica = *grid_.zero1_replica;
    if (replica.size() > 1) replica.all_reduce(tgrads().data() + begin, end - begin);
  }
  gradients_finished_ = true;
  reduction_times_.after_backward =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ParallelEngine::grad_norm_of_slices(const std::vector<int64_t>& counts) const {
  const comm::Communicator& z = *grid_.zero1;
  const auto [begin, end] = slice_of(counts, z.rank(), z.size(), tgrads().numel());
  // An element is held by world / split_parts ranks; each zero1 group holds it in one slice, so
  // world / split_parts / Z slices hold it: weight each by the inverse.
  double acc = 0.0;
  for (int v = 0; v < tplan().num_views(); ++v) {
    const int64_t offset = tlocal().view(v).offset;
    const int64_t lo = std::max(begin, offset);
    const int64_t hi = std::min(end, offset + tlocal().view(v).numel);
    if (lo >= hi) continue;
    const double holders =
        double(grid_.world_size) / double(tplan().tensor(v).split_parts()) / double(z.size());
    acc += ops::sum_squares(tgrads().data() + lo, hi - lo) / holders;
  }
  if (grid_.world_size > 1) grid_.world->all_reduce(&acc, 1);
  return std::sqrt(acc);
}

void ParallelEngine::gather_gradient_slices(const std::vector<int64_t>& counts) {
  comm::Communicator& z = *grid_.zero1;
  const auto [begin, end] = slice_of(counts, z.rank(), z.size(), tgrads().numel());
  (void)end;
  if (z.size() > 1) z.all_gather_v(tgrads().data(), tgrads().data() + begin, counts);
}

double ParallelEngine::grad_norm() const {
  check(gradients_finished_,
        "ParallelEngine::grad_norm: call finish_gradients() after the last forward_backward()");
  // Each element is held by world / split_parts ranks with the same value: weight it by the
  // inverse so the world sum counts it once.
  double acc = 0.0;
  for (int v = 0; v < tplan().num_views(); ++v) {
    const double replicas = double(grid_.world_size) / double(tplan().tensor(v).split_parts());
    acc += ops::sum_squares(tgrads().ptr(v), tlocal().view(v).numel) / replicas;
  }
  if (grid_.world_size > 1) grid_.world->all_reduce(&acc, 1);
  return std::sqrt(acc);
}

model::LossSum ParallelEngine::reduce_loss(model::LossSum local) const {
  double buf[2] = {local.sum, double(local.count)};
  if (grid_.data->size() > 1) grid_.data->all_reduce(buf, 2);
  return model::LossSum{buf[0], static_cast<int64_t>(std::llround(buf[1]))};
}

void ParallelEngine::gather_full(model::Params<float>& full, const model::Params<float>& local) const {
  check(full.numel() == full_.numel() && local.numel() == local_.numel(),
        "gather_full: buffers of {} and {} elements, layouts of {} and {}", full.numel(),
        local.numel(), full_.numel(), local_.numel());
  for (int v = 0; v < plan_.num_views(); ++v) {
    // A split view is assembled by sums over zero-padded copies; an unsplit one is overwritten.
    if (!plan_.tensor(v).splits.empty())
      std::fill(full.ptr(v), full.ptr(v) + full_.view(v).numel, 0.0f);
    plan_.unslice(full.ptr(v), local.ptr(v), v);
    // Every element is held by exactly one rank of each split group: summing the zero-padded
    // copies over each group in turn assembles the tensor on every rank.
    for (const Split& s : plan_.tensor(v).splits) {
      comm::Communicator& c = *grid_.get(s.group);
      if (c.size() > 1) c.all_reduce(full.ptr(v), full_.view(v).numel);
    }
  }
}

void ParallelEngine::scatter_full(model::Params<float>& local, const model::Params<float>& full) const {
  check(full.numel() == full_.numel() && local.numel() == local_.numel(),
        "scatter_full: buffers of {} and {} elements, layouts of {} and {}", full.numel(),
        local.numel(), full_.numel(), local_.numel());
  for (int v = 0; v < plan_.num_views(); ++v) plan_.slice(local.ptr(v), full.ptr(v), v);
}

}  // namespace longtron::parallel
