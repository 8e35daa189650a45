// Group arithmetic and validation of a parallel layout (see process_grid.h).
#include "comm/process_grid.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::comm {

TensorMode parse_tensor_mode(const std::string& name, const std::string& key) {
  if (name == "mtp") return TensorMode::kMtp;
  if (name == "msp") return TensorMode::kMsp;
  if (name == "fsp") return TensorMode::kFsp;
  if (name == "isp") return TensorMode::kIsp;
  fail("{} = \"{}\": expected one of \"mtp\", \"msp\", \"fsp\", \"isp\"", key, name);
}

const char* tensor_mode_name(TensorMode mode) {
  switch (mode) {
    case TensorMode::kMtp: return "mtp";
    case TensorMode::kMsp: return "msp";
    case TensorMode::kFsp: return "fsp";
    case TensorMode::kIsp: return "isp";
  }
  return "unknown";
}

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

static bool is_isp(const Layout& l) { return !l.is_2d() && l.tensor_mode == TensorMode::kIsp; }

// Size of the group ZeRO-1 shards live in: WEIGHT_DATA under ISP, DATA otherwise.
static int zero1_parent_size(const Layout& l, int world) {
  return is_isp(l) ? world / l.weight_size : world / l.tp();
}

// InternEvo's rules for parallel.sequence_2D (internlm/initialize/launch.py and the 2D
// sequence-parallel process-group initializer), with the sizes named.
static void validate_sequence_2d(const Layout& l) {
  check(is_isp(l), "parallel.sequence_2D.enable = true needs parallel.tensor.mode = \"isp\" "
        "(2D-Attention splits ISP's sequence-parallel group)");
  check(l.seq2d_head >= 1 && l.seq2d_context >= 1 && l.seq2d_window >= 1,
        "parallel.sequence_2D: head_size, context_size and window_size must be >= 1, got {}, {}, {}",
        l.seq2d_head, l.seq2d_context, l.seq2d_window);
  check(l.seq2d_head * l.seq2d_context == l.tensor_size,
        "parallel.sequence_2D: head_size ({}) x context_size ({}) must equal parallel.tensor.size "
        "({})",
        l.seq2d_head, l.seq2d_context, l.tensor_size);
  check(l.seq2d_context % l.seq2d_window == 0,
        "parallel.sequence_2D: window_size ({}) must divide context_size ({})", l.seq2d_window,
        l.seq2d_context);
  check(!(l.seq2d_head_first && l.seq2d_head > 1 && l.seq2d_interleaved),
        "parallel.sequence_2D.device_placement_strategy: interleaved = true needs head_first = "
        "false when head_size ({}) > 1",
        l.seq2d_head);
  const std::string& b = l.seq2d_balance;
  check(b == "contiguous" || b == "zigzag" || b == "document",
        "parallel.sequence_2D.balance must be \"contiguous\", \"zigzag\" or \"document\", got "
        "\"{}\"",
        b);
}

std::pair<int, int> sequence_2d_ranks(const Layout& l, int t) {
  if (!l.seq2d) return {t, 0};
  if (l.seq2d_head_first) return {t % l.seq2d_head, t / l.seq2d_head};
  return {t / l.seq2d_context, t % l.seq2d_context};
}

void validate_layout(const Layout& l, int world) {
  check(world >= 1, "world size must be >= 1, got {}", world);
  if (l.is_2d()) {
    check(l.tensor_size == 1,
          "parallel.tensor (size {}) and parallel.tensor_2d cannot be used together",
          l.tensor_size);
    check(l.tensor_2d_x >= 1 && l.tensor_2d_y >= 1,
          "parallel.tensor_2d: x and y must both be >= 1, got x = {}, y = {}", l.tensor_2d_x,
          l.tensor_2d_y);
  }
  check(l.tensor_size >= 1, "parallel.tensor.size must be >= 1, got {}", l.tensor_size);
  check(l.weight_size >= 1, "parallel.weight.size must be >= 1, got {}", l.weight_size);
  check(l.weight_size == 1 || is_isp(l),
        "parallel.weight.size = {} needs parallel.tensor.mode = \"isp\" (weight parallel is ISP's)",
        l.weight_size);
  if (l.seq2d) validate_sequence_2d(l);
  int tp = l.tp();
  check(world % tp == 0,
        "world size {} is not divisible by the tensor-parallel size {} ({}); world = dp × tp",
        world, tp, l.is_2d() ? "parallel.tensor_2d x·y" : "parallel.tensor.size");
  check(world % l.weight_size == 0, "world size {} is not divisible by parallel.weight.size {}",
        world, l.weight_size);
  int parent = zero1_parent_size(l, world);
  check(l.zero1_size == -1 || l.zero1_size >= 1,
        "parallel.zero1.size must be -1 (whole group), 1 (off) or a group size, got {}",
        l.zero1_size);
  check(l.zero1_size == -1 || parent % l.zero1_size == 0,
        "parallel.zero1.size {} does not divide the {} group size {}", l.zero1_size,
        is_isp(l) ? "weight-data" : "data-parallel", parent);
}

static void need_divisible(int64_t a, int64_t b, const char* what_a, const char* what_b) {
  check(b > 0 && a % b == 0, "{} ({}) is not divisible by {} ({})", what_a, a, what_b, b);
}

