// How a tensor group holds a sequence-parallel activation [N, H] between the blocks: each rank a
// block of rows and hidden features. Megatron's sequence parallel (MSP/FSP) holds row blocks
// (x = T, y = 1); MindSpeed's 2D tensor parallel the x × y grid of [N/x, H/y] blocks. The
// embedding and the head of both modes gather and scatter through this one description.
#pragma once
#include <cstdint>

#include "comm/communicator.h"
#include "parallel/scratch.h"

namespace longtron::parallel {

/// full[N, H] ↔ blocks in tensor-rank order [x·y][N/x][H/y] (rank r = a + x·b holds rows block a
/// and hidden block b). Pure copies; N divisible by x and H by y (unchecked).
void blocks_to_full(float* full, const float* blocks, int64_t N, int64_t H, int x, int y);
void full_to_blocks(float* blocks, const float* full, int64_t N, int64_t H, int x, int y);

/// The block this rank holds of an [N, H] activation over `group` (size x·y): rows
/// [a·N/x, (a+1)·N/x) and features [b·H/y, (b+1)·H/y), a = group rank % x, b = group rank / x.
/// Every method is collective over `group` unless it says otherwise; N not divisible by x and y is
/// an Error naming both.
struct ActivationBlocks {
  comm::CommPtr group;
  int x = 1, y = 1;

  /// Row blocks over `group` (Megatron's sequence parallel: x = group size, y = 1).
  static ActivationBlocks rows(comm::CommPtr group);
  /// The 2D grid (x·y = group size).
  static ActivationBlocks grid(comm::CommPtr group, int x, int y);

  /// Rows of this rank's block (N/x); checks divisibility.
  int64_t block_rows(int64_t N) const;
  /// full[N, H] = all-gather of every rank's block [N/x, H/y] (`scratch` holds the blocks when y > 1).
  void gather(float* full, Scratch& scratch, const float* mine, int64_t N, int64_t H) const;
  /// mine[N/x, H/y] = this rank's block of Σ over the group of full[N, H] (adjoint of gather).
  void reduce_scatter(float* mine, Scratch& scratch, const float* full, int64_t N,
                      int64_t H) const;
  /// mine[N/x, H/y] = this rank's block of a replicated full[N, H]. Local copy, not collective.
  void take(float* mine, const float* full, int64_t N, int64_t H) const;
};

}  // namespace longtron::parallel
