// Group arithmetic of a process grid (see process_grid.h).
#include "comm/process_grid.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::comm {

const char* group_name(Group group) {
  switch (group) {
    case Group::kTensor: return "tensor";
    case Group::kData: return "data";
    case Group::kWeight: return "weight";
    case Group::kWeightData: return "weight_data";
    case Group::kZero1: return "zero1";
    case Group::kZero1Replica: return "zero1_replica";
    case Group::kX: return "x";
    case Group::kY: return "y";
  }
  return "unknown";
}

void validate_grid(const GridShape& s, int world) {
  check(world >= 1 && s.tp >= 1 && s.weight >= 0 && s.x >= 0 && s.y >= 0,
        "process grid: sizes must be positive (world {}, tensor {}, weight {}, x {}, y {})", world,
        s.tp, s.weight, s.x, s.y);
  check(world % s.tp == 0, "process grid: world size {} is not divisible by the tensor size {}",
        world, s.tp);
  check(s.weight == 0 || world % s.weight == 0,
        "process grid: world size {} is not divisible by the weight size {}", world, s.weight);
  check(s.x == 0 || s.x * s.y == s.tp, "process grid: x ({}) · y ({}) must equal the tensor size {}",
        s.x, s.y, s.tp);
  check(s.head == 0 || (s.context >= 1 && s.head * s.context == s.tp),
        "process grid: head ({}) · context ({}) must equal the tensor size {}", s.head, s.context,
        s.tp);
  const int parent = s.weight > 0 ? world / s.weight : world / s.tp;
  check(s.zero1 == -1 || (s.zero1 >= 1 && parent % s.zero1 == 0),
        "process grid: the ZeRO-1 size {} does not divide its parent group size {}", s.zero1,
        parent);
}

std::pair<int, int> head_context_ranks(const GridShape& s, int t) {
  if (s.head == 0) return {t, 0};
  if (s.head_first) return {t % s.head, t / s.head};
  return {t / s.context, t % s.context};
}

static std::vector<int> range(int start, int count, int stride) {
  std::vector<int> r(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) r[size_t(i)] = start + i * stride;
  return r;
}

std::vector<int> group_ranks(const GridShape& l, int world, Group group, int rank) {
  const int tp = l.tp;
  const int block = rank / tp * tp, t = rank % tp;
  const bool isp = l.weight > 0;
  const int W = l.weight;
  switch (group) {
    case Group::kTensor: return range(block, tp, 1);
    case Group::kData: return range(t, world / tp, tp);
    case Group::kWeight: return isp ? range(rank / W * W, W, 1) : std::vector<int>{rank};
    case Group::kWeightData: return isp ? range(rank % W, world / W, W) : range(t, world / tp, tp);
    case Group::kZero1:
    case Group::kZero1Replica: {
      std::vector<int> parent = group_ranks(l, world, Group::kWeightData, rank);
      const int n = int(parent.size());
      const int z = l.zero1 == -1 ? n : l.zero1;
      const int p = int(std::find(parent.begin(), parent.end(), rank) - parent.begin());
      std::vector<int> out;
      if (group == Group::kZero1)
        for (int i = p / z * z; i < p / z * z + z; ++i) out.push_back(parent[size_t(i)]);
      else
        for (int i = p % z; i < n; i += z) out.push_back(parent[size_t(i)]);
      return out;
    }
    case Group::kX:
      if (l.x == 0) return {rank};
      return range(block + t / l.x * l.x, l.x, 1);
    case Group::kY:
      if (l.x == 0) return {rank};
      return range(block + t % l.x, l.y, l.x);
  }
  return {rank};
}

const CommPtr& ProcessGrid::get(Group group) const {
  switch (group) {
    case Group::kTensor: return tensor;
    case Group::kData: return data;
    case Group::kWeight: return weight;
    case Group::kWeightData: return weight_data;
    case Group::kZero1: return zero1;
    case Group::kZero1Replica: return zero1_replica;
    case Group::kX: return x;
    case Group::kY: return y;
  }
  return world;
}

ProcessGrid make_process_grid(const CommPtr& world, const GridShape& layout) {
  ProcessGrid g;
  g.shape = layout;
  g.world = world;
  g.world_size = world->size();
  g.world_rank = world->rank();
  validate_grid(layout, g.world_size);
  g.tp = layout.tp;
  g.dp = g.world_size / g.tp;
  auto make = [&](Group group) {
    std::vector<int> ranks = group_ranks(layout, g.world_size, group, g.world_rank);
    int key = int(std::find(ranks.begin(), ranks.end(), g.world_rank) - ranks.begin());
    // The lowest world rank names the group; the position in it orders the members.
    return world->split(ranks.front(), key);
  };
  g.tensor = make(Group::kTensor);
  g.data = make(Group::kData);
  g.weight = make(Group::kWeight);
  g.weight_data = make(Group::kWeightData);
  g.zero1 = make(Group::kZero1);
  g.zero1_replica = make(Group::kZero1Replica);
  g.x = make(Group::kX);
  g.y = make(Group::kY);
  if (layout.head > 0) {  // both inside TENSOR: same context rank → one head group, and vice versa
    const auto [h, c] = head_context_ranks(layout, g.tensor->rank());
    g.head = g.tensor->split(c, h);
    g.context = g.tensor->split(h, c);
  } else {
    g.head = g.tensor;
    g.context = make_local_communicator();
  }
  return g;
}

}  // namespace longtron::comm
