// bf16_tile_test.cpp's checks on the tile GEMMs with the bf16 instructions emulated in AVX-512F
// (ops/bf16_emulation.h): the path of a CPU without AVX512-BF16.
#define LONGTRON_BF16_EMULATED 1
#include "ops/bf16_tile_test.cpp"  // NOLINT(bugprone-suspicious-include)
