// The memory terms of the dense and Megatron modes (mode_memory.h).
#include <fmt/core.h>

#include <cmath>
#include <string>

#include "modes/engine.h"
#include "modes/mode_memory.h"

namespace longtron::parallel {

MemorySizes memory_sizes(const ModeMemoryInputs& in) {
  const model::ModelConfig& m = in.model;
  return {in.packed_length, static_cast<double>(m.head_dim()),
          static_cast<double>(m.num_attention_heads), static_cast<double>(m.num_kv_attention_heads),
          static_cast<double>(m.hidden_size), static_cast<double>(m.vocab_size),
          static_cast<double>(in.grid.tp)};
}

ModeMemory ModeMemory::defaults(const ModeMemoryInputs& in) {
  const model::ModelConfig& m = in.model;
  const model::BlockParamIds& b = in.local.layers.front();
  const auto& wqkv = in.local.view(b.wqkv).shape;
  const auto& w1 = in.local.view(b.w1).shape;
  const double P = in.packed_length;
  ModeMemory s;
  model::WorkspaceShape& w = s.ws;
  w.L = static_cast<double>(m.num_layers);
  w.per_layer = !m.checkpoint;
  w.N = P;
  w.R = P;
  w.H = static_cast<double>(wqkv[1]);
  w.Q = static_cast<double>(wqkv[0]);
  w.F = static_cast<double>(w1[0]);
  s.attn_tokens = P;
  s.head_rows = P;
  s.head_vocab = static_cast<double>(m.vocab_size);
  return s;
}

void megatron_memory(const ModeMemoryInputs& in, ModeMemory& s) {
  const auto [P, d, Hq, Hkv, Hid, V, T] = memory_sizes(in);
  const std::string mode = mode_name(in.grid.layout);
  model::WorkspaceShape& w = s.ws;
  w.A = Hq / T * d;
  w.saved_qkv = P * w.Q;
  w.saved_lse = P * Hq / T;
  s.attn_hq = Hq / T;
  s.attn_hkv = Hkv / T;
  if (mode != "dense") {
    s.head_vocab = std::ceil(V / T);
    s.sizes = fmt::format(", tensor {}", in.grid.layout.tensor_size);
  } else {
    s.scratch_key = "parallel.tensor";
  }
  if (mode == "msp" || mode == "fsp") {
    w.R = std::ceil(P / T);
    // Gathered inputs of the column linears (MSP keeps one per pair per layer, FSP one for the
    // model), then the per-call buffers all linears share: the partial dx, the row linears'
    // partial output and gathered dy; the embedding and head full rows.
    const double gathered = mode == "msp" ? 2 * w.L : 1;
    s.layout_scratch = (gathered + 5) * P * Hid;
  } else if (mode == "mtp") {
    s.layout_scratch = P * Hid;  // the column linears' partial dx, all-reduced in place
  }
  s.bf16_operands = Bf16Operands::kWeightCopy;
}

}  // namespace longtron::parallel
