// The distributed engine: one InternLM2 replica spread over a process grid (docs/parallel.md), with the
// exact gradient of the global token-weighted loss on every rank, whatever the layout.
//
// ---- How the pieces fit (read this to add a mode, as ISP and 2D were added) ---------------------
// 1. ShardPlan (shard_plan.h): for each full HF tensor, the local view (splits over groups) and the
//    groups its gradient is SUMMED over. The rank's params/grads are model::Params over
//    plan.local_layout() (same names and view indices as the full layout, local shapes).
// 2. A mode = ModeFactory {plan, make_ops, local_batch + gather_token_losses, validate, memory,
//    data_group}, registered under a name (the modes live in src/modes/, built from the
//    primitives of src/parallel/):
//      plan(ShardPlan&)                 adds the mode's splits and gradient sums;
//      make_ops(const ModeContext&)     builds model::ModelOps<float> over the LOCAL layout (the
//                                       ops hold their communicators, from ctx.grid);
//      local_batch(row, ctx)            (optional) the part of a full packed row this rank feeds
//                                       the model (ISP: the sequence shard, docs/data.md; default:
//                                       the whole row, as MTP/MSP/FSP do).
//      gather_token_losses(local, row, ctx) (with local_batch) its inverse: per-token values of
//                                       the local batch back to the full row in row order.
//      validate(layout, shape)          (optional) the mode's own rules on the model sizes and its
//                                       options, run by validate_model_layout before anything is
//                                       allocated.
//      memory(in, terms)                (optional) what a rank holds in a step beyond its
//                                       parameters (mode_memory.h), read by the memory plan.
//    mode_name(layout) picks the factory: "dense" (tp 1, no isp/2d), "mtp", "msp", "fsp", "isp"
//    (tensor.mode isp, any T/W), "2d" (parallel.tensor_2d). Registration: define
//    `void register_<mode>_mode()` in your own .cpp (calling register_mode) and add ONE call to it
//    in register_builtin_modes() in engine_registry.cpp (static registrars would be dropped by the
//    static-library link).
// 3. Op conventions beyond model/layers.h: an op never knows the mode beyond what it was built
//    with. Under MSP/FSP every op receives N = the tokens of the whole row and the residual-stream
//    buffers (embedding out, norm in/out, row-linear out, head in) hold this rank's N/T rows
//    (ModelOps::residual_split = T, so the model allocates them at N/T rows); column linears
//    gather them, row linears reduce-scatter into them. Under ISP the batch
//    itself is the shard (ModelOps::sequence_parallel_size = T) and N is the local count.
// 4. ParallelEngine (below) owns params, grads and the model, and does the reductions:
//      finish_gradients(): plan SUMs (e.g. norm weights over TENSOR), then SUM over DATA;
//      grad_norm(): each element once (local Σg² weighted 1/replicas, all-reduced over the world);
//    The optimizer (train::AdamW over local_layout(), ZeRO-1 over grid.zero1) updates the local
//    flat buffers: replicated tensors stay identical because their gradients are.
// 5. Checkpoints: gather_full() builds HF-named full tensors from any local param-shaped buffer
//    (params, AdamW moments); scatter_full() loads them back into any layout.
//
// The step (train/step.h, train::train_step, used by the trainer, the parity tests and the
// benchmarks): zero_grads; forward_backward of each micro-batch with loss_scale = 1 / the step's
// label count over DATA; finish_gradients; grad_norm; clip; AdamW. The loss stays (sum, count)
// until reduce_loss over the data-parallel group.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/layers.h"
#include "model/lora.h"
#include "model/params.h"
#include "modes/grad_buckets.h"
#include "modes/mode_memory.h"
#include "ops/compute_context.h"
#include "packing/batch.h"
#include "parallel/layout.h"
#include "parallel/shard_plan.h"

