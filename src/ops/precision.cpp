#include "ops/precision.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {
namespace {
std::atomic<bool> emulation_for_tests{false};
}  // namespace

bool cpu_feature_masked(const std::string& feature) {
  const char* env = std::getenv(kCpuFeaturesMaskEnv);
  if (env == nullptr) return false;
  std::istringstream in(env);
  for (std::string item; std::getline(in, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos && item.substr(b, e - b + 1) == feature) return true;
  }
  return false;
}

namespace {
/// AVX512-BF16 in cpuid and AVX-512 state (opmask, ZMM) enabled by the OS in XCR0.
bool cpuid_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE6u) != 0xE6u) return false;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a & (1u << 5)) != 0;
}
}  // namespace

const char* compute_type_name(ComputeType type) {
  return type == ComputeType::kBFloat16 ? "bfloat16" : "float32";
}

bool cpu_has_avx512_bf16() {
  static const bool cpu = cpuid_avx512_bf16();
  return cpu && !cpu_feature_masked("avx512_bf16");
}

void set_bf16_emulation_for_tests(bool on) { emulation_for_tests = on; }

bool bf16_emulated() {
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return emulation_for_tests && avx512 && !(cpu_has_avx512_bf16() && gemm_backend().native_bf16);
}

std::string canonical_dtype(const std::string& name) {
  if (name == "float32" || name == "torch.float32") return "float32";
  if (name == "bfloat16" || name == "torch.bfloat16") return "bfloat16";
  if (name == "auto") return "auto";
  return "";
}

namespace {
/// The words of the first "flags" line of /proc/cpuinfo, with spaces around each; "" if unreadable.
std::string cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("flags", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 1) + " ";
  return "";
}
}  // namespace

void check_cpu_features_mask() {
  const char* env = std::getenv(kCpuFeaturesMaskEnv);
  if (env == nullptr) return;
  const std::string flags = cpuinfo_flags();
  std::istringstream in(env);
  for (std::string item; std::getline(in, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    const std::string name = item.substr(b, e - b + 1);
    check(name == "avx512_bf16" || name == "amx_bf16" || flags.empty() ||
              flags.find(" " + name + " ") != std::string::npos,
          "{}: \"{}\" is neither a /proc/cpuinfo flag of this CPU nor one longtron consults "
          "(avx512_bf16, amx_bf16)", kCpuFeaturesMaskEnv, name);
  }
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
      !cpu ? std::string(cpu_feature_masked("avx512_bf16") && cpuid_avx512_bf16()
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
