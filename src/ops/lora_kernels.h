// Fused fp32 kernels for one LoRA adapter (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
// Language Models"; PEFT's y = W x + s · B A x): the adapter's forward and backward each in one
// pass over the rows, in one parallel region.
//
// Why not BLAS: the adapter's products are thin (one side r = 8–64 wide), so a GEMM library runs
// them at a fraction of its rate, and the backward as six GEMMs reads x twice and dy twice and
// opens six or more parallel regions. Here each block of 64 rows runs all the adapter's products
// while its rows of x and dy sit in L2, with the register-blocked micro-GEMM of the attention
// tiles (ops/tile_gemm.h); the sums over rows (dA, dB) go to per-chunk partials added in a fixed
// order, so the result is the same for any thread count.
#pragma once
#include <cstdint>

#include <vector>

namespace longtron::ops {

/// Where an adapter's output lands when B covers only some of its linear's output columns (Llama's
/// q_proj, k_proj, v_proj in the fused, grouped qkv projection): rows [b_row, b_row + count) of B
/// are columns [y_col, y_col + count) of y and dy, whose rows are ldy wide. Default (ldy 0, no
/// segments): B's out rows are all of y's out columns, in order.
struct LoraOutputs {
  struct Segment {
    int64_t y_col, b_row, count;
  };
  int64_t ldy = 0;
  std::vector<Segment> segments;
};

/// y[N, out] += s · (x Aᵀ) Bᵀ, x [N, in], A [r, in], B [out, r] (row-major, PEFT's shapes); with
/// `outputs`, into the columns its segments name.
/// Each row of y in a fixed order (the same bits for any thread count); s scales fp32 values
/// only (B in fp32, or the bf16 products' fp32 sums), never a bf16 operand.
/// bf16: every product reads bf16 operands (x, A, B and u rounded to nearest even, as
/// torch.autocast runs PEFT's lora_A and lora_B) with fp32 accumulation; x16, when given, is
/// x's rounding (core/bf16.h) already made, read instead of rounding x again.
void lora_forward(float* y, const float* x, const float* A, const float* B, float s, int64_t N,
                  int64_t in, int64_t out, int64_t r, bool bf16 = false,
                  const uint16_t* x16 = nullptr, const LoraOutputs& outputs = {});

/// The backward of lora_forward (u = x Aᵀ recomputed): with du = s · dy B [N, r],
///   dB [out, r] += s · dyᵀ u,   dA [r, in] += duᵀ x,   dx [N, in] = (accumulate_dx ? dx : 0) + du A.
/// The sums over rows run in at most 16 fixed chunks of rows added in order: the same bits for any
/// thread count. bf16: the products read bf16 operands (x, dy, A, B, u and du rounded) with fp32
/// accumulation, as lora_forward (x16, dy16: x's and dy's roundings when the caller has them).
/// With `outputs`, dy's columns are read where its segments name them.
/// Holds lora_kernel_scratch_bytes of grow-only scratch on the calling thread.
void lora_backward(float* dx, bool accumulate_dx, float* dA, float* dB, const float* dy,
                   const float* x, const float* A, const float* B, float s, int64_t N, int64_t in,
                   int64_t out, int64_t r, bool bf16 = false, const uint16_t* x16 = nullptr,
                   const uint16_t* dy16 = nullptr, const LoraOutputs& outputs = {});

/// The most scratch lora_forward and lora_backward hold for widths in, out and rank r at the
/// current OpenMP thread count: the chunks' partial sums, A and B as the products read them, and
/// per thread one block's u, du (and under bf16 its rounded rows of x and dy).
double lora_kernel_scratch_bytes(int64_t in, int64_t out, int64_t r, bool bf16);

}  // namespace longtron::ops