namespace longtron::parallel {

/// What a mode's make_ops / local_batch may use.
struct ModeContext {
  const model::ParamTable& full;   ///< the full (HF) layout
  const model::ParamTable& local;  ///< this rank's layout (plan.local_layout())
  const ShardPlan& plan;
  const Grid& grid;
  /// The engine's compute context: the ops keep a reference and compute in its precision (the
  /// engine sets ModelOps::compute to it after make_ops).
  const ops::ComputeContext& compute;
};

/// One parallel mode.
struct ModeFactory {
  std::function<void(ShardPlan& plan)> plan;
  std::function<model::ModelOps<float>(const ModeContext& ctx)> make_ops;
  /// nullptr = feed the whole row; otherwise this rank's contiguous 1/T of the row over the
  /// TENSOR group (padded to a multiple of T first), as forward_loss assumes.
  std::function<data::MicroBatch(const data::MicroBatch& row, const ModeContext& ctx)> local_batch;
  /// The inverse of local_batch for per-token values (forward_loss's token losses): `local` holds
  /// one value per token of local_batch(row) on this rank; returns the full row's values in row
  /// order (row.input_ids.size() of them) on every rank of the TENSOR group. Collective over the
  /// mode's groups. Required exactly when local_batch is given.
  std::function<std::vector<double>(const std::vector<double>& local, const data::MicroBatch& row,
                                    const ModeContext& ctx)>
      gather_token_losses;
  /// The mode's memory terms for the memory plan (train/memory_plan.h): adjusts the defaults of
  /// one process over the whole row (ModeMemory::defaults) to what this mode's ranks hold
  /// (workspace shape, attention and head sizes, gather buffers). nullptr: the defaults.
  std::function<void(const ModeMemoryInputs& in, ModeMemory& memory)> memory;
  /// The group of finish_gradients' data-parallel SUM: the ranks holding the same shards that saw
  /// different rows. DATA for every mode but ISP, whose weight shards live in WEIGHT_DATA
  /// (docs/isp.md).
  comm::Group data_group = comm::Group::kData;
  /// The mode's own rules on the model sizes and its options (throws Error naming the config keys
  /// and sizes), run by validate_model_layout before anything is allocated; nullptr = none.
  std::function<void(const Layout& layout, const ModelShape& shape)> validate;
};

/// Registers `factory` under `name` (replacing an earlier one).
void register_mode(const std::string& name, ModeFactory factory);
/// The factory of `name`; throws Error listing the registered names when there is none.
const ModeFactory& find_mode(const std::string& name);
/// "dense" | "mtp" | "msp" | "fsp" | "isp" | "2d" for a layout (see the top of this file).
std::string mode_name(const Layout& layout);
/// validate_layout, heads a positive multiple of kv heads, then the rules of the layout's mode
/// (its ModeFactory::validate, beside the mode's code), each named in its error.
void validate_model_layout(const Layout& layout, int world_size, const ModelShape& shape);

/// Registers every built-in mode once (idempotent; called by the engine's constructor).
void register_builtin_modes();

/// One rank's share of a model replica and its training-step reductions.
class ParallelEngine {
 public:
  /// Validates the layout against the model (validate_model_layout with packed_length, 0 = skip
  /// the P check) BEFORE any allocation, builds the plan and the ops of mode_name(grid.layout),
  /// and initialises the parameters from `seed` exactly as one process would (init_params on the
  /// full layout, then this rank's slice). Collective over the grid's world.
  ParallelEngine(const model::ModelConfig& config, const Grid& grid, uint64_t seed,
                 int64_t packed_length = 0);
  /// The same over given full (HF-layout) weights instead of drawn ones: this rank keeps its
  /// slices of `weights` (every rank passes the full buffer; no full copy is drawn). Throws Error
  /// when `weights` is not over the layout of `config`.
  ParallelEngine(const model::ModelConfig& config, const Grid& grid,
                 const model::Params<float>& weights, int64_t packed_length = 0);
  /// Tag of the constructor below.
  struct Unfilled {};
  /// Everything but the parameter values, which stay 0 (unwritten) for the caller to fill in
  /// params() — loading a checkpoint straight into this rank's shards (train::load_hf_shards): no
  /// full model is drawn or held. Collective over the grid's world.
  ParallelEngine(const model::ModelConfig& config, const Grid& grid, int64_t packed_length,
                 Unfilled);
  ~ParallelEngine();
  ParallelEngine(const ParallelEngine&) = delete;
  ParallelEngine& operator=(const ParallelEngine&) = delete;

