// The memory plan (see memory_plan.h): sizes from the config, the layout's ShardPlan and the
// model's own workspace count; no tensor is allocated.
#include "train/memory_plan.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/open.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "model/params.h"
#include "modes/engine.h"
#include "modes/lora_plan.h"
#include "ops/gemm_packing.h"
#include "ops/lora_kernels.h"
#include "ops/ops.h"
#include "parallel/layout.h"
#include "parallel/shard_plan.h"

namespace fs = std::filesystem;

namespace longtron::train {
namespace {

constexpr double kFloat = 4.0;

/// A group that knows only its rank and size: enough for a ShardPlan, no collective.
class ShapeCommunicator final : public comm::Communicator {
 public:
  ShapeCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::shared_ptr<Communicator> split(int, int) override { fail("memory plan: no communication"); }

 protected:
  comm::Work do_issue(const Op&, const void*, void*, const std::vector<int64_t>*) override {
    fail("memory plan: no communication");
  }
  std::vector<int64_t> gather_check_words(const std::vector<int64_t>&) override {
    fail("memory plan: no communication");
  }

 private:
  int rank_, size_;
};

/// The process grid of world rank 0 of `layout` on `world` ranks, without communicators.
parallel::Grid shape_grid(const parallel::Layout& layout, int world) {
  parallel::Grid g;
  g.layout = layout;
  g.shape = parallel::grid_shape(layout);
  g.world_size = world;
  g.world_rank = 0;
  g.tp = layout.tp();
  g.dp = world / g.tp;
  const auto make = [&](comm::Group group) -> comm::CommPtr {
    const std::vector<int> ranks = parallel::group_ranks(layout, world, group, 0);
    const auto it = std::find(ranks.begin(), ranks.end(), 0);
    return std::make_shared<ShapeCommunicator>(static_cast<int>(it - ranks.begin()),
                                               static_cast<int>(ranks.size()));
  };
  g.world = std::make_shared<ShapeCommunicator>(0, world);
  g.tensor = make(comm::Group::kTensor);
  g.data = make(comm::Group::kData);
  g.weight = make(comm::Group::kWeight);
  g.weight_data = make(comm::Group::kWeightData);
  g.zero1 = make(comm::Group::kZero1);
  g.zero1_replica = make(comm::Group::kZero1Replica);
  g.x = make(comm::Group::kX);
  g.y = make(comm::Group::kY);
  return g;
}

/// Bytes of the regular files under `path` (a folder or one file); 0 when absent.
double files_bytes(const std::string& path) {
  if (path.empty()) return 0;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return static_cast<double>(fs::file_size(path, ec));
  double total = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) total += static_cast<double>(it->file_size(ec));
  return total;
}

/// The step terms of the layout's mode: one process's defaults, adjusted by the mode's own
/// ModeFactory::memory (src/modes/*_memory.cpp).
parallel::ModeMemory step_terms(const parallel::ModeFactory& factory, const model::ModelConfig& m,
                                const parallel::Grid& grid, const model::ParamTable& full,
                                const model::ParamTable& local, double packed_length, bool bf16) {
  const parallel::ModeMemoryInputs in{m, full, local, grid, packed_length, bf16};
  parallel::ModeMemory s = parallel::ModeMemory::defaults(in);
  if (factory.memory) factory.memory(in, s);
  if (full.layers.front().q_norm >= 0 && s.ws.qk == 0) {
    // The q/k norms' saves (model::QkNorm): the q and k heads of the local qkv rows, whole heads.
    const double d = double(m.head_dim()), Hq = double(m.num_attention_heads);
    const double Hkv = double(m.num_kv_attention_heads);
    s.ws.qk_heads = s.ws.Q / d * (Hq + Hkv) / (Hq + 2 * Hkv);
    s.ws.qk = s.ws.qk_heads * d;
  }
  return s;
}

/// The attention kernel's per-call tiles (ops/attention*.cpp, kept between calls): packed keys
/// (forward) and packed q, dout, dq, lse, delta (backward), in 64-token blocks per segment.
double attention_workspace_elements(const parallel::ModeMemory& s, double head_dim, double segments) {
  const double blocks = std::ceil(s.attn_tokens / 64) + segments;
  const double forward = blocks * s.attn_hkv * head_dim * 64;
  const double rows = blocks * s.attn_hq * 64;
  return forward + 3 * rows * head_dim + 2 * rows;
}

/// The chunked head's logits and their gradient (model/layers.cpp, parallel/head_loss.cpp): the
/// rows of model::head_chunk_rows (at most 2²² logits and ⌈rows / 32⌉ rows, at least 256 rows).
double planned_head_chunk_rows(const parallel::ModeMemory& s) {
  const auto rows = static_cast<int64_t>(s.head_rows);
  return static_cast<double>(
      std::min(model::head_chunk_rows(static_cast<int64_t>(s.head_vocab), rows), rows));
}
double head_elements(const parallel::ModeMemory& s) {
  const double chunk = planned_head_chunk_rows(s);
  return 2 * chunk * s.head_vocab + chunk;
}

/// The model's float and bf16 activation arenas (model::workspace_elements and
/// workspace_bf16_elements), bytes.
double activation_bytes(const model::WorkspaceShape& ws) {
  return model::workspace_elements(ws) * kFloat + model::workspace_bf16_elements(ws) * 2;
}

/// The bf16 copies of float GEMM operands that ops::gemm rounds under a bf16 compute type
/// (ops/gemm.cpp: one buffer for a call's A and B, kept at the largest pair seen). Where the
/// GEMMs read the step's bf16 weight copy (dense and Megatron layouts) the largest pair is a weight
/// gradient's dy and x (N × (H + the widest of H, Q, A, F): every linear has the hidden size on
/// one side) or the head's chunk of logit gradients and its rows; elsewhere a bound: A at most a
/// token-rows activation or gradient or a head chunk's logit gradient, B at most an activation or
/// the head's weight (under ISP the GEMMs read the gathered bf16 weights, so B is then at most a
/// head chunk's rows of the hidden states). Bytes.
double bf16_operand_bytes(const parallel::ModeMemory& s) {
  const model::WorkspaceShape& w = s.ws;
  const double widest = std::max({w.H, w.Q, w.A, w.F});
  const double chunk = planned_head_chunk_rows(s);
  if (s.bf16_operands == parallel::Bf16Operands::kWeightCopy)
    return 2 * std::max(w.N * (w.H + widest), chunk * (s.head_vocab + w.H));
  const double a = std::max(w.N * widest, chunk * s.head_vocab);
  const double b = std::max(w.N * std::max({w.H, w.A, w.F}),
                            s.bf16_operands == parallel::Bf16Operands::kHeadRows
                                ? chunk * w.H
                                : s.head_vocab * w.H);
  return 2 * (a + b);
}

/// The attention kernels' queries per call when they run over groups of whole documents (or
/// query runs) of 4 × model.chunk_tokens queries (ops/attention_groups.h): a group, or the
/// longest document where it is longer (`longest`: tokens, 0 = unknown), at most what the
/// kernels see in all (s.attn_tokens).
void apply_groups(parallel::ModeMemory& s, const model::ModelConfig& m, double longest) {
  const double group = static_cast<double>(model::attention_group_tokens(m));
  s.attn_tokens = std::min(s.attn_tokens, std::max(group, longest));
}

/// The attention workspace's line under groups of `tokens` queries: "(groups of 16384 tokens)",
/// or where the longest document makes a group longer "(groups of 16384 tokens, the longest
/// document 45039)".
std::string attention_groups_name(double tokens, const model::ModelConfig& m) {
  const double group = static_cast<double>(model::attention_group_tokens(m));
  if (tokens <= group) return fmt::format("attention workspace (groups of {} tokens)", tokens);
  return fmt::format("attention workspace (groups of {} tokens, the longest document {})", group,
                     tokens);
}

/// The chunked recomputation (model::Decoder::chunked(): the dense ops with model.checkpoint):
/// the token-wise parts, the head and the GEMMs' bf16 operands see one chunk of
/// model.chunk_tokens rows, and the attention kernels one group (apply_groups). Returns the
/// chunk.
double apply_chunks(parallel::ModeMemory& s, const model::ModelConfig& m, double longest = 0) {
  const double C = std::min(s.ws.N, static_cast<double>(model::chunk_tokens(m)));
  s.ws.chunk = C;
  s.head_rows = std::min(s.head_rows, C);
  apply_groups(s, m, longest);
  return C;
}

/// The GEMM operand buffer of a chunked run: the GEMMs see one chunk's rows.
double chunked_bf16_operand_bytes(const parallel::ModeMemory& s) {
  if (s.ws.chunk <= 0) return bf16_operand_bytes(s);
  parallel::ModeMemory c = s;
  c.ws.N = c.ws.R = std::min(s.ws.N, s.ws.chunk);
  return bf16_operand_bytes(c);
}

/// The packed B of the start-up GEMM timing (train/flops.cpp): its fp32 n × n B, packed when it
/// fits kGemmPackedBMaxBytes. The buffer is kept at the largest B seen, so it stays this size for
/// the whole run. Bytes.
double timing_packed_b_bytes(double n) {
  const double bytes = n * n * kFloat;
  return bytes <= double(ops::kGemmPackedBMaxBytes) ? bytes : 0.0;
}

/// The GEMMs' packed B (ops/gemm_packing.h): one call's, in a buffer kept at the largest seen (a
/// weight, at most the head's, or a weight gradient's activations: the rows the GEMMs see times
/// the widest feature count, or the start-up timing's B, `timing_bytes`), in the compute type, at
/// most kGemmPackedBMaxBytes; under bf16 also the head weight packed for its two GEMMs
/// (model::HeadChunks), each at most that. Bytes.
double packed_b_bytes(const parallel::ModeMemory& s, bool bf16, double timing_bytes) {
  const model::WorkspaceShape& w = s.ws;
  const double cap = double(ops::kGemmPackedBMaxBytes);
  const double rows = w.chunk > 0 ? std::min(w.N, w.chunk) : w.N;
  const double widest = std::max({w.H, w.Q, w.A, w.F});
  const double elements = std::max(rows * widest, s.head_vocab * w.H);
  const double head = bf16 ? 2 * std::min(cap, s.head_vocab * w.H * 2) : 0.0;
  return std::max(std::min(elements * (bf16 ? 2.0 : kFloat), cap), timing_bytes) + head;
}

std::string layout_text(const parallel::Grid& g, const std::string& mode,
                        const parallel::ModeMemory& s) {
  return fmt::format("{}: {} rank{}, data {}{}, zero1 {}", mode, g.world_size,
                     g.world_size == 1 ? "" : "s", g.dp, s.sizes, g.zero1->size());
}

}  // namespace

