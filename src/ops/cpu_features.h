// What this CPU offers the kernels, as the CPU reports it (cpuid, and the registers the operating
// system saves) less what LONGTRON_CPU_FEATURES_MASK hides, and the instruction set each
// dispatching kernel runs on. The build's baseline is x86-64-v3 (AVX2 + FMA); wider code is
// compiled per instruction set and chosen here at run time (ops/kernel_isa.h).
#pragma once
#include <string>

namespace longtron::ops {

/// The environment variable that hides CPU features from every dispatch point of longtron and
/// from oneDNN: a comma-separated list of feature names as /proc/cpuinfo spells them ("avx512f",
/// "avx512_bf16", "amx_bf16", ...). "avx512f" hides every AVX-512 feature (and AMX, whose kernels
/// are AVX-512 code). Tests set it to play a smaller CPU on a larger one.
inline constexpr const char* kCpuFeaturesMaskEnv = "LONGTRON_CPU_FEATURES_MASK";

/// Whether the CPU has `feature` (a /proc/cpuinfo name among "avx2", "fma", "avx512f",
/// "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16"; any other name is
/// false), the operating system saves the registers it needs, and kCpuFeaturesMaskEnv hides
/// neither it nor, for an AVX-512 or AMX feature, "avx512f". Reads the environment on every call.
bool cpu_has(const std::string& feature);

/// Whether the CPU itself reports `feature` (as cpu_has(), the mask ignored).
bool cpu_reports(const std::string& feature);

/// Throws longtron::Error naming kCpuFeaturesMaskEnv when it lists a name that is neither one
/// cpu_has() knows (whether this CPU has it or not) nor a flag of this CPU's /proc/cpuinfo: a
/// misspelling would otherwise hide nothing, silently.
void check_cpu_features_mask();

/// The instruction sets the dispatching kernels are compiled for (ops/kernel_isa.h).
enum class KernelIsa { kAvx2, kAvx512 };

/// AVX-512 (F, BW, VL, DQ) where cpu_has() all four, else AVX2. Reads the environment.
KernelIsa kernel_isa();

/// "avx2" or "avx512".
const char* kernel_isa_name(KernelIsa isa);

/// The kernels this process would run, in words for the start-up line, e.g. "fp32 attention,
/// tiles, rounding avx512; bf16 attention avx512_bf16 + amx_bf16".
std::string kernels_chosen();

namespace detail {
/// Caps oneDNN's instruction set at what kCpuFeaturesMaskEnv leaves (avx512f hidden: AVX2;
/// avx512_bf16: AVX512_CORE_VNNI; amx_bf16: AVX512_CORE_BF16), once, before oneDNN's first use
/// (every oneDNN entry point of ops/ calls it); no cap when nothing is hidden. The mask read is
/// the one the process started with (oneDNN's choice is fixed for the process). The mask is the one
/// switch: ONEDNN_MAX_CPU_ISA need not, and should not, be set beside it.
void limit_onednn_isa();
}  // namespace detail

}  // namespace longtron::ops
