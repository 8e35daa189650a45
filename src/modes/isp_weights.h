// ISP weight parallel (InternEvo "isp"; docs/isp.md):
// every linear weight and the head are sharded on dim 0 (output features) over the WEIGHT group,
// the embedding on its hidden dim. A weight is all-gathered before its forward and again before
// its backward; its full-shape gradient (from this rank's tokens only) is reduce-scattered with SUM
// so each rank ends with its shard's exact gradient over every token of the WEIGHT group
// (docs/parallel.md: partial gradients of sequence shards are summed, not averaged as InternEvo does).
//
// Tokens stay local: a rank computes on its own [P/T, in] activations with the full weight.
// With overlap on, IspWeightStore starts the gather of the weight it predicts comes next (an async
// Work) before returning the current one, so the next gather runs while this layer computes
// (InternEvo prefetches block i+1 from a pre-forward hook). The prediction is the recorded order of
// the previous pass (see acquire); a wrong guess costs a wasted gather, never a wrong result.
//
// Mixed precision (model.dtype = "bfloat16"): a weight read only by GEMMs (the linears, the head)
// is gathered as bf16. Each rank's shard comes from the step's bf16 copy
// (ops::ComputeContext::weights():
// rounded once a step, round-to-nearest-even) or is rounded at the gather when no scope is alive;
// the all-gather moves 2 bytes a weight instead of 4 and the GEMMs read the gathered bits directly
// (ops::gemm_bf16_weight). Rounding commutes with gathering, so the products are bitwise those of
// rounding the gathered fp32 weight. The embedding's lookup reads fp32 values, so its table is
// gathered in fp32; gradients are reduce-scattered in fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layers.h"
#include "parallel/vocab_parallel.h"

namespace longtron::parallel {

/// Which computation uses a weight (the key of the prefetch order).
enum class WeightUse { kForward, kBackward };

/// The gathered copies of one rank's weight-parallel weights. Shards are read from the Params the
/// ops receive (view index → this rank's shard), so any buffer whose view `v` holds the shard works.
/// Sharding: dim 0 uses shard_range (uneven allowed: padded collectives); dim 1 needs cols % W == 0
/// and the gathered form is chunk-major [W][rows][cols/W].
class IspWeightStore {
 public:
  /// `weight`: the WEIGHT group; `overlap`: parallel.weight.overlap; `cc`: the precision of the
  /// ops that share this store (it must outlive them): under kBFloat16 they gather bf16 weights.
  IspWeightStore(comm::CommPtr weight, bool overlap,
                 const ops::ComputeContext& cc = ops::ComputeContext::fp32());
  ~IspWeightStore();

  /// Registers the full tensor [rows, cols] of view `view`, sharded on `dim` (0 or 1). Returns its id.
  /// Throws Error if dim is 1 and W does not divide cols.
  int add(int view, int64_t rows, int64_t cols, int dim);
  /// add for a tensor of another buffer than the ops' (the LoRA adapters' table): its shard is read
  /// from `source` (which must outlive the store) whatever Params acquire is given, so that its
  /// gather can be prefetched from any op's acquire.
  int add(const model::Params<float>* source, int view, int64_t rows, int64_t cols, int dim);

  /// Starts a forward pass (IspEmbedding::forward calls it: the embedding is the first op of every
  /// pass). The parameters may have changed since the last pass, so gathered copies and prefetches
  /// are dropped, and the prediction restarts at the beginning of the recorded order. Local.
  /// Throws Error when a weight was gathered for a forward after the last pass's backward (an op
  /// ran before the embedding, so it may have read a copy the optimizer step made stale).
  void begin_pass();

  /// The gathered weight `id` ([rows, cols] for dim 0, [W][rows][cols/W] for dim 1), valid until
  /// the next acquire. With overlap, also starts the gather of the predicted next weight (the
  /// recorded order of the last pass, see begin_pass) before returning.
  /// Collective over the WEIGHT group (every rank acquires in the same order).
  const float* acquire(int id, WeightUse use, const model::Params<float>& params);

  /// acquire in bf16: the gathered weight `id` as raw bf16 bits (dim 0 only: [rows, cols]), the
  /// round-to-nearest-even of the fp32 weight; the all-gather moves 2 bytes an element. Shards
  /// come from the compute context's bf16 weight copy (rounded once a step) when the params lie in
  /// it, else are rounded here. A weight gathered in both precisions is two keys of the
  /// prefetch order. Collective as acquire; throws Error for a dim-1 tensor.
  const uint16_t* acquire_bf16(int id, WeightUse use, const model::Params<float>& params);

  /// grad_shard (+=) = this rank's chunk of Σ over the WEIGHT group of full_grad, which is in the
  /// gathered form of `id` and is clobbered. Collective over the WEIGHT group.
  void reduce_grad(float* grad_shard, float* full_grad, int id);

  /// Scratch of at least `n` floats for a full-shape gradient (shared by all ops of this rank).
  float* grad_scratch(int64_t n);

  /// This rank's part of tensor `id`: rows (dim 0) or cols (dim 1) [start, start + count).
  Range shard(int id) const;
  int weight_size() const { return W_; }
  int weight_rank() const { return rank_; }
  bool overlap() const { return overlap_; }
  const ops::ComputeContext& compute() const { return cc_; }
  comm::Communicator& comm() { return *comm_; }
  /// Prefetches started / prefetches that were used (for tests and the benchmark).
  int64_t prefetches_started() const { return started_; }
  int64_t prefetches_used() const { return used_; }

