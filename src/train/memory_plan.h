// The memory plan of a training run: what each rank will hold, computed from the config and the
// parallel layout before anything is allocated, so a run that cannot fit is refused at once with
// the estimate and the key to change (instead of allocating for a minute and dying).
//
// The model follows what the code allocates (per rank, float32):
//   resident:    runtime (the process's resident size when the plan is made: binary, libraries,
//                MPI), the datasets (memory-mapped and read once by the vocabulary check, so
//                their pages count in the resident size; page cache, reclaimable), parameters and
//                gradients over this rank's local layout (parallel::ShardPlan, exact per layout),
//                and the AdamW moments m and v (ZeRO-1 shards them over parallel.zero1);
//   step:        the model's activation workspace (model::workspace_elements: the saved block
//                state of every layer, or of one block with model.checkpoint = true — the
//                recomputation of InternEvo's activation checkpointing; in bfloat16 the saved
//                GEMM and attention inputs take 2 bytes, and the GEMMs' rounded operands are
//                added), the attention kernel's
//                packed key/query tiles, the chunked head's logits, the layout's gather and
//                reduce buffers (Megatron sequence parallel, ISP weight gathers and Ulysses
//                all-to-all, 2D), and the micro-batches;
//   transients:  the random init at start-up (every rank draws each split tensor at full size,
//                one at a time, and keeps its slice; unsplit ones are drawn in place; nothing is
//                drawn with --init-from or --resume, whose tensors are read into the shards), the
//                sgemm timing at start-up, loading a checkpoint (--resume: this rank's AdamW
//                moments), and the checkpoint save (every rank assembles the full parameters and
//                both AdamW moments).
// The layout's own step terms (workspace shape, attention and head sizes, gather buffers) come
// from its mode (ModeFactory::memory, src/modes/*_memory.cpp): the plan names no mode.
// The peak is runtime + datasets + params + grads + the largest of (random init, AdamW + sgemm,
// AdamW + resume load, AdamW + step + save). docs/memory.md compares it with the measured peak
// resident size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "train/config.h"

namespace longtron::train {

/// One line of the plan: bytes per rank, and the config key that scales it.
struct MemoryItem {
  std::string name;
  double bytes = 0;
  std::string key;  ///< e.g. "data.seq_len, data.micro_bsz"; empty: not adjustable
};

/// The plan of one rank (rank 0 of the layout; ranks of a layout hold the same sizes up to
/// uneven shard remainders).
struct MemoryPlan {
  std::string layout;  ///< e.g. "isp: 4 ranks, data 1, tensor 4, weight 4, zero1 1"
  int world_size = 1;
  int ranks_on_node = 1;
  int64_t params_full = 0;         ///< elements of the whole model
  int64_t params_local = 0;        ///< elements this rank holds
  int64_t tokens_per_step = 0;     ///< micro_num × packed row × data-parallel size
  double flops_matmul = 0;         ///< model FLOPs of a step without the attention term
  double flops_attention_max = 0;  ///< attention term if every packed row were one document
  std::vector<MemoryItem> resident, step, transient;
  double peak_bytes = 0;         ///< estimated peak resident size of one rank
  double reclaimable_bytes = 0;  ///< of which page cache (the memory-mapped datasets)
  double runtime_bytes = 0;      ///< of which already resident when the plan was made
  std::string peak_phase;        ///< "start-up (…)", "training step" or "checkpoint save"
};

/// What the plan needs beyond the config.
struct MemoryPlanInputs {
  int world_size = 1;         ///< ranks of the job
  int ranks_on_node = 1;      ///< ranks sharing this machine's memory
  double runtime_bytes = 0;   ///< resident size of the process now (resident_bytes())
  int64_t sgemm_size = 2048;  ///< n of the start-up sgemm timing (TrainOptions::sgemm_size)
  bool resume = false;        ///< --resume: the checkpoint's tensors are loaded at start-up
  bool init_from = false;     ///< --init-from: the weights are loaded, none is drawn
  bool bf16 = false;          ///< the run computes in bfloat16 (model.dtype as resolved)
  /// Tokens of the longest document of the training data (0 = unknown): the attention kernels'
  /// groups of whole documents are at least that long (up to data.seq_len).
  double longest_document = 0;
};

/// The longest document of the dataset in `folder`, tokens; 0 when it cannot be read.
double longest_document(const std::string& folder);

/// Plans `config` on `inputs.world_size` ranks. Throws Error (naming the parallel.* key) when the
/// layout does not fit the world or the model, as the engine would.
MemoryPlan plan_memory(const TrainConfig& config, const MemoryPlanInputs& inputs);

/// The plan of a forward-only pass over rows of `packed_length` tokens in one process (`longtron
/// eval`): the model is already loaded (its parameters are in `runtime_bytes`); the activations
/// are one block's (nothing is saved for backward), the attention's forward tiles, the head's
/// logits chunk and the micro-batch; `dataset` names the file or folder read (memory-mapped).
/// `key` names what to change in a refusal (e.g. "--seq-len, --micro-bsz").
MemoryPlan plan_forward_memory(const model::ModelConfig& model, int64_t seq_len, int64_t micro_bsz,
                               const std::string& dataset, double runtime_bytes,
                               const std::string& key);

/// The plan as text: layout, FLOPs per step, and memory per rank broken down (one item a line).
std::string format_plan(const MemoryPlan& plan);

/// Memory this process may still use, in bytes: the smaller of MemAvailable (/proc/meminfo) and
/// the cgroup's room (v2 memory.max − memory.current, or v1 limit − usage), divided by
/// `ranks_on_node`. 0 when neither can be read (no check then).
double available_memory_bytes(int ranks_on_node);

/// Resident size of this process now (VmRSS of /proc/self/status), bytes; 0 if unreadable.
double resident_bytes();
/// Peak resident size of this process so far (VmHWM), bytes; 0 if unreadable.
double peak_resident_bytes();

/// Throws Error when the memory the plan still has to allocate (peak − runtime − reclaimable)
/// exceeds `available` bytes (> 0): the message gives the estimate broken down and the keys to
/// change. `available` <= 0 skips the check.
void check_memory(const MemoryPlan& plan, double available);

/// A measured peak against the plan in words, the measurement as the reference: "3% above the
/// plan (844.3 MiB)" when `measured` exceeds `planned` by 3% of the plan, "12% below the plan
/// (…)", or "at the plan (…)" within half a percent. `planned` > 0.
std::string compare_to_plan(double measured, double planned);

/// "12.3 MiB" style.
std::string format_bytes(double bytes);

}  // namespace longtron::train
