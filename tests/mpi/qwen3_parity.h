// Qwen3 in the parallel layouts (shared by qwen3_parity_np<N>_test.cpp): the tiny parity model
// with Qwen3's per-head q/k norms between wqkv and RoPE (model::QkNorm). Each layout runs the op
// on its own heads (Megatron, 2D over x) or tokens (ISP, 2D over y), so the norm weights'
// gradients are partial sums that the layout must add up.
#pragma once
#include "cp_parity.h"
#include "lora_parity.h"
#include "tp2d_cases.h"

namespace longtron::testing {

/// tiny_model as Qwen3: q/k norms, attention_bias (q, k, v and o), no MLP biases, and an explicit
/// head_dim 12 that is not hidden / heads (as Qwen3-0.6B's 128 with hidden 1024 and 16 heads).
inline model::ModelConfig qwen3_model(int kv_heads = 2) {
  model::ModelConfig c = tiny_model(kv_heads);
  c.type = "qwen3";
  c.mlp_bias = false;
  c.explicit_head_dim = 12;
  return c;
}

/// The one-process reference of qwen3_model differs from the same model without q/k norms
/// (else a layout that skipped them could pass).
inline void expect_qk_norms_matter(const model::ModelConfig& m) {
  ParityCase with{"qwen3", layout(1, parallel::TensorMode::kMtp)};
  with.model = m;
  with.steps = 1;
  ParityCase without = with;
  without.model.type = "llama";
  EXPECT_NE(run_reference(with).losses[0], run_reference(without).losses[0]);
}

}  // namespace longtron::testing