MemoryPlan plan_memory(const TrainConfig& c, const MemoryPlanInputs& in) {
  const parallel::Layout layout = layout_of(c.parallel);
  parallel::ModelShape shape;
  shape.num_heads = c.model.num_attention_heads;
  shape.num_kv_heads = c.model.num_kv_attention_heads;
  shape.hidden_size = c.model.hidden_size;
  shape.packed_length = c.data.micro_bsz * c.data.seq_len;
  shape.tied_embeddings = c.model.tie_word_embeddings;
  parallel::validate_model_layout(layout, in.world_size, shape);
  const parallel::Grid grid = shape_grid(layout, in.world_size);
  const std::string mode = parallel::mode_name(layout);
  const parallel::ModeFactory& factory = parallel::find_mode(mode);
  const model::ParamTable full(c.model);
  parallel::ShardPlan shard(full, grid);
  if (factory.plan) factory.plan(shard);
  const model::ParamTable local = shard.local_layout();
  const double P = static_cast<double>(c.data.micro_bsz) * static_cast<double>(c.data.seq_len);
  parallel::ModeMemory s = step_terms(factory, c.model, grid, full, local, P, in.bf16);

  MemoryPlan p;
  p.layout = layout_text(grid, mode, s);
  p.world_size = in.world_size;
  p.ranks_on_node = in.ranks_on_node;
  p.params_full = full.numel();
  p.params_local = local.numel();
  p.tokens_per_step =
      c.data.micro_num * c.data.micro_bsz * c.data.seq_len * static_cast<int64_t>(grid.dp);
  p.flops_matmul = model::model_flops(c.model, p.tokens_per_step, 0);
  p.flops_attention_max = model::model_flops(c.model, 0, P * P * c.data.micro_num * grid.dp);

  const double local_bytes = static_cast<double>(p.params_local) * kFloat;
  const double z = grid.zero1->size();
  const double adam = 2 * std::ceil(static_cast<double>(p.params_local) / z) * kFloat;
  const double datasets = files_bytes(c.data.train_folder) + files_bytes(c.data.valid_folder);
  p.runtime_bytes = in.runtime_bytes;
  p.reclaimable_bytes = datasets;
  p.resident = {
      {"runtime (binary, libraries, MPI)", in.runtime_bytes, ""},
      {"datasets (memory-mapped, page cache)", datasets, "data.train_folder, data.valid_folder"},
      {"parameters", local_bytes, "model.*"},
      {"gradients", local_bytes, "model.*"},
      {z > 1 ? fmt::format("AdamW m and v (ZeRO-1 shard of {})", grid.zero1->size())
             : "AdamW m and v",
       adam, "model.*, parallel.zero1"},
  };

  // LoRA (docs/lora.md): the frozen base has no gradient and no AdamW state (and with a bf16 base
  // takes 2 bytes a matrix parameter and no per-step copy); the adapters have both.
  double param_bytes = local_bytes, grad_bytes = local_bytes, copy_bytes = 0.5 * local_bytes;
  double save_bytes = 3 * static_cast<double>(p.params_full) * kFloat + 2 * local_bytes;
  double adam_state = adam;
  double lora_scratch_per_token = 0;  // the adapters' grow-only scratch (model/lora.cpp), per row
  double lora_kernel_bytes = 0;       // and the fused kernels' (ops/lora_kernels.h), once
  if (c.model.lora.enabled()) {
    // The adapters as this rank holds them (split like their linears, sharded under ISP).
    const auto modules = model::lora_modules(full, c.model.lora);
    const model::ParamTable adapters = model::lora_table(full, modules, c.model.lora.rank);
    parallel::ShardPlan adapter_plan(adapters, grid);
    parallel::plan_lora(adapter_plan, modules, shard, mode);
    const double adapter = double(adapter_plan.local_layout().numel()) * kFloat;
    const double adapter_full = double(adapters.numel()) * kFloat;
    const model::LoraBaseDtype want = c.model.lora.base_dtype;
    const bool bf16_base = want == model::LoraBaseDtype::kBFloat16 ||
                           (want == model::LoraBaseDtype::kAuto && in.bf16 && mode == "dense");
    double matrices = 0;
    for (const auto& v : local.views()) matrices += v.is_matrix ? double(v.numel) * kFloat : 0;
    param_bytes = (bf16_base ? local_bytes - matrices / 2 : local_bytes) + adapter;
    grad_bytes = adapter;
    copy_bytes = bf16_base ? 0 : 0.5 * local_bytes;
    adam_state = 2 * std::ceil(adapter / kFloat / z) * kFloat;
    save_bytes = 3 * adapter_full + 2 * adapter;
    p.resident[2] = {bf16_base ? "parameters (base in bf16, adapters)" : "parameters (base, adapters)",
                     param_bytes, "model.*, lora.base_dtype"};
    p.resident[3] = {"gradients (adapters only)", grad_bytes, "lora.rank, lora.targets"};
    p.resident[4].bytes = adam_state;
    p.resident[4].key = "lora.rank, lora.targets, parallel.zero1";
    double partial_out = 0, in_max = 0, out_max = 0;
    for (const model::LoraModule& m : modules) {
      if (m.out < full.view(m.base_view).shape[0])
        partial_out = std::max(partial_out, double(m.out));
      in_max = std::max(in_max, double(m.in));
      out_max = std::max(out_max, double(full.view(m.base_view).shape[0]));
    }
    const double dropped_in = c.model.lora.dropout > 0 ? in_max : 0;
    if (mode == "dense") {
      // Per row, the fused passes (model/lora.cpp, ops/lora_kernels.h): under dropout the dropped
      // input and its masked gradient; with a bf16 base, whose GEMMs share one rounding with the
      // adapters, the bits of the input and of the output gradient (two for the gate/up pair).
      lora_scratch_per_token = kFloat * 2 * dropped_in +
                               (in.bf16 && bf16_base ? 2.0 * (in_max + 2 * out_max) : 0.0);
    } else {
      // Per row, the GEMM path of the split layouts: u, du and their row-layout twins (r each);
      // B's rows of a module that adds into part of its base's output (t and dy's rows);
      // dropout's copy of the input; under bf16 the bits of the input and of the output gradient
      // (or its rows) the adapters' GEMMs read.
      lora_scratch_per_token =
          kFloat * (4.0 * double(c.model.lora.rank) + 2 * partial_out + dropped_in) +
          (in.bf16 ? 2.0 * (in_max + out_max) : 0.0);
    }
    if (mode == "dense")
      lora_kernel_bytes = ops::lora_kernel_scratch_bytes(int64_t(in_max), int64_t(out_max),
                                                         c.model.lora.rank, in.bf16);
  }

  s.ws.bf16 = in.bf16;
  const bool chunked = c.model.checkpoint && mode == "dense";
  // A document longer than seq_len is cut into rows of seq_len (data.md).
  const double longest = std::min(in.longest_document, static_cast<double>(c.data.seq_len));
  const double chunk = chunked ? apply_chunks(s, c.model, longest) : 0;
  if (!chunked && s.attn_groups) apply_groups(s, c.model, longest);
  const double acts = activation_bytes(s.ws);
  const double segments = static_cast<double>(c.data.micro_bsz);
  double attn =
      attention_workspace_elements(s, static_cast<double>(c.model.head_dim()), segments) * kFloat;
  // The chunked bf16 path keeps the attention output in bf16 (in the activations): one group's
  // lse passes through, and its fp32 output too where the bf16 kernel, which stores and reads
  // the output's bits itself, does not run (ops/attention_groups.h).
  if (chunked && in.bf16) {
    const double out = ops::attention_bf16_runs() ? 0 : static_cast<double>(c.model.head_dim());
    attn += s.attn_tokens * s.attn_hq * (out + 1) * kFloat;
  }
  const double head = head_elements(s) * kFloat;
  // Per micro-batch: input_ids, labels, indexes (int32) of the row, as read and as fed.
  const double batches = static_cast<double>(c.data.micro_num) * P * 3 * 4 * 2;
  const std::string act_key = c.model.checkpoint
                                  ? "data.seq_len, data.micro_bsz"
                                  : "data.seq_len, data.micro_bsz (or model.checkpoint = true)";
  const char* acts_name =
      c.model.checkpoint
          ? (in.bf16 ? "activations (one block saved, model.checkpoint recomputes; saved tensors bf16)"
                     : "activations (one block saved, model.checkpoint recomputes)")
          : (in.bf16 ? "activations saved for backward (every layer, in bf16)"
                     : "activations saved for backward (every layer)");
  const std::string chunked_name =
      fmt::format("activations (recomputed in chunks of {} tokens)", chunk);
  const bool groups = chunked || s.attn_groups;
  const std::string attn_name =
      groups ? attention_groups_name(s.attn_tokens, c.model)
             : std::string("attention workspace (packed tiles)");
  p.step = {
      {chunked ? chunked_name : std::string(acts_name), acts,
       chunked ? "data.seq_len, data.micro_bsz, model.chunk_tokens" : act_key},
      {attn_name, attn, groups ? "model.chunk_tokens" : "data.seq_len, data.micro_bsz"},
      {"head logits (chunked)", head, "model.vocab_size"},
      {"micro-batches", batches, "data.micro_num, data.seq_len, data.micro_bsz"},
  };
  if (lora_scratch_per_token > 0) {  // the linears see a chunk of the row, or at most all of it
    const double rows = chunked ? std::min(P, chunk) : P;
    p.step.push_back({"LoRA adapter scratch", lora_scratch_per_token * rows + lora_kernel_bytes,
                      "lora.rank, lora.targets, lora.dropout"});
  }
  // Under ISP the copy is of the local shards, which the weight all-gathers send as bf16.
  if (in.bf16)
    p.step.push_back({"bf16 weight copy (one a step)", copy_bytes, "model.*"});
  if (in.bf16)
    p.step.push_back({"bf16 GEMM operands (rounded activations)",
                      chunked_bf16_operand_bytes(s),
                      "data.seq_len, data.micro_bsz"});
  const double timing_packed = timing_packed_b_bytes(static_cast<double>(in.sgemm_size));
  p.step.push_back({"GEMM packed B operands", packed_b_bytes(s, in.bf16, timing_packed),
                    "data.seq_len, data.micro_bsz"});
  if (s.layout_scratch > 0)
    p.step.push_back({"layout buffers (gathers, all-to-all)", s.layout_scratch * kFloat,
                      "data.seq_len, " + s.scratch_key});
  // The data-parallel gradient sum (finish_gradients) over DATA or the mode's own group.
  if (grid.dp > 1 || grid.get(factory.data_group)->size() > 1)
    p.step.push_back({"data-parallel all-reduce buffer", grad_bytes, ""});

  const double full_bytes = static_cast<double>(p.params_full) * kFloat;
  // The timing's A, B and C, and B packed for the kernel.
  const double sgemm =
      3.0 * static_cast<double>(in.sgemm_size) * static_cast<double>(in.sgemm_size) * kFloat +
      timing_packed;
  const double save = c.train.checkpoint_dir.empty() ? 0 : save_bytes;
  (void)full_bytes;
  // The random init draws a split tensor at its full size (one at a time; an unsplit one in
  // place). A run that loads its weights draws nothing: each tensor is read into its shard.
  double draw = 0;
  if (!in.resume && !in.init_from)
    for (int v = 0; v < shard.num_views(); ++v)
      if (!shard.tensor(v).splits.empty())
        draw = std::max(draw, static_cast<double>(full.view(v).numel) * kFloat);
  p.transient = {{"start-up: sgemm timing", sgemm, ""}};
  if (draw > 0)
    p.transient.insert(p.transient.begin(),
                       {"start-up: random init (one full tensor, sliced)", draw, "model.*"});
  const double resume = in.resume ? 2 * local_bytes : 0;
  if (resume > 0)
    p.transient.push_back({"start-up: checkpoint load (this rank's m and v)", resume, "model.*"});
  if (save > 0)
    p.transient.push_back({"checkpoint save: full parameters, m, v", save,
                           "model.* (or train.checkpoint_dir = \"\")"});

  double step_sum = 0;
  for (const auto& i : p.step) step_sum += i.bytes;
  const double base = in.runtime_bytes + datasets + param_bytes + grad_bytes;
  const double phases[4] = {draw, adam_state + sgemm, adam_state + resume,
                            adam_state + step_sum + save};
  const char* names[4] = {"start-up (random init)", "start-up (sgemm timing)",
                          "start-up (checkpoint load)",
                          save > 0 ? "checkpoint save" : "training step"};
  const int worst = static_cast<int>(std::max_element(phases, phases + 4) - phases);
  p.peak_bytes = base + phases[worst];
  p.peak_phase = names[worst];
  return p;
}

