// When the float and bf16 GEMMs pack their B operand once per call (ops/onednn_matmul.cpp).
#pragma once
#include <cstdint>

namespace longtron::ops {

/// Rows of op(A) from which a GEMM reorders B once per call into the blocked layout its kernel
/// reads, instead of letting the kernel copy B again for every block of rows it takes (the same
/// bits either way). Below it the reorder cost about what it saved on the shapes measured.
inline constexpr int64_t kGemmPackBRows = 512;

/// Largest packed B, in bytes (a per-thread buffer kept at the largest seen): a B beyond it (a
/// weight gradient's activations over a long row) is left to the kernel's own copies, so the
/// buffer stays small against the step's memory whatever the row length.
inline constexpr int64_t kGemmPackedBMaxBytes = int64_t{16} << 20;

}  // namespace longtron::ops
