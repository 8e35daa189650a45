// The process grid: which world ranks form the TENSOR, DATA, WEIGHT, WEIGHT_DATA, ZeRO-1 and 2D x/y
// groups of a layout (docs/parallel.md; InternEvo's process groups; MindSpeed's 2D
// groups). The rank arithmetic is pure (group_ranks) so it is
// testable without MPI; make_process_grid turns it into communicators with split().
//
// Rank layout (world = dp × tp):
// - TENSOR groups: tp consecutive ranks {b·tp … b·tp+tp−1}; tp = tensor.size, or x·y under 2D.
// - DATA groups: stride tp, {t, t+tp, t+2tp, …} (same tensor rank).
// - 2D: inside a TENSOR block, x-groups are x consecutive ranks, y-groups stride x (local tensor
//   rank r: x_rank = r mod x, y_rank = r div x).
// - ISP WEIGHT groups: W consecutive ranks; WEIGHT_DATA: stride W (same weight rank), size world/W.
// - ZeRO-1 groups: z consecutive members of the parent group (DATA, or WEIGHT_DATA under ISP), in
//   the parent's rank order; zero1 = -1 means the whole parent, 1 means off (groups of one).
//   ZERO1_REPLICA: members of the same parent group with the same ZeRO-1 rank (the ranks that hold
//   the same optimizer shard).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace longtron::comm {

/// Tensor-parallel mode (InternEvo's names): Megatron TP; + sequence parallel keeping the gathered
/// input (msp) or re-gathering it in backward (fsp); Intern SP = Ulysses + weight parallel (isp).
enum class TensorMode { kMtp, kMsp, kFsp, kIsp };

/// "mtp" | "msp" | "fsp" | "isp" → TensorMode; throws Error naming `key` otherwise.
TensorMode parse_tensor_mode(const std::string& name, const std::string& key = "parallel.tensor.mode");
const char* tensor_mode_name(TensorMode mode);

/// The parallel layout of the config (`parallel.*` keys).
struct Layout {
  int tensor_size = 1;                    ///< parallel.tensor.size (T)
  TensorMode tensor_mode = TensorMode::kMtp;  ///< parallel.tensor.mode
  int weight_size = 1;                    ///< parallel.weight.size (W), ISP only
  bool weight_overlap = false;            ///< parallel.weight.overlap: prefetch the next gather (ISP)
  int zero1_size = 1;                     ///< parallel.zero1.size: -1 whole group, 1 off, k
  int tensor_2d_x = 0;                    ///< parallel.tensor_2d.x (0 = 2D TP not used)
  int tensor_2d_y = 0;                    ///< parallel.tensor_2d.y
  /// parallel.tensor_2d.overlap: one of parallel::overlap_2d_names() (checked by the engine before
  /// any allocation, parallel/tp2d_overlap.h).
  std::string tensor_2d_overlap = "none";
  /// parallel.sequence_2D (2D-Attention under isp, docs/isp.md): the TENSOR group is head_size ×
  /// context_size ranks; head_first = head groups of consecutive ranks (InternEvo's placement).
  bool seq2d = false;
  int seq2d_head = 1, seq2d_context = 1, seq2d_window = 1;
  bool seq2d_head_first = true, seq2d_interleaved = false;
  std::string seq2d_balance = "zigzag";  ///< "contiguous" | "zigzag" | "document"
  /// Context parallelism as ring attention (default) or, false, as an all-gather of the row's
  /// K/V (parallel/cp_attention.h). Not a config key: benchmarks and tests compare the forms.
  bool seq2d_ring = true;
  bool is_2d() const { return tensor_2d_x > 0 || tensor_2d_y > 0; }
  /// Size of one TENSOR group: T, or x·y under 2D.
  int tp() const { return is_2d() ? tensor_2d_x * tensor_2d_y : tensor_size; }
};

/// The group kinds a grid provides.
enum class Group { kTensor, kData, kWeight, kWeightData, kZero1, kZero1Replica, kX, kY };
const char* group_name(Group group);

/// Throws Error (naming the parallel.* key and both numbers) unless the layout fits `world_size`:
/// sizes >= 1 (zero1 also -1), world divisible by tp (and by W under ISP), weight only with isp,
/// tensor and tensor_2d not both, x and y both >= 1, zero1 dividing its parent group.
void validate_layout(const Layout& layout, int world_size);

/// The model sizes whose divisibility the layout constrains.
struct ModelShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t hidden_size = 0;
  int64_t packed_length = 0;  ///< P: tokens of one packed row (micro_bsz × seq_len)
};

/// validate_layout plus the model constraints, each named in its error: heads and kv heads by T
/// (mtp/msp/fsp); P by T (msp/fsp/isp); under isp heads by T and kv heads by T or T by kv heads
/// (repetition), hidden by W (embedding split on hidden); under 2D heads and kv heads by x, the
/// per-x heads by y, kv heads per x by y or y by them, P by x and by y, hidden by y.
void validate_model_layout(const Layout& layout, int world_size, const ModelShape& shape);

/// (head rank, context rank) of TENSOR rank t under parallel.sequence_2D: head_first → t % head,
/// t / head; context first → t / context, t % context. (t, 0) when sequence_2D is off.
std::pair<int, int> sequence_2d_ranks(const Layout& layout, int t);

/// World ranks (ascending group-rank order) of the `group` that world rank `rank` belongs to.
/// Pure arithmetic; the layout must be valid. Groups that do not apply to the layout (WEIGHT without
/// isp, X/Y without 2D) are the rank alone.
std::vector<int> group_ranks(const Layout& layout, int world_size, Group group, int rank);

/// One rank's communicators for every group of the layout. `world` is kept too.
struct ProcessGrid {
  Layout layout;
  int world_size = 1;
  int world_rank = 0;
  int tp = 1;  ///< TENSOR group size
  int dp = 1;  ///< DATA group size = world / tp
  CommPtr world, tensor, data, weight, weight_data, zero1, zero1_replica, x, y;
  /// 2D-Attention: the HEAD group (Ulysses all-to-all; = tensor when sequence_2D is off) and the
  /// CONTEXT group (context-parallel attention; one rank when off), both inside TENSOR.
  CommPtr head, context;
  /// The communicator of a group kind.
  const CommPtr& get(Group group) const;
};

/// Validates the layout against world->size(), then splits `world` into every group (collective
/// over world: every rank must call it with the same layout).
ProcessGrid make_process_grid(const CommPtr& world, const Layout& layout);

}  // namespace longtron::comm
