#include "ops/precision.h"

#include <atomic>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {
namespace {
std::atomic<bool> emulation_for_tests{false};
}  // namespace

const char* compute_type_name(ComputeType type) {
  return type == ComputeType::kBFloat16 ? "bfloat16" : "float32";
}

bool cpu_has_avx512_bf16() { return cpu_has("avx512_bf16"); }

void set_bf16_emulation_for_tests(bool on) { emulation_for_tests = on; }

bool bf16_emulated() {
  const bool avx512 = kernel_isa() == KernelIsa::kAvx512;
  return emulation_for_tests && avx512 && !(cpu_has_avx512_bf16() && gemm_backend().native_bf16);
}

std::string canonical_dtype(const std::string& name) {
  if (name == "float32" || name == "torch.float32") return "float32";
  if (name == "bfloat16" || name == "torch.bfloat16") return "bfloat16";
  if (name == "auto") return "auto";
  return "";
}

ComputeType resolve_dtype(const std::string& dtype, const std::string& where, std::string* note) {
  check_cpu_features_mask();  // a misspelt name would otherwise hide nothing, silently
  const std::string d = canonical_dtype(dtype);
  check(!d.empty(), "{}: \"{}\" is not one of float32 | bfloat16 | auto (or torch.float32 | "
        "torch.bfloat16)", where, dtype);
  if (d == "float32") return ComputeType::kFloat32;
  const bool cpu = cpu_has_avx512_bf16();
  const GemmBackend gemm = gemm_backend();
  const bool native = cpu && gemm.native_bf16;
  // Why there is no native bf16, for both the fallback note and the error.
  const std::string missing =
      !cpu ? std::string(cpu_reports("avx512_bf16")
                             ? "AVX512-BF16 (avx512_bf16, hidden by " + std::string(kCpuFeaturesMaskEnv) + ")"
                             : "AVX512-BF16 (avx512_bf16)")
           : "AVX512-BF16 kernels in " + gemm.library + " (its ISA is " + gemm.isa + ")";
  if (d == "auto") {
    if (note) *note = native ? "auto: this CPU has AVX512-BF16" : "auto: this CPU lacks " + missing;
    return native ? ComputeType::kBFloat16 : ComputeType::kFloat32;
  }
  if (!native && bf16_emulated()) {
    if (note) *note = "bf16 emulated (a test-only switch): this CPU lacks " + missing;
    return ComputeType::kBFloat16;
  }
  check(native, "{}: \"bfloat16\" needs native bf16 dot products, and this CPU lacks {} (bf16 "
        "emulated in fp32 would be slower than float32); use \"auto\" or \"float32\"", where, missing);
  if (note) *note = "this CPU has AVX512-BF16";
  return ComputeType::kBFloat16;
}

}  // namespace longtron::ops