void validate_model_layout(const Layout& l, int world, const ModelShape& s) {
  validate_layout(l, world);
  check(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0,
        "num_attention_heads ({}) must be a positive multiple of num_kv_attention_heads ({})",
        s.num_heads, s.num_kv_heads);
  if (l.is_2d()) {
    int64_t x = l.tensor_2d_x, y = l.tensor_2d_y;
    need_divisible(s.num_heads, x, "num_attention_heads", "parallel.tensor_2d.x");
    need_divisible(s.num_kv_heads, x, "num_kv_attention_heads", "parallel.tensor_2d.x");
    need_divisible(s.num_heads / x, y, "attention heads per x rank", "parallel.tensor_2d.y");
    int64_t kv = s.num_kv_heads / x;
    check(kv % y == 0 || y % kv == 0,
          "kv heads per x rank ({}) and parallel.tensor_2d.y ({}) must divide one another", kv, y);
    need_divisible(s.packed_length, x, "packed row length P", "parallel.tensor_2d.x");
    need_divisible(s.packed_length, y, "packed row length P", "parallel.tensor_2d.y");
    need_divisible(s.hidden_size, y, "hidden_size", "parallel.tensor_2d.y");
    return;
  }
  int64_t T = l.tensor_size;
  if (l.seq2d) {  // Ulysses over the head group only: the context size is free of the heads
    const int64_t hp = l.seq2d_head;
    need_divisible(s.num_heads, hp, "num_attention_heads", "parallel.sequence_2D.head_size");
    check(s.num_kv_heads % hp == 0 || hp % s.num_kv_heads == 0,
          "num_kv_attention_heads ({}) and parallel.sequence_2D.head_size ({}) must divide one "
          "another (kv heads are repeated when head_size > kv heads)",
          s.num_kv_heads, hp);
  } else {
    need_divisible(s.num_heads, T, "num_attention_heads", "parallel.tensor.size");
  }
  if (l.tensor_mode == TensorMode::kIsp) {
    check(l.seq2d || s.num_kv_heads % T == 0 || T % s.num_kv_heads == 0,
          "num_kv_attention_heads ({}) and parallel.tensor.size ({}) must divide one another "
          "(ISP repeats kv heads when T > kv heads)",
          s.num_kv_heads, T);
    need_divisible(s.hidden_size, l.weight_size, "hidden_size", "parallel.weight.size");
  } else {
    need_divisible(s.num_kv_heads, T, "num_kv_attention_heads", "parallel.tensor.size");
  }
  if (l.tensor_mode != TensorMode::kMtp)
    need_divisible(s.packed_length, T, "packed row length P", "parallel.tensor.size");
}

static std::vector<int> range(int start, int count, int stride) {
  std::vector<int> r(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) r[size_t(i)] = start + i * stride;
  return r;
}

std::vector<int> group_ranks(const Layout& l, int world, Group group, int rank) {
  const int tp = l.tp();
  const int block = rank / tp * tp, t = rank % tp;
  const bool isp = is_isp(l);
  const int W = l.weight_size;
  switch (group) {
    case Group::kTensor: return range(block, tp, 1);
    case Group::kData: return range(t, world / tp, tp);
    case Group::kWeight: return isp ? range(rank / W * W, W, 1) : std::vector<int>{rank};
    case Group::kWeightData: return isp ? range(rank % W, world / W, W) : range(t, world / tp, tp);
    case Group::kZero1:
    case Group::kZero1Replica: {
      std::vector<int> parent = group_ranks(l, world, Group::kWeightData, rank);
      const int n = int(parent.size());
      const int z = l.zero1_size == -1 ? n : l.zero1_size;
      const int p = int(std::find(parent.begin(), parent.end(), rank) - parent.begin());
      std::vector<int> out;
      if (group == Group::kZero1)
        for (int i = p / z * z; i < p / z * z + z; ++i) out.push_back(parent[size_t(i)]);
      else
        for (int i = p % z; i < n; i += z) out.push_back(parent[size_t(i)]);
      return out;
    }
    case Group::kX:
      if (!l.is_2d()) return {rank};
      return range(block + t / l.tensor_2d_x * l.tensor_2d_x, l.tensor_2d_x, 1);
    case Group::kY:
      if (!l.is_2d()) return {rank};
      return range(block + t % l.tensor_2d_x, l.tensor_2d_y, l.tensor_2d_x);
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

ProcessGrid make_process_grid(const CommPtr& world, const Layout& layout) {
  ProcessGrid g;
  g.layout = layout;
  g.world = world;
  g.world_size = world->size();
  g.world_rank = world->rank();
  validate_layout(layout, g.world_size);
  g.tp = layout.tp();
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
  if (layout.seq2d) {  // both inside TENSOR: same context rank → one head group, and vice versa
    const auto [h, c] = sequence_2d_ranks(layout, g.tensor->rank());
    g.head = g.tensor->split(c, h);
    g.context = g.tensor->split(h, c);
  } else {
    g.head = g.tensor;
    g.context = make_local_communicator();
  }
  return g;
}

}  // namespace longtron::comm