 private:
  const ops::ComputeContext& cc_;
  struct Entry {
    int view;
    int64_t rows, cols;
    int dim;
    std::vector<int64_t> counts;  // elements of each rank's shard
    int64_t max_count;            // padded chunk of the collectives
    const model::Params<float>* source = nullptr;  // the shard's buffer (nullptr: acquire's)
  };
  // A gathered weight: fp32 or bf16 elements in one byte buffer (implicitly creates either).
  struct Slot {
    int id = -1;
    bool bf16 = false;
    std::vector<std::byte> buf;
    comm::Work work;
  };
  struct Key {
    int id;
    WeightUse use;
    bool bf16;
    bool operator==(const Key&) const = default;
  };
  Slot& acquire_slot(const Key& key, const model::Params<float>& params);
  void start_gather(Slot& slot, int id, bool bf16, const model::Params<float>& params);
  void finish_gather(Slot& slot);

  comm::CommPtr comm_;
  int W_, rank_;
  bool overlap_;
  std::vector<Entry> entries_;
  Slot current_, next_;
  std::vector<float> send_, recv_, grad_;
  // Prefetch order: the keys of the last pass; pos_ = how many of them this pass has matched.
  std::vector<Key> trace_;
  size_t pos_ = 0;
  bool recording_ = true;
  // The call-order check of begin_pass: this pass has gathered for a backward, and then (not a
  // recomputation, which is followed by more backward gathers) for a forward.
  bool backward_seen_ = false, forward_after_backward_ = false;
  const model::Params<float>* ops_params_ = nullptr;  // the Params the ops' acquires last gave
  int64_t started_ = 0, used_ = 0;
};

/// y = x·Wᵀ (+ b) with W [out, in] sharded on rows over WEIGHT (gathered per use). The bias, if
/// any, is replicated (full [out] on every rank): its gradient is a partial sum over this rank's
/// tokens that the engine sums over every rank, like the norm weights.
class IspLinear final : public model::LinearOp<float> {
 public:
  IspLinear(std::shared_ptr<IspWeightStore> store, int weight_view, int bias_view, int64_t out,
            int64_t in);
  int64_t in() const override { return in_; }
  int64_t out() const override { return out_; }
  void forward(float* y, const float* x, int64_t N, const model::Params<float>& params) override;
  /// Under bf16 without a bias: the gathered bf16 weight's GEMM writes y's bits.
  bool forward_out16(uint16_t* y16, const float* x, int64_t N,
                     const model::Params<float>& params) override;
  void backward(float* dx, const float* dy, const float* x, int64_t N,
                const model::Params<float>& params, model::Params<float>* grads,
                bool accumulate_dx) override;
  /// Under bf16 every GEMM takes x through ops::bf16_operands (the bits `cc` shares).
  bool reads_shared_input_bits_only(const ops::ComputeContext& cc) const override {
    return &cc == &store_->compute() && cc.bf16();
  }

 private:
  std::shared_ptr<IspWeightStore> store_;
  int id_, weight_view_, bias_view_;
  int64_t out_, in_;
};

/// Token embedding with the table [V, H] sharded on H over WEIGHT (dim 1: InternEvo's [vocab,
/// hidden/wp]) or, for a table tied to the head (tie_word_embeddings), on vocabulary rows as the
/// head (dim 0: one shard for both uses); gathered before forward; backward reduce-scatters the
/// full-table gradient of this rank's tokens (into the shard the head's gradient also adds into).
class IspEmbedding final : public model::EmbeddingOp<float> {
 public:
  IspEmbedding(std::shared_ptr<IspWeightStore> store, int table_view, int64_t V, int64_t H,
               int dim = 1);
  void forward(float* x, const int32_t* ids, int64_t N, const model::Params<float>& params) override;
  void backward(const float* dx, const int32_t* ids, int64_t N,
                model::Params<float>* grads) override;
  /// The store whose passes this embedding begins (other weights of the model join it: LoRA).
  const std::shared_ptr<IspWeightStore>& store() const { return store_; }

 private:
  std::shared_ptr<IspWeightStore> store_;
  int id_, view_, dim_;
  int64_t V_, H_, Hl_;
};

/// Weight-parallel head [V, H] (rows sharded over WEIGHT, gathered) + cross-entropy over this
/// rank's own tokens and labels (the labels were computed on the whole row before the split, so no
/// target is lost). Each rank's (loss sum, count) is over its own labels — a rank with no valid
/// label has (0, 0), never NaN; when `tensor` is given the pair is then summed exactly (double
/// sum, integer count) over the TENSOR group, so every rank of a row returns the row's loss (the
/// engine sums rows over the data-parallel group). token_losses stay per local token.
class IspHeadLoss final : public model::HeadLossOp<float> {
 public:
  IspHeadLoss(std::shared_ptr<IspWeightStore> store, int weight_view, int64_t V, int64_t H,
              comm::CommPtr tensor = nullptr);
  model::LossSum forward_backward(float* dxf, const float* xf, const int32_t* labels, int64_t N,
                                  const model::Params<float>& params, model::Params<float>* grads,
                                  double loss_scale, double* token_losses) override;
  void logits_row(float* logits, const float* xf, const model::Params<float>& params) override;

 private:
  std::shared_ptr<IspWeightStore> store_;
  comm::CommPtr tensor_;
  int id_, view_;
  int64_t V_, H_;
  model::HeadChunks<float> chunks_;
};

}  // namespace longtron::parallel
