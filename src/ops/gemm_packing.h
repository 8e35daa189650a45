// When the float and bf16 GEMMs pack their B operand once per call (ops/onednn_matmul.cpp).
#pragma once
#include <cstdint>

#include "core/grow_buffer.h"

namespace longtron::ops {

/// Rows of op(A) from which a GEMM reorders B once per call into the blocked layout its kernel
/// reads, instead of letting the kernel copy B again for every block of rows it takes (the same
/// bits either way). Below it the reorder cost about what it saved on the shapes measured.
inline constexpr int64_t kGemmPackBRows = 512;

/// Largest packed B, in bytes (a per-thread buffer kept at the largest seen): a B beyond it (a
/// weight gradient's activations over a long row) is left to the kernel's own copies, so the
/// buffer stays small against the step's memory whatever the row length.
inline constexpr int64_t kGemmPackedBMaxBytes = int64_t{16} << 20;

/// A cache line of a packed operand (oneDNN reads it aligned).
struct alignas(64) PackedLine {
  unsigned char bytes[64];
};

/// One bf16 B read by a run of GEMMs of one shape, C[M, N] = alpha·op(A)·op(B) + beta·C (the
/// head's chunks all read the head's weight): packed once into the kernel's blocked layout, then
/// every gemm() of M rows runs on it, with the same bits as gemm_bf16 on B as given. A gemm() of
/// another row count (a last, shorter chunk), and every gemm() where the packed layout would
/// exceed kGemmPackedBMaxBytes, runs gemm_bf16 on the B it is given. `buffer` holds the packed
/// copy and must outlive the object.
class SharedBf16B {
 public:
  SharedBf16B(GrowBuffer<PackedLine>& buffer, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
              float alpha, float beta, const uint16_t* B);
  /// C[M, N] from A (bf16 bits, op(A) [M, K]) and B, which must hold the values packed.
  void gemm(int64_t M, const uint16_t* A, const uint16_t* B, float* C) const;

 private:
  bool ta_, tb_;
  int64_t M_, N_, K_;
  float alpha_, beta_;
  const PackedLine* packed_ = nullptr;  // nullptr: B is used as given
};

}  // namespace longtron::ops
