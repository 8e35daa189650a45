// The sharded parameter plan: for every full (HF-named) tensor of a model, which part this rank
// holds and over which groups its gradient must be summed (docs/parallel.md; Megatron's
// tensor_model_parallel / sequence_parallel parameter attributes, InternEvo's ISP/ZeRO groups).
//
// A plan starts with every tensor replicated. A mode then
// - split()s a tensor along one dim over one group (uneven ranges by shard_range, or an explicit
//   range such as whole kv-head groups of wqkv); a tensor may be split on several dims over
//   several groups (2D TP: dim 0 over X, dim 1 over Y);
// - marks sum_gradient(group) on a replicated (or partly replicated) tensor when the ranks of that
//   group saw different tokens of it: norm weights under MSP/FSP/ISP/2D, row-parallel biases under
//   sequence parallel. The engine SUMs those gradients over the group before the data-parallel SUM.
// local_layout() is then a model::ParamTable with the same names, order and view indices as the
// full layout but local shapes, so params, gradients, optimizer state and ZeRO-1 slices of a rank
// are flat buffers and offset arithmetic, exactly as in one process.
#pragma once
#include <cstdint>
#include <vector>

#include "model/params.h"
#include "parallel/layout.h"

namespace longtron::parallel {

/// One split of one tensor: along `dim`, this rank holds [start, start + count) of the full
/// extent, and the other ranks of `group` hold the other ranges (together they cover it once).
struct Split {
  int dim = 0;
  comm::Group group = comm::Group::kTensor;
  int parts = 1;       ///< size of the group
  int64_t start = 0;   ///< first index held on `dim`
  int64_t count = 0;   ///< extent held on `dim`
};

/// How one tensor is held.
struct TensorPlan {
  std::vector<Split> splits;                 ///< empty = replicated on every rank
  std::vector<comm::Group> grad_sum_groups;  ///< SUM the gradient over these groups (in order)
  /// Number of ranks of one model replica holding each element = model-parallel size / Π parts.
  int64_t split_parts() const;
};

class ShardPlan {
 public:
  /// Every tensor of `full` replicated. `full` must outlive the plan.
  ShardPlan(const model::ParamTable& full, const Grid& grid);

  /// Splits view `view` along `dim` over `group` with the uneven rule shard_range (the first
  /// extent % size ranks hold one more). Throws Error if that dim is already split.
  void split(int view, int dim, comm::Group group);
  /// Splits view `view` along `dim` over `group`, this rank holding [start, start + count)
  /// (the caller guarantees the ranks' ranges tile the extent).
  void split_range(int view, int dim, comm::Group group, int64_t start, int64_t count);
  /// Splits the attention of block `b` over `group` by whole kv-head groups (Megatron's split of
  /// grouped-query attention): this rank holds the wqkv rows (and bias) of its Hkv / size kv groups
  /// (each: its query heads, then k, then v; model/hf_names.h) and the wo columns of their query
  /// heads. The group size must divide the kv heads (the mode's validate checks it).
  void split_attention_heads(const model::BlockParamIds& b, comm::Group group);
  /// The gradient of view `view` is SUMMED over `group` in finish_gradients (ranks saw different
  /// tokens). A view with index -1 (absent bias) is ignored.
  void sum_gradient(int view, comm::Group group);

  const model::ParamTable& full_layout() const { return *full_; }
  const Grid& grid() const { return *grid_; }
  const TensorPlan& tensor(int view) const { return plans_.at(static_cast<size_t>(view)); }
  int num_views() const { return static_cast<int>(plans_.size()); }

  /// The local layout (same names and view indices, local shapes, offsets recomputed).
  model::ParamTable local_layout() const;
  /// Local shape of view `view`.
  std::vector<int64_t> local_shape(int view) const;

  /// The part of view `view` this rank holds, as a block of the full tensor seen as a matrix of
  /// `full_cols` columns (a 1-D tensor is one row): rows [row0, row0 + rows) × columns
  /// [col0, col0 + cols), stored row-major (rows × cols) in the local buffer.
  struct Block {
    int64_t row0 = 0, rows = 1, col0 = 0, cols = 1, full_cols = 1;
  };
  Block block(int view) const;
  /// local[local numel] = this rank's part of full[full numel] of view `view` (1-D or 2-D).
  void slice(float* local, const float* full, int view) const;
  /// Writes local into its place in full (other elements untouched).
  void unslice(float* full, const float* local, int view) const;

 private:
  void add_split(int view, Split s);
  const model::ParamTable* full_;
  const Grid* grid_;
  std::vector<TensorPlan> plans_;
};

}  // namespace longtron::parallel
