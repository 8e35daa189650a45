// What the GEMMs run on: oneDNN's version and the instruction set its kernels dispatch to.
#include <fmt/core.h>
#include <oneapi/dnnl/dnnl.h>

#include "ops/cpu_features.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {
const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}
}  // namespace

GemmBackend gemm_backend() {
  detail::limit_onednn_isa();
  const dnnl_version_t* v = dnnl_version();
  // The effective ISA is the CPU's, capped by LONGTRON_CPU_FEATURES_MASK (or ONEDNN_MAX_CPU_ISA).
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  GemmBackend b;
  b.library = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
  b.isa = isa_name(isa);
  const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  b.native_bf16 = (static_cast<unsigned>(isa) & bf16) == bf16;  // the ISA values are bit sets
  return b;
}

}  // namespace longtron::ops