  const model::ParamTable& full_layout() const { return full_; }
  const model::ParamTable& local_layout() const { return local_; }
  const ShardPlan& plan() const { return plan_; }
  const Grid& grid() const { return grid_; }
  const std::string& mode() const { return mode_; }
  /// The parameters, for writing: marks the bf16 weight copy stale (the next GEMM that reads a
  /// weight remakes it), so no write can leave it stale. Read through the const overload.
  model::Params<float>& params() {
    compute_.weights().invalidate();
    return params_;
  }
  const model::Params<float>& params() const { return params_; }
  model::Params<float>& grads() { return grads_; }
  /// The compute context every op of this engine computes in (ops/compute_context.h): float32
  /// until set_compute_type. Its bf16 weight copy mirrors params(); the optimizer refreshes it in
  /// its update (train::AdamW::update).
  ops::ComputeContext& compute() { return compute_; }
  const ops::ComputeContext& compute() const { return compute_; }
  /// The compute type of every later forward and backward (eval, generation and training set it
  /// once, before the first pass).
  void set_compute_type(ops::ComputeType type) { compute_.set_type(type); }
  model::Decoder<float>& model() { return *model_; }

  /// The part of a full packed row this rank feeds to the model (the mode's local_batch).
  data::MicroBatch local_batch(const data::MicroBatch& row) const;

  /// Forward + backward of one full row (local_batch applied inside); ACCUMULATES the gradient of
  /// loss_scale · loss_sum into grads(). Returns the row's (loss_sum, count), identical on every
  /// rank of the model replica. `last` = the step's last micro-batch on this rank (the same on
  /// every rank): when overlaps_gradient_reduction(), the data-parallel all-reduce of each
  /// gradient bucket (or, after set_gradient_slices(counts), its reduce-scatter into the ZeRO-1
  /// slices) starts during this backward as soon as the bucket is final (grad_buckets.h), and
  /// finish_gradients() (finish_gradient_slices(counts)) completes it; grads() must then not be
  /// touched until it has.
  model::LossSum forward_backward(const data::MicroBatch& row, double loss_scale, bool last = false);
  /// Loss only (evaluation), identical on every rank of the model replica. token_losses (when not
  /// nullptr) receives the loss of each token of the FULL row (0 where the label is ignored) in
  /// every mode: a mode feeding each rank a slice of the row (local_batch, ISP) gathers them.
  model::LossSum forward_loss(const data::MicroBatch& row, std::vector<double>* token_losses = nullptr);