MemoryPlan plan_forward_memory(const model::ModelConfig& model, int64_t seq_len, int64_t micro_bsz,
                               const std::string& dataset, double runtime_bytes,
                               const std::string& key) {
  const parallel::Grid grid = shape_grid(parallel::Layout{}, 1);
  const model::ParamTable full(model);
  parallel::ModeMemory s =
      step_terms(parallel::find_mode("dense"), model, grid, full, full,
                 static_cast<double>(micro_bsz) * static_cast<double>(seq_len), false);
  s.ws.per_layer = false;  // forward only: one shared set of block state
  s.ws.train = false;
  if (model.checkpoint) apply_chunks(s, model);
  const double P = static_cast<double>(seq_len) * static_cast<double>(micro_bsz);
  const double d = static_cast<double>(model.head_dim());
  const double blocks = std::ceil(s.attn_tokens / 64) + static_cast<double>(micro_bsz);
  MemoryPlan p;
  p.layout = "one process, forward only";
  p.params_full = p.params_local = full.numel();
  p.tokens_per_step = seq_len * micro_bsz;
  p.flops_matmul = model::model_flops(model, p.tokens_per_step, 0) / 3;
  p.flops_attention_max = model::model_flops(model, 0, P * P) / 3;
  p.runtime_bytes = runtime_bytes;
  p.reclaimable_bytes = files_bytes(dataset);
  p.resident = {{"runtime (binary, libraries, the loaded model)", runtime_bytes, ""},
                {"dataset (memory-mapped, page cache)", p.reclaimable_bytes, ""},
                // The engine's own parameters and gradients, while the loaded copy is still held.
                {"engine parameters and gradients", 2.0 * static_cast<double>(full.numel()) * kFloat, ""}};
  const double head_chunk = planned_head_chunk_rows(s) * (s.head_vocab + 1);  // logits and lse, no gradient
  p.step = {
      {"activations (one block, forward only)", model::workspace_elements(s.ws) * kFloat, key},
      {"attention workspace (packed keys)", blocks * s.attn_hkv * d * 64 * kFloat, key},
      {"head logits (chunked)", head_chunk * kFloat, ""},
      {"micro-batch and token losses", P * (3 * 4 + 8), key}};
  p.peak_bytes = 0;
  for (const auto* items : {&p.resident, &p.step})
    for (const auto& i : *items) p.peak_bytes += i.bytes;
  p.peak_phase = "forward";
  return p;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 6) b /= 1024, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

