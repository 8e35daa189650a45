// The bf16 attention kernel (attention_bf16.cpp) compiled once more with its AVX512-BF16
// instructions emulated in AVX-512F (bf16_emulation.h, the same bits as vdpbf16ps) and no AMX,
// into namespace detail::emulated: bf16 attention on a CPU without AVX512-BF16, for tests only
// (set_bf16_emulation_for_tests). One source for both, as Highway compiles a file per target.
#define LONGTRON_BF16_EMULATED 1
#include "ops/attention_bf16.cpp"  // NOLINT(bugprone-suspicious-include)