  /// Sets grads() to 0.
  void zero_grads() {
    if (buckets_) buckets_->abandon();  // a reduction left in flight writes no more
    tgrads().zero();
    gradients_finished_ = false;
  }
  /// The plan's gradient SUMs (over TENSOR etc.), then SUM over DATA: afterwards every rank holds
  /// its shard of the exact gradient of the global step loss.
  void finish_gradients();
  /// sqrt(Σ g²) over the FULL model, each element counted once. Throws longtron::Error unless
  /// finish_gradients() ran after the last zero_grads() / forward_backward() (before it, each
  /// rank holds partial sums and the norm would be wrong without any other sign).
  double grad_norm() const;
  /// Whether the ZeRO-1 gradient path below applies: grid().zero1 has more than one rank, lies
  /// inside finish_gradients' data-parallel group, and zero1 × zero1_replica is that group.
  bool shards_gradients() const;
  /// The ZeRO-1 form of finish_gradients (the gradient reduce-scatter of ZeRO stages 1/2,
  /// Rajbhandari et al. 2020, and of Megatron-LM's distributed optimizer): the plan's SUMs as in
  /// finish_gradients, then over data parallel a reduce_scatter_v inside grid().zero1 with
  /// `counts` (one slice size per zero1 rank: the optimizer's contiguous split of the local flat
  /// buffer) and, when the zero1 group is smaller than the data-parallel group, an all_reduce of
  /// the slice over grid().zero1_replica (the groups' ranks holding the same slice). Afterwards
  /// grads() holds the exact step gradient on this rank's slice only; the rest holds this rank's
  /// unreduced contributions until gather_gradient_slices(). A ring moves (Z−1)/Z of the buffer
  /// per rank instead of all_reduce's 2(Z−1)/Z. Collective over the grid. Throws Error unless
  /// shards_gradients() and counts has one entry per zero1 rank summing to the local numel.
  /// When the step's last backward reduce-scattered its buckets (set_gradient_slices(counts)
  /// before it, overlaps_gradient_reduction()), this completes them and reduce-scatters the
  /// rest; `counts` must then be the armed ones (else Error).
  void finish_gradient_slices(const std::vector<int64_t>& counts);
  /// The data-parallel reduction the next steps' last backward overlaps: empty = the all-reduce
  /// of finish_gradients; else ZeRO-1's reduce-scatter into these slices (one count per zero1
  /// rank, as finish_gradient_slices takes them), completed by finish_gradient_slices(counts).
  /// Throws Error for non-empty counts unless shards_gradients().
  void set_gradient_slices(std::vector<int64_t> counts);
  /// grad_norm() after finish_gradient_slices: each rank squares its slice only, weighted so the
  /// all-reduce over the world counts every element of the full model once. Collective (world).
  double grad_norm_of_slices(const std::vector<int64_t>& counts) const;
  /// After finish_gradient_slices: all_gather_v of the slices over grid().zero1, so grads() is
  /// the full reduced gradient again (as after finish_gradients). Collective over zero1.
  void gather_gradient_slices(const std::vector<int64_t>& counts);
  /// Whether forward_backward(row, scale, last = true) overlaps the data-parallel gradient
  /// reduction with backward: set_overlap_gradient_reduction(true) (the default) and every group
  /// the reduction sums over has exactly 2 ranks (the data-parallel group for the all-reduce; for
  /// ZeRO-1's slices the zero1 group, with a replica group of at most 2), where a bucketed
  /// reduction sums every element as the whole-buffer one does (a + b; with more ranks a
  /// collective may sum an element in an order set by its place in the message, as Open MPI's
  /// ring algorithm does, so buckets could change the last bits).
  /// Builds the buckets at its first true answer.
  bool overlaps_gradient_reduction();
  void set_overlap_gradient_reduction(bool on) { overlap_ = on; }
  /// Seconds the last step spent on its data-parallel gradient reduction: in_backward inside the
  /// backward pass (starting buckets, MPI_Test polls), after_backward in finish_gradients (or
  /// finish_gradient_slices), both reset by the step's last forward_backward.
  struct ReductionTimes {
    double in_backward = 0, after_backward = 0;
  };
  const ReductionTimes& reduction_times() const { return reduction_times_; }
  /// Σ over DATA of a LossSum (the step's loss numerator and count).
  model::LossSum reduce_loss(model::LossSum local) const;

  /// Full HF tensors of a local param-shaped buffer (params, grads, AdamW moments): `full` (over
  /// full_layout()) receives every tensor on every rank. Collective over the model-parallel groups.
  void gather_full(model::Params<float>& full, const model::Params<float>& local) const;
  /// This rank's slices of full tensors (every rank passes the full buffer). No communication.
  void scatter_full(model::Params<float>& local, const model::Params<float>& full) const;

