// Kernels compiled once per instruction set, in one portable binary. The build's baseline is
// x86-64-v3 (AVX2 + FMA); a translation unit that compiles kernels for more defines, before its
// first include, LONGTRON_ISA (the namespace its kernels land in) and LONGTRON_ISA_TARGET (GCC's
// target string), and includes the kernel source: e.g. attention_avx512.cpp includes
// attention.cpp. The code between LONGTRON_ISA_BEGIN and LONGTRON_ISA_END is compiled for that
// target and lives in namespace detail::LONGTRON_ISA (inline, so `detail::tile_gemm` still names
// it), so no two instruction sets share a symbol and the linker cannot hand an AVX2 caller an
// AVX-512 copy of a shared inline function. Everything a kernel file includes from outside the
// kernels (the standard library, fmt, core/) is included before the region and so compiled for
// the baseline. This is how Highway (google/highway) compiles one source per target; unlike
// `target_clones`, the choice is made by the caller (ops/cpu_features.h), which honours
// LONGTRON_CPU_FEATURES_MASK. tests/cli/binary_isa_test.cpp disassembles the binary to check that
// no AVX-512 instruction lies outside the AVX-512 namespaces.
//
// GCC does not define __AVX512F__ inside a target region, so kernel code tests
// LONGTRON_KERNEL_AVX512 instead (true in AVX-512 compilations and in -march=native builds on an
// AVX-512 machine).
#pragma once

#ifndef LONGTRON_ISA
#define LONGTRON_ISA avx2
#endif

#if defined(LONGTRON_ISA_AVX512) || defined(__AVX512F__)
#define LONGTRON_KERNEL_AVX512 1
#else
#define LONGTRON_KERNEL_AVX512 0
#endif

#define LONGTRON_ISA_DO_PRAGMA(x) _Pragma(#x)
#ifdef LONGTRON_ISA_TARGET
#define LONGTRON_ISA_PUSH_TARGET(t) \
  _Pragma("GCC push_options") LONGTRON_ISA_DO_PRAGMA(GCC target(t))
#define LONGTRON_ISA_TARGET_BEGIN LONGTRON_ISA_PUSH_TARGET(LONGTRON_ISA_TARGET)
#define LONGTRON_ISA_TARGET_END _Pragma("GCC pop_options")
#else
#define LONGTRON_ISA_TARGET_BEGIN
#define LONGTRON_ISA_TARGET_END
#endif

/// Opens the kernel region: the target, then namespace longtron::ops::detail::LONGTRON_ISA.
#define LONGTRON_ISA_BEGIN \
  LONGTRON_ISA_TARGET_BEGIN namespace longtron::ops::detail { inline namespace LONGTRON_ISA {
/// Closes what LONGTRON_ISA_BEGIN opened.
#define LONGTRON_ISA_END \
  }                      \
  }                      \
  LONGTRON_ISA_TARGET_END

/// The instruction-set strings of the compilations (GCC target syntax).
#define LONGTRON_TARGET_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"
#define LONGTRON_TARGET_AVX512_BF16 \
  "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,prefer-vector-width=512"
