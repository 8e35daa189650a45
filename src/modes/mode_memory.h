// What one rank of a parallel mode holds during a training step beyond its parameters, for the
// memory plan (train/memory_plan.h): each mode fills its own terms (ModeFactory::memory, engine.h)
// beside its code, so the plan knows no mode by name.
#pragma once
#include <string>

#include "model/decoder.h"
#include "model/model_config.h"
#include "model/params.h"

namespace longtron::parallel {

struct Grid;

/// What a mode's memory terms are computed from.
struct ModeMemoryInputs {
  const model::ModelConfig& model;
  const model::ParamTable& full;   ///< the full (HF) layout
  const model::ParamTable& local;  ///< this rank's layout (ShardPlan::local_layout)
  const Grid& grid;                 ///< world rank 0's grid (its groups' sizes)
  double packed_length = 0;         ///< P: tokens of one packed row (micro_bsz × seq_len)
  bool bf16 = false;                ///< the run computes in bfloat16
};

/// Which bound the bf16 GEMM operand buffer takes (train/memory_plan.cpp, bf16 operands): GEMMs
/// reading the step's bf16 weight copy (dense and Megatron layouts), or a bound whose B operand is
/// at most an activation or the head's weight (2D), or at most a head chunk's rows of the hidden
/// states (ISP: the GEMMs read the gathered bf16 weights).
enum class Bf16Operands { kWeightCopy, kHeadWeight, kHeadRows };

/// One rank's step terms, elements (the plan turns them into bytes). The plan fills the defaults
/// of one process over the whole row (ModeMemory::defaults) and the mode's hook adjusts them.
struct ModeMemory {
  model::WorkspaceShape ws;                           ///< the model's arena
  double attn_tokens = 0, attn_hq = 0, attn_hkv = 0;  ///< what the attention kernel sees
  bool attn_groups = false;  ///< the kernels run over groups of attn_tokens (the plan sizes one)
  double head_vocab = 0;                              ///< vocabulary columns of one head chunk
  double head_rows = 0;                               ///< rows the head sees
  double layout_scratch = 0;  ///< the mode's gather / reduce / all-to-all buffers
  Bf16Operands bf16_operands = Bf16Operands::kWeightCopy;
  std::string scratch_key = "parallel.tensor.size";  ///< the config key that sizes the layout
  std::string sizes;  ///< the layout's sizes in the plan's first line, e.g. ", tensor 4, weight 4"

  /// One process over the whole row: workspace of the local layout's first block (N = R = P),
  /// all heads, the whole vocabulary.
  static ModeMemory defaults(const ModeMemoryInputs& in);
};

/// Ulysses head split (parallel/isp_attention.h) over `T` ranks: local q heads and (repeated) kv
/// heads.
struct UlyssesShare {
  double q, kv;
};
inline UlyssesShare ulysses_share(double hq, double hkv, double T) {
  return {hq / T, hkv >= T ? hkv / T : 1.0};
}

/// The sizes every mode's memory terms start from, as doubles: P (tokens of one packed row),
/// head dim d, query and key/value heads Hq, Hkv, hidden Hid, vocabulary V, tensor-parallel
/// size T (`const auto [P, d, Hq, Hkv, Hid, V, T] = memory_sizes(in);`).
struct MemorySizes {
  double P, d, Hq, Hkv, Hid, V, T;
};
MemorySizes memory_sizes(const ModeMemoryInputs& in);

/// The memory terms of the dense and Megatron modes ("dense", "mtp", "msp", "fsp").
void megatron_memory(const ModeMemoryInputs& in, ModeMemory& m);
/// The memory terms of "isp" (with 2D-Attention's context parallel).
void isp_memory(const ModeMemoryInputs& in, ModeMemory& m);
/// The memory terms of "2d".
void tp2d_memory(const ModeMemoryInputs& in, ModeMemory& m);

}  // namespace longtron::parallel