  // ---- LoRA (config.lora.rank > 0; docs/lora.md) ----------------------------------------------
  // The adapter table (model/lora.h) lives beside the frozen base with its own ShardPlan: A and B
  // split like their base linear (column-parallel: B on its rows; row-parallel: A on its
  // columns; 2D: both; ISP: rows over WEIGHT, gathered as the base's weights; modes/lora_plan.h),
  // summed over the ranks that saw other tokens. zero_grads, finish_gradients, the
  // gradient norms and ZeRO-1 slices act on the TRAINABLE table: the adapters under LoRA (the
  // base then gets no gradient), the model's parameters otherwise.
  bool has_lora() const { return lora_ != nullptr; }
  /// The adapted modules (full shapes, family names); empty without LoRA.
  const std::vector<model::LoraModule>& lora_modules() const;
  /// The trainable table: full and local layouts, plan, values and gradients.
  const model::ParamTable& train_full_layout() const;
  const model::ParamTable& train_layout() const;
  const ShardPlan& train_plan() const;
  model::Params<float>& train_params();
  model::Params<float>& train_grads();
  /// gather_full / scatter_full of the trainable table.
  void gather_train_full(model::Params<float>& full, const model::Params<float>& local) const;
  void scatter_train_full(model::Params<float>& local, const model::Params<float>& full) const;
  /// The optimizer step whose gradients the next forward_backward computes (LoRA dropout's mask).
  void set_lora_step(int64_t step);
  /// Switches the adapters off (`off`: the frozen base alone computes) or back on, for forwards
  /// only (forward_loss): the reference model of a preference run under LoRA. No-op without LoRA.
  void set_lora_adapters_off(bool off);
  /// After the base weights are loaded: holds them as `storage` says (model/lora.h). kBFloat16
  /// makes one bf16 copy of every matrix (linear weights, embedding, head), which the ops then
  /// read, and gives the fp32 matrices' pages back to the system (params() then reads 0 there);
  /// one process per model replica only (the "dense" mode, with data parallelism), else Error.
  /// No-op without LoRA or for kFloat32.
  void freeze_lora_base(model::LoraBaseStorage storage);

 private:
  ModeContext context() const { return ModeContext{full_, local_, plan_, grid_, compute_}; }
  /// Step 1 of finish_gradients: the plan's SUMs over the model-parallel groups.
  void plan_gradient_sums();
  /// Arms the buckets for this step's last backward: the all-reduce over the data-parallel
  /// group, or the reduce-scatter into slice_counts_.
  void arm_buckets();

  Grid grid_;  // validated against the model first (initialiser order matters)
  std::string mode_;
  const ModeFactory* factory_;
  model::ParamTable full_;
  ShardPlan plan_;
  model::ParamTable local_;
  model::Params<float> params_, grads_;
  ops::ComputeContext compute_;  // before model_: the ops hold references to it
  bool gradients_finished_ = false;  ///< finish_gradients ran since grads_ last changed
  std::vector<float> slice_scratch_;  // the reduce-scatters' receive buffer (kept between steps)
  std::vector<int64_t> slice_counts_;  // set_gradient_slices: empty = all-reduce
  std::unique_ptr<model::Decoder<float>> model_;

 public:
  struct Lora;  // modes/lora_engine.h

 private:
  std::unique_ptr<Lora> lora_;
  /// Builds lora_ (plan, table, drawn A) and wraps `ops`; called by the constructor.
  void build_lora(model::ModelOps<float>& ops);
  /// LoRA under a mode that feeds each rank part of the row: the global positions of its tokens.
  void set_lora_positions(const data::MicroBatch& row);
  model::Params<float>& tgrads();
  const model::Params<float>& tgrads() const;
  const ShardPlan& tplan() const;
  const model::ParamTable& tlocal() const;

  // The overlapped data-parallel reduction (built at its first use).
  bool overlap_ = true;
  std::unique_ptr<GradientBuckets> buckets_;
  ReductionTimes reduction_times_;
};

}  // namespace longtron::parallel
