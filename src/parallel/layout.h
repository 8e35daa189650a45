// The parallel layout of the config (`parallel.*` keys): the tensor-parallel mode and the sizes of
// each parallel dimension, the rules every layout obeys, and the process grid it makes
// (docs/parallel.md). Each mode checks its own model-size rules beside its code (ModeFactory::
// validate, modes/engine.h); validate_model_layout there runs the common rules, then the mode's.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_grid.h"
#include "core/enum_names.h"
#include "packing/context_split.h"

namespace longtron::parallel {

/// Tensor-parallel mode (InternEvo's names): Megatron TP; + sequence parallel keeping the gathered
/// input (msp) or re-gathering it in backward (fsp); Intern SP = Ulysses + weight parallel (isp).
enum class TensorMode { kMtp, kMsp, kFsp, kIsp };
/// The config spellings of TensorMode (parallel.tensor.mode).
inline constexpr std::array<EnumName<TensorMode>, 4> kTensorModeNames{
    {{TensorMode::kMtp, "mtp"}, {TensorMode::kMsp, "msp"}, {TensorMode::kFsp, "fsp"}, {TensorMode::kIsp, "isp"}}};

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
  data::ContextBalance seq2d_balance = data::ContextBalance::kZigzag;  ///< parallel.sequence_2D.balance
  /// Context parallelism as ring attention (default) or, false, as an all-gather of the row's
  /// K/V (parallel/cp_attention.h). Not a config key: benchmarks and tests compare the forms.
  bool seq2d_ring = true;
  bool is_2d() const { return tensor_2d_x > 0 || tensor_2d_y > 0; }
  /// Size of one TENSOR group: T, or x·y under 2D.
  int tp() const { return is_2d() ? tensor_2d_x * tensor_2d_y : tensor_size; }
  /// Whether the mode is ISP (weight parallel; not under 2D).
  bool is_isp() const { return !is_2d() && tensor_mode == TensorMode::kIsp; }
};

/// Throws Error (naming the parallel.* key and both numbers) unless the layout fits `world_size`:
/// sizes >= 1 (zero1 also -1), world divisible by tp (and by W under ISP), weight only with isp,
/// tensor and tensor_2d not both, x and y both >= 1, zero1 dividing its parent group.
void validate_layout(const Layout& layout, int world_size);

/// The model sizes whose divisibility the layout constrains.
struct ModelShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t hidden_size = 0;
  int64_t packed_length = 0;  ///< P: tokens of one packed row (micro_bsz × seq_len); 0 = unknown
  bool tied_embeddings = false;  ///< the embedding is the head's table (split as the head, on rows)
};

/// Throws Error naming both sizes unless b > 0 divides a ("{what_a} ({a}) is not divisible by
/// {what_b} ({b})"): the form of every mode's size rule.
void need_divisible(int64_t a, int64_t b, const char* what_a, const char* what_b);

/// The group geometry of a (valid) layout: TENSOR = tp; X/Y under 2D; WEIGHT groups of W under
/// ISP; HEAD × CONTEXT under parallel.sequence_2D.
comm::GridShape grid_shape(const Layout& layout);

/// (head rank, context rank) of TENSOR rank t under parallel.sequence_2D; (t, 0) when it is off.
std::pair<int, int> sequence_2d_ranks(const Layout& layout, int t);

/// comm::group_ranks of the layout's grid shape.
std::vector<int> group_ranks(const Layout& layout, int world_size, comm::Group group, int rank);

/// A rank's process grid with the layout it was made from (the modes read their options here).
struct Grid : comm::ProcessGrid {
  Layout layout;
};

/// Validates the layout against world->size(), then splits `world` into every group of
/// grid_shape(layout) (collective over world: every rank must call it with the same layout).
Grid make_grid(const comm::CommPtr& world, const Layout& layout);

}  // namespace longtron::parallel
