// LoRA adapters inside the model's linears (docs/lora.md): PEFT's y = W x + s · B A dropout(x)
// (Hu et al. 2021; https://github.com/huggingface/peft, tuners/lora/layer.py), with the base
// frozen. One adapter per module of the family's Hugging Face naming (A [r, in], B [out, r], as
// PEFT stores them): Llama's q_proj, k_proj and v_proj each add into their rows of the engine's
// fused, grouped wqkv output (model/hf_names.h), InternLM2's wqkv adapter covers all its rows.
//
// The adapters live in their own flat table (lora_table), beside the base's: only they train.
// The model's ops are wrapped once (apply_lora): every base op then gets no gradient buffer (no
// weight-gradient GEMM for a frozen weight), and each adapted linear adds its adapters after the
// base's forward and backward. The layout of a linear (which rows and columns of W this rank
// holds, how its input and output rows are spread) is given by a LoraLinearSpec, so one code path
// serves every layout.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/layers.h"
#include "model/lora_config.h"
#include "model/params.h"

namespace longtron::model {

/// The LoRA target names of family `type` (its Family::lora_targets), in block order: Llama, Qwen2,
/// Mistral q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; InternLM2 wqkv, wo, w1,
/// w3, w2. Throws Error for an unknown family.
std::vector<std::string> lora_family_targets(const std::string& type);

/// `requested` ("all-linear" = every one) as family `type`'s targets in block order. Throws Error
/// naming lora.targets and the unknown or repeated name, listing the family's names.
std::vector<std::string> lora_resolve_targets(const std::string& type,
                                              const std::vector<std::string>& requested);

/// One adapted module.
struct LoraModule {
  std::string module;  ///< family HF module path, e.g. "model.layers.0.self_attn.q_proj"
  std::string target;  ///< e.g. "q_proj"
  int layer = -1;
  int id = 0;          ///< position of `target` in lora_family_targets (dropout's module number)
  int base_view = -1;  ///< the engine weight it adds into (wqkv, wo, w1, w3 or w2 of `layer`)
  int64_t in = 0, out = 0;  ///< A [r, in], B [out, r]
  /// The rows of the base weight that B's rows are, as (first row, count) blocks in B's order.
  std::vector<std::pair<int64_t, int64_t>> rows;
  int a_view = -1, b_view = -1;  ///< views of A and B in the adapter table
};

/// The modules `lora.targets` selects on the model of `base` (a FULL layout), in block order, with
/// a_view/b_view set for lora_table. Throws Error for bad targets (lora_resolve_targets).
std::vector<LoraModule> lora_modules(const ParamTable& base, const LoraConfig& lora);

/// The adapter table: for each module `<module>.lora_A.weight` [r, in] then `.lora_B.weight`
/// [out, r] (is_matrix: weight decay applies, as PyTorch's AdamW over PEFT's parameters).
ParamTable lora_table(const ParamTable& base, const std::vector<LoraModule>& modules, int64_t rank);

/// The values lora_init gives adapter view `index` (full `view`): A as PEFT's
/// kaiming_uniform_(a = √5), i.e. U(−1/√in, 1/√in) (bound = √(6 / ((1 + a²)·in))), from its own
/// generator seeded splitmix64(seed + index·0x9E3779B97F4A7C15) (uniforms (bits >> 11)·2⁻⁵³, in
/// double, rounded to T); B zero. A sharded engine draws a full view and slices it.
template <typename T>
void lora_init_tensor(T* out, const ParamView& view, int index, uint64_t seed);

/// Dropout's key of (seed, step, layer, module id): with lora_keep, the mask is a pure function of
/// (seed, step, layer, module, global token position, feature), so recomputation and every layout
/// drop the same elements.
uint64_t lora_dropout_key(uint64_t seed, int64_t step, int layer, int module);
/// Whether feature `feature` of the token at global row position `position` is kept (drop
/// probability p): splitmix64 twice over (key + position, + feature), uniform (bits >> 11)·2⁻⁵³ ≥ p.
bool lora_keep(uint64_t key, int64_t position, int64_t feature, double p);
/// Dropout over one token's features [col0, col0 + n): out[j] = src[j] / (1 − p) where
/// lora_keep(key, position, col0 + j, p), else 0 — added to out with `accumulate`. The same mask
/// as lora_keep, made fast: the row's hash once, the draw compared as an integer, no call per
/// element (the masks of a step's adapters hash every element of their inputs, three times with
/// the backward's recomputation).
template <typename T>
void lora_dropout_row(T* out, const T* src, int64_t n, uint64_t key, int64_t position,
                      int64_t col0, double p, bool accumulate);

/// What every wrapped op of one model shares: the settings, whether the current call trains
/// (dropout on) and the step (dropout's mask), and scratch.
template <typename T>
struct LoraState {
  LoraConfig config;
  int64_t step = 0;       ///< the optimizer step being computed (dropout's mask)
  bool training = false;  ///< forward_backward (dropout applies); false in eval and generate
  /// The adapters add nothing to the forward: the frozen base alone (a preference run's reference
  /// model under LoRA, docs/preference.md). Forward only: no backward runs while it is set.
  bool adapters_off = false;
  const Params<T>* params = nullptr;  ///< the adapter table's (local) values
  Params<T>* grads = nullptr;         ///< their gradients (accumulated, +=)
  /// The global row position of each token of the current call when the model sees a slice or a
  /// permutation of the row (ISP, 2D-Attention); empty: LoraLinearSpec::x_position (+ row).
  std::vector<int32_t> positions;
  /// The row position of the current call's first token when the model runs its token-wise ops
  /// over chunks of the row (ModelOps::on_chunk); 0 otherwise.
  int64_t token_offset = 0;
  /// A base held in bf16 (LoraBaseStorage::kBFloat16; one process's full tensors): per base view
  /// index, its bf16 bits (nullptr: read the fp32 parameter, e.g. a norm weight). Empty: the base
  /// is read from its fp32 parameters through the wrapped ops.
  std::vector<const uint16_t*> base16;
  /// The engine's compute context. Under kBFloat16 (float only) the adapters' GEMMs run as
  /// torch.autocast runs PEFT's lora_A and lora_B: operands rounded to bf16 (nearest even), fp32
  /// accumulation, fp32 outputs and gradients. nullptr or float32: fp32 GEMMs.
  const ops::ComputeContext* compute = nullptr;
  /// A bf16 base under bf16 compute (float only): the base's GEMMs and the adapters' read x and
  /// dy rounded once (x16, dy16 below), the bits the base's own GEMMs would round.
  bool shares_bf16() const {
    return std::is_same_v<T, float> && !base16.empty() && compute != nullptr && compute->bf16();
  }
  std::vector<T> xd, u, uy, t, dym, du, dux, a;  // scratch (a: a gathered A)
  std::vector<uint16_t> x16, dy16, w16;          // bf16 scratch: x, dy (or its rows), A or B
  // With a bf16 base under bf16 compute, x and dy are rounded once for the base's GEMMs and the
  // adapters' (x16, dy16); dy16b: the gate/up pair's second output gradient.
  std::vector<uint16_t> dy16b;
};

/// Where the frozen base's matrices are read from under LoRA: the engine's fp32 parameters, or
/// one bf16 copy (2 bytes a parameter; the fp32 pages are given back to the system) read by the
/// bf16-weight GEMMs (ops::linear_forward_bf16, gemm_bf16_weight). A 4-bit NF4 base (QLoRA,
/// Dettmers et al. 2023) would be one more value: its blocks and scales per view beside base16,
/// its dequantising GEMM in the frozen linear, head and embedding below, and its memory term.
enum class LoraBaseStorage { kFloat32, kBFloat16 };

/// The bf16 copy of a base buffer's matrices for LoraState::base16: every linear weight, the
/// embedding and the head of `layout` (a one-process layout), rounded by core/bf16.h's rule.
/// `storage` receives the bits; the returned pointers (per view index) point into it.
std::vector<const uint16_t*> lora_base_bf16(const ParamTable& layout, const float* params,
                                            std::vector<uint16_t>& storage);

/// How one base linear is laid out on this rank, for its adapters. Defaults: one process.
template <typename T>
struct LoraLinearSpec {
  /// The base weight's rows [row0, row0 + rows) and columns [col0, col0 + cols) this rank holds
  /// (full indices; rows = -1 / cols = -1: all). A is split like the columns, B like the rows.
  int64_t row0 = 0, rows = -1, col0 = 0, cols = -1;
  /// Rows of x and of y for a call over N tokens (default N), and the global row position of x's
  /// first row (default 0).
  std::function<int64_t(int64_t N)> x_rows, y_rows, x_position;
  /// Forward: u over x's rows [x_rows, r] (a partial sum when the columns are split) → u over y's
  /// rows [y_rows, r], complete. Backward: du over y's rows (partial when the rows are split) → du
  /// over x's rows, complete. nullptr: a copy (one process).
  std::function<void(T* u_y, T* u_x, int64_t N, int64_t r)> forward_u;
  std::function<void(T* du_x, T* du_y, int64_t N, int64_t r)> backward_du;
  /// Weight parallel (ISP): the table holds a shard of each adapter. gather(view, backward) gives
  /// the whole tensor of adapter view `view` (valid until the next gather); reduce(shard, full,
  /// view) adds this rank's part of the sum over the group of the full-shape gradient `full`
  /// (clobbered) into `shard`; grad_scratch(n) is room for n elements of such a gradient. All
  /// three collective, in the same order on every rank. nullptr: the table holds whole adapters.
  std::function<const T*(int view, bool backward)> gather;
  std::function<void(T* shard, T* full, int view)> reduce;
  std::function<T*(int64_t n)> grad_scratch;
};

/// Wraps every op of `ops` (built over the base's LOCAL layout `base_local`): the base is frozen
/// (its ops get no gradient buffer) and each module of `modules` (lora_modules of the full layout)
/// adds s · B A dropout(x) into its linear. `adapter_local` is the adapter table as this rank holds
/// it (the views of state->params / grads); `spec(layer, base_view)` gives each adapted linear's
/// layout. The state must outlive the ops.
template <typename T>
void apply_lora(ModelOps<T>& ops, const ParamTable& base_local, const std::vector<LoraModule>& modules,
                const ParamTable& adapter_local, std::shared_ptr<LoraState<T>> state,
                const std::function<LoraLinearSpec<T>(int layer, int base_view)>& spec);

}  // namespace longtron::model
