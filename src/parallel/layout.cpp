// Parallel layout rules and its process grid (see layout.h).
#include "parallel/layout.h"

#include "core/error.h"

namespace longtron::parallel {

TensorMode parse_tensor_mode(const std::string& name, const std::string& key) {
  if (const auto mode = find_enum(kTensorModeNames, name)) return *mode;
  fail("{} = \"{}\": expected one of {}", key, name, enum_names(kTensorModeNames, ", ", "\""));
}

const char* tensor_mode_name(TensorMode mode) {
  const char* name = enum_name(kTensorModeNames, mode);
  return name[0] == '?' ? "unknown" : name;
}

namespace {

// Size of the group ZeRO-1 shards live in: WEIGHT_DATA under ISP, DATA otherwise.
int zero1_parent_size(const Layout& l, int world) {
  return l.is_isp() ? world / l.weight_size : world / l.tp();
}

// InternEvo's rules for parallel.sequence_2D (internlm/initialize/launch.py and the 2D
// sequence-parallel process-group initializer), with the sizes named.
void validate_sequence_2d(const Layout& l) {
  check(l.is_isp(), "parallel.sequence_2D.enable = true needs parallel.tensor.mode = \"isp\" "
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
}

}  // namespace

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
  check(l.weight_size == 1 || l.is_isp(),
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
        l.is_isp() ? "weight-data" : "data-parallel", parent);
}

void need_divisible(int64_t a, int64_t b, const char* what_a, const char* what_b) {
  check(b > 0 && a % b == 0, "{} ({}) is not divisible by {} ({})", what_a, a, what_b, b);
}

comm::GridShape grid_shape(const Layout& l) {
  comm::GridShape s;
  s.tp = l.tp();
  if (l.is_2d()) s.x = l.tensor_2d_x, s.y = l.tensor_2d_y;
  if (l.is_isp()) s.weight = l.weight_size;
  s.zero1 = l.zero1_size;
  if (l.seq2d) {
    s.head = l.seq2d_head;
    s.context = l.seq2d_context;
    s.head_first = l.seq2d_head_first;
  }
  return s;
}

std::pair<int, int> sequence_2d_ranks(const Layout& l, int t) {
  return comm::head_context_ranks(grid_shape(l), t);
}

std::vector<int> group_ranks(const Layout& l, int world, comm::Group group, int rank) {
  return comm::group_ranks(grid_shape(l), world, group, rank);
}

Grid make_grid(const comm::CommPtr& world, const Layout& layout) {
  validate_layout(layout, world->size());
  Grid g;
  static_cast<comm::ProcessGrid&>(g) = comm::make_process_grid(world, grid_shape(layout));
  g.layout = layout;
  return g;
}

}  // namespace longtron::parallel
