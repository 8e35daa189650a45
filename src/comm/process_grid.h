// The process grid: which world ranks form the TENSOR, DATA, WEIGHT, WEIGHT_DATA, ZeRO-1, 2D x/y and
// HEAD/CONTEXT groups (docs/parallel.md; InternEvo's process groups; MindSpeed's 2D groups). This
// file knows ranks and groups only: what a layout means (modes, their size rules) is
// parallel/layout.h, which turns a config layout into a GridShape. The rank arithmetic is pure
// (group_ranks) so it is testable without MPI; make_process_grid turns it into communicators with
// split().
//
// Rank layout (world = dp × tp):
// - TENSOR groups: tp consecutive ranks {b·tp … b·tp+tp−1}.
// - DATA groups: stride tp, {t, t+tp, t+2tp, …} (same tensor rank).
// - X/Y (when x > 0): inside a TENSOR block, x-groups are x consecutive ranks, y-groups stride x
//   (local tensor rank r: x_rank = r mod x, y_rank = r div x).
// - WEIGHT groups (when weight > 0): `weight` consecutive ranks; WEIGHT_DATA: stride weight (same
//   weight rank), size world/weight. Without WEIGHT groups WEIGHT is the rank alone and WEIGHT_DATA
//   is DATA.
// - ZeRO-1 groups: z consecutive members of the parent group (WEIGHT_DATA), in the parent's rank
//   order; zero1 = -1 means the whole parent, 1 means off (groups of one). ZERO1_REPLICA: members
//   of the same parent group with the same ZeRO-1 rank (the ranks that hold the same optimizer
//   shard).
// - HEAD × CONTEXT (when head > 0): TENSOR split in two; head_first = head groups of consecutive
//   ranks. Otherwise HEAD is TENSOR and CONTEXT the rank alone.
#pragma once
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace longtron::comm {

/// The group geometry of a grid: sizes and placement of every group kind.
struct GridShape {
  int tp = 1;       ///< TENSOR group size
  int x = 0, y = 0;  ///< X and Y group sizes inside TENSOR (x·y = tp); 0 = no X/Y groups
  int weight = 0;   ///< WEIGHT group size; 0 = no WEIGHT groups
  int zero1 = 1;    ///< ZeRO-1 group size inside WEIGHT_DATA: -1 whole group, 1 off, k
  int head = 0, context = 0;  ///< HEAD × CONTEXT = TENSOR; 0 = no split
  bool head_first = true;     ///< head groups of consecutive ranks
};

/// The group kinds a grid provides.
enum class Group { kTensor, kData, kWeight, kWeightData, kZero1, kZero1Replica, kX, kY };
const char* group_name(Group group);

/// Throws Error unless the shape fits `world_size`: sizes >= 1, world divisible by tp and weight,
/// x·y = tp, head·context = tp, zero1 dividing its parent group. (parallel::validate_layout gives
/// the same rules in the words of the config keys first.)
void validate_grid(const GridShape& shape, int world_size);

/// (head rank, context rank) of TENSOR rank t: head_first → t % head, t / head; context first →
/// t / context, t % context. (t, 0) when there is no head/context split.
std::pair<int, int> head_context_ranks(const GridShape& shape, int t);

/// World ranks (ascending group-rank order) of the `group` that world rank `rank` belongs to.
/// Pure arithmetic; the shape must be valid. Groups the shape does not have (WEIGHT, X/Y) are the
/// rank alone.
std::vector<int> group_ranks(const GridShape& shape, int world_size, Group group, int rank);

/// One rank's communicators for every group of a grid. `world` is kept too.
struct ProcessGrid {
  GridShape shape;
  int world_size = 1;
  int world_rank = 0;
  int tp = 1;  ///< TENSOR group size
  int dp = 1;  ///< DATA group size = world / tp
  CommPtr world, tensor, data, weight, weight_data, zero1, zero1_replica, x, y;
  /// The HEAD group (Ulysses all-to-all; = tensor without a head/context split) and the CONTEXT
  /// group (context-parallel attention; one rank without), both inside TENSOR.
  CommPtr head, context;
  /// The communicator of a group kind.
  const CommPtr& get(Group group) const;
};

/// Validates the shape against world->size(), then splits `world` into every group (collective
/// over world: every rank must call it with the same shape).
ProcessGrid make_process_grid(const CommPtr& world, const GridShape& shape);

}  // namespace longtron::comm