std::string compare_to_plan(double measured, double planned) {
  const double percent = 100.0 * (measured / planned - 1.0);
  const long whole = std::lround(std::fabs(percent));
  const std::string plan = format_bytes(planned);
  if (whole == 0) return fmt::format("at the plan ({})", plan);
  return fmt::format("{}% {} the plan ({})", whole, percent > 0 ? "above" : "below", plan);
}

std::string format_plan(const MemoryPlan& p) {
  std::string s = fmt::format("layout: {}\n", p.layout);
  s += fmt::format("parameters: {} ({} on this rank)\n", p.params_full, p.params_local);
  s += fmt::format("tokens per step: {}\n", p.tokens_per_step);
  s += fmt::format(
      "FLOPs per step: {:.3e} (matmuls) + attention up to {:.3e} (if each row were one document)\n",
      p.flops_matmul, p.flops_attention_max);
  s += "memory per rank:\n";
  const auto lines = [&](const char* title, const std::vector<MemoryItem>& items) {
    s += fmt::format("  {}\n", title);
    for (const auto& i : items)
      s += fmt::format("    {:<60} {:>11}{}\n", i.name, format_bytes(i.bytes),
                       i.key.empty() ? "" : "   [" + i.key + "]");
  };
  lines("held through the run:", p.resident);
  lines("per step:", p.step);
  lines("transient (one at a time):", p.transient);
  s += fmt::format("  estimated peak: {} per rank (at {})\n", format_bytes(p.peak_bytes),
                   p.peak_phase);
  return s;
}

