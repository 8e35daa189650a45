#include "ops/cpu_features.h"

#include <cpuid.h>
#include <fmt/core.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "ops/bf16_tile_gemm.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace longtron::ops {

namespace {

/// One feature: its /proc/cpuinfo name, the cpuid leaf, subleaf, register (0 EAX .. 3 EDX) and
/// bit that report it, and the XCR0 bits the operating system must set for its registers.
struct Feature {
  const char* name;
  unsigned leaf, subleaf, reg, bit;
  uint64_t xcr0;
};
constexpr uint64_t kAvxState = 0x6;              // SSE, AVX (YMM upper halves)
constexpr uint64_t kAvx512State = 0xE6;          // + opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kAmxState = 0xE6 | (3u << 17);  // + XTILECFG, XTILEDATA
constexpr Feature kFeatures[] = {
    {"avx2", 7, 0, 1, 5, kAvxState},          {"fma", 1, 0, 2, 12, kAvxState},
    {"avx512f", 7, 0, 1, 16, kAvx512State},   {"avx512dq", 7, 0, 1, 17, kAvx512State},
    {"avx512bw", 7, 0, 1, 30, kAvx512State},  {"avx512vl", 7, 0, 1, 31, kAvx512State},
    {"avx512_bf16", 7, 1, 0, 5, kAvx512State}, {"amx_bf16", 7, 0, 3, 22, kAmxState},
    {"amx_tile", 7, 0, 3, 24, kAmxState},
};

const Feature* find_feature(const std::string& name) {
  for (const Feature& f : kFeatures)
    if (name == f.name) return &f;
  return nullptr;
}

uint64_t xcr0() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // no OSXSAVE
  uint32_t lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

bool query_cpuid(const Feature& f, uint64_t os_state) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(f.leaf, f.subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return ((r[f.reg] >> f.bit) & 1u) && (os_state & f.xcr0) == f.xcr0;
}

/// What cpuid reports, asked once: under a hypervisor each cpuid instruction traps (tens of
/// microseconds), and the dispatch points ask on every call.
bool cpuid_has(const Feature& f) {
  static const std::vector<bool> reported = [] {
    const uint64_t os_state = xcr0();
    std::vector<bool> has;
    for (const Feature& g : kFeatures) has.push_back(query_cpuid(g, os_state));
    return has;
  }();
  return reported[static_cast<size_t>(&f - kFeatures)];
}

/// The trimmed, non-empty names of a mask's text (nullptr: none).
std::vector<std::string> names_of(const char* mask) {
  std::vector<std::string> names;
  if (mask == nullptr) return names;
  std::istringstream in(mask);
  for (std::string item; std::getline(in, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) names.push_back(item.substr(b, e - b + 1));
  }
  return names;
}

/// The mask's names now (tests set it for a scope).
std::vector<std::string> mask_names() { return names_of(std::getenv(kCpuFeaturesMaskEnv)); }

/// The mask as the process started with it: oneDNN's cap is fixed once per process, so a test
/// that sets the mask for a scope must not fix it for the rest of the process.
const std::vector<std::string> kStartupMask = mask_names();

/// cpu_has() under the mask `names`.
bool has_under(const std::string& feature, const std::vector<std::string>& names) {
  const Feature* f = find_feature(feature);
  if (f == nullptr || !cpuid_has(*f)) return false;
  const bool wide = feature.rfind("avx512", 0) == 0 || feature.rfind("amx", 0) == 0;
  for (const std::string& name : names)
    if (name == feature || (wide && name == "avx512f")) return false;
  return true;
}

bool avx512_under(const std::vector<std::string>& names) {
  return has_under("avx512f", names) && has_under("avx512bw", names) &&
         has_under("avx512vl", names) && has_under("avx512dq", names);
}

/// The words of the first "flags" line of /proc/cpuinfo, with spaces around each; "" if unreadable.
std::string cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("flags", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 1) + " ";
  return "";
}

}  // namespace

bool cpu_reports(const std::string& feature) {
  const Feature* f = find_feature(feature);
  return f != nullptr && cpuid_has(*f);
}

bool cpu_has(const std::string& feature) { return has_under(feature, mask_names()); }

void check_cpu_features_mask() {
  const std::vector<std::string> names = mask_names();
  if (names.empty()) return;
  const std::string flags = cpuinfo_flags();
  std::string known;
  for (const Feature& f : kFeatures) known += (known.empty() ? "" : ", ") + std::string(f.name);
  for (const std::string& name : names)
    check(find_feature(name) != nullptr || flags.empty() ||
              flags.find(" " + name + " ") != std::string::npos,
          "{}: \"{}\" is neither a /proc/cpuinfo flag of this CPU nor one longtron consults ({})",
          kCpuFeaturesMaskEnv, name, known);
}

KernelIsa kernel_isa() {
  return avx512_under(mask_names()) ? KernelIsa::kAvx512 : KernelIsa::kAvx2;
}

const char* kernel_isa_name(KernelIsa isa) { return isa == KernelIsa::kAvx512 ? "avx512" : "avx2"; }

std::string kernels_chosen() {
  std::string bf16 = "bf16 attention: none (no AVX512-BF16)";
  if (attention_bf16_native())
    bf16 = std::string("bf16 attention avx512_bf16") + (detail::native::amx_available() ? " + amx_bf16" : "");
  else if (bf16_emulated())
    bf16 = "bf16 attention avx512 (emulated)";
  return fmt::format("fp32 attention, tiles, rounding {}; {}", kernel_isa_name(kernel_isa()), bf16);
}

namespace detail {

void limit_onednn_isa() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::vector<std::string>& mask = kStartupMask;
    if (mask.empty()) return;  // nothing hidden: oneDNN sees the whole CPU
    dnnl_cpu_isa_t cap = dnnl_cpu_isa_all;
    if (!has_under("amx_bf16", mask) || !has_under("amx_tile", mask))
      cap = dnnl_cpu_isa_avx512_core_bf16;
    if (!has_under("avx512_bf16", mask)) cap = dnnl_cpu_isa_avx512_core_vnni;
    if (!avx512_under(mask)) cap = dnnl_cpu_isa_avx2;
    // Fails only once oneDNN has run, i.e. never here: every oneDNN entry point calls this first.
    if (cap != dnnl_cpu_isa_all) dnnl_set_max_cpu_isa(cap);
  });
}

}  // namespace detail

}  // namespace longtron::ops
