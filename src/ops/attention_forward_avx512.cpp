// The fp32/double attention forward compiled for AVX-512 (ops/kernel_isa.h).
#define LONGTRON_ISA avx512
#define LONGTRON_ISA_TARGET LONGTRON_TARGET_AVX512
#define LONGTRON_ISA_AVX512 1
#include "ops/attention.cpp"  // NOLINT(bugprone-suspicious-include)