namespace {

/// The first number of the line of `file` starting with `field` (e.g. "MemAvailable:"), or -1.
double read_field(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) {
      std::istringstream rest(line.substr(field.size()));
      double v = -1;
      rest >> v;
      return v;
    }
  return -1;
}

/// The first number in `file`, or -1 ("max" and absent files give -1).
double read_number(const std::string& file) {
  std::ifstream in(file);
  double v = -1;
  if (!(in >> v)) return -1;
  return v;
}

}  // namespace

double longest_document(const std::string& folder) {
  if (folder.empty()) return 0;
  try {
    size_t longest = 0;
    for (const auto& source : data::open_dataset(folder))
      for (size_t i = 0; i < source->num_documents(); ++i)
        longest = std::max(longest, source->document_length(i));
    return static_cast<double>(longest);
  } catch (const Error&) {
    return 0;  // no dataset yet (a dry run of a config): the plan assumes groups
  }
}

double resident_bytes() {
  const double kb = read_field("/proc/self/status", "VmRSS:");
  return kb < 0 ? 0 : kb * 1024;
}

double peak_resident_bytes() {
  const double kb = read_field("/proc/self/status", "VmHWM:");
  return kb < 0 ? 0 : kb * 1024;
}

double available_memory_bytes(int ranks_on_node) {
  double avail = -1;
  const double kb = read_field("/proc/meminfo", "MemAvailable:");
  if (kb >= 0) avail = kb * 1024;
  // cgroup v2, then v1: the room left under the limit (an unlimited group reads "max" or a huge
  // number, both ignored).
  double room = -1;
  const double v2_max = read_number("/sys/fs/cgroup/memory.max");
  if (v2_max > 0) room = v2_max - std::max(0.0, read_number("/sys/fs/cgroup/memory.current"));
  const double v1_max = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (room < 0 && v1_max > 0 && v1_max < 1e18)
    room = v1_max - std::max(0.0, read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
  if (room >= 0) avail = avail < 0 ? room : std::min(avail, room);
  if (avail < 0) return 0;
  return avail / std::max(1, ranks_on_node);
}

void check_memory(const MemoryPlan& p, double available) {
  if (available <= 0) return;
  const double need = p.peak_bytes - p.runtime_bytes - p.reclaimable_bytes;
  if (need <= available) return;
  // The largest adjustable item names the key to change.
  const MemoryItem* largest = nullptr;
  for (const auto* items : {&p.resident, &p.step, &p.transient})
    for (const auto& i : *items)
      if (!i.key.empty() && (largest == nullptr || i.bytes > largest->bytes)) largest = &i;
  fail(
      "memory plan: this run needs about {} more per rank but {} is available per rank "
      "(MemAvailable or the cgroup limit, shared by {} rank{} on this machine); the largest part "
      "is {} ({}): change {}\n{}",
      format_bytes(need), format_bytes(available), p.ranks_on_node, p.ranks_on_node == 1 ? "" : "s",
      largest ? largest->name : "?", largest ? format_bytes(largest->bytes) : "?",
      largest ? largest->key : "?", format_plan(p));
}

}  // namespace longtron::train
