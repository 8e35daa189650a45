// The compute type of float GEMMs and attention: float32, or bfloat16 inputs with float32
// accumulation (mixed precision as torch.autocast does it). Ops read it from the compute context
// they are given (ops/compute_context.h), never from hidden state.
#pragma once
#include <string>

#include "ops/cpu_features.h"

namespace longtron::ops {

/// What float GEMMs and attention compute in. kBFloat16: inputs rounded to bf16, products and
/// sums in fp32, results fp32 (Micikevicius et al. 2018, "Mixed Precision Training").
enum class ComputeType { kFloat32, kBFloat16 };

/// "float32" or "bfloat16" (the names of model.dtype and of the metrics rows' dtype).
const char* compute_type_name(ComputeType type);

/// cpu_has("avx512_bf16"): AVX512-BF16 (bf16 dot products), AVX-512 state saved by the operating
/// system, and neither "avx512_bf16" nor "avx512f" in kCpuFeaturesMaskEnv. Reads the environment.
bool cpu_has_avx512_bf16();

/// Test-only switch (no command or config sets it; process-wide): with it on, bf16 also runs where
/// native bf16 is missing (bf16_emulated()), so that the bf16 kernels and trainer are tested on
/// such CPUs, or on any under kCpuFeaturesMaskEnv. Users keep resolve_dtype's rule.
void set_bf16_emulation_for_tests(bool on);

/// Whether bf16 runs emulated: the test-only switch is on, native bf16 is missing (no
/// cpu_has_avx512_bf16(), or oneDNN's ISA lacks AVX512-BF16) and the CPU has AVX-512F, BW, VL and
/// DQ. Then resolve_dtype accepts an explicit "bfloat16" ("auto" still picks float32), attention
/// runs its bf16 kernel with the instructions emulated bit for bit (ops/bf16_emulation.h), and
/// oneDNN runs its bf16 matmul on whatever ISA it has (avx512_core: converted to fp32).
bool bf16_emulated();

/// The canonical spelling of a dtype name: "float32", "bfloat16" or "auto" for those names and
/// InternEvo's "torch.float32" / "torch.bfloat16"; "" for anything else.
std::string canonical_dtype(const std::string& name);

/// The compute type of `dtype` (a canonical_dtype spelling) on this CPU. "auto": kBFloat16 when the
/// CPU has native bf16 (cpu_has_avx512_bf16() and oneDNN's kernels use it), else kFloat32; `note`
/// (if given) receives the reason, for the start-up line. "bfloat16" on a CPU without native bf16
/// throws longtron::Error naming `where` (e.g. "model.dtype") and the missing instruction set.
ComputeType resolve_dtype(const std::string& dtype, const std::string& where,
                          std::string* note = nullptr);

}  // namespace longtron::ops
