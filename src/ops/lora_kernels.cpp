// Fused LoRA adapter kernels (see lora_kernels.h).
#include "ops/lora_kernels.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/bf16.h"
#include "ops/threads.h"
#include "ops/tile_gemm.h"

namespace longtron::ops {
namespace {

using detail::tile_gemm;

constexpr int64_t kBlockRows = 64;   // rows whose x and dy stay in L2 while all products run
constexpr int64_t kMinChunkRows = 256;
constexpr int64_t kMaxChunks = 16;   // partial sums kept: at most this many

/// Rows per chunk for N rows: a function of N only, so the partial sums (and their order) do not
/// depend on the thread count.
int64_t chunk_rows(int64_t N) {
  const int64_t even = (N + kMaxChunks - 1) / kMaxChunks;
  return std::max(kMinChunkRows, (even + kBlockRows - 1) / kBlockRows * kBlockRows);
}

/// v as the nearest bf16 value (core/bf16.h's rounding) when bf16, else v.
inline float operand(float v, bool bf16) { return bf16 ? bf16_to_float(float_to_bf16(v)) : v; }

/// dst[i] = operand(src[i]) for n values.
void copy_operands(float* dst, const float* src, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; ++i) dst[i] = operand(src[i], bf16);
}

/// dst[cols, rows] = scale · operand(src[rows, cols])ᵀ.
void transpose_operands(float* dst, const float* src, int64_t rows, int64_t cols, float scale,
                        bool bf16) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = scale * operand(src[i * cols + j], bf16);
}

/// The calling thread's scratch, grown to n floats.
float* scratch(int64_t n) {
  thread_local std::vector<float> buffer;
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

/// The m rows of src (width `width`) as the products read them: src itself in fp32; under bf16
/// the rows of `bits` (src's rounding, when the caller has it) widened, else src rounded, into
/// `room`. Rows start at row offset `row`.
const float* block_operand(float* room, const float* src, const uint16_t* bits, int64_t row,
                           int64_t m, int64_t width, bool bf16) {
  if (!bf16) return src + row * width;
  if (bits == nullptr) {
    copy_operands(room, src + row * width, m * width, true);
    return room;
  }
  const uint16_t* b = bits + row * width;
  for (int64_t i = 0; i < m * width; ++i) room[i] = bf16_to_float(b[i]);
  return room;
}

/// u [m, r] = x [m, in] · Aᵀ (At = Aᵀ [in, r]), then rounded to bf16 values under bf16 (the
/// operand of the next product).
void down_project(float* u, const float* x, const float* At, int64_t m, int64_t in, int64_t r,
                  bool bf16) {
  tile_gemm<float>(m, r, in, x, in, 1, At, r, u, r, false);
  if (bf16) copy_operands(u, u, m * r, true);
}

bool parallel_worth(int64_t chunks, int64_t N, int64_t in, int64_t out, int64_t r) {
  return chunks > 1 && N * (in + out) * r > kParallelMinWork;
}

}  // namespace

double lora_kernel_scratch_bytes(int64_t in, int64_t out, int64_t r, bool bf16) {
  // Aᵀ, s·B and a rounded A; per chunk the partial dBᵀ and dA; per thread u and du of one block
  // and, under bf16, its rows of x and dy rounded.
  const double threads = double(omp_get_max_threads());
  const double per_thread = double(2 * kBlockRows * r + (bf16 ? kBlockRows * (in + out) : 0));
  return 4.0 * (double(2 * r * in + r * out) + double(kMaxChunks * r * (in + out)) +
                threads * per_thread);
}

void lora_forward(float* y, const float* x, const float* A, const float* B, float s, int64_t N,
                  int64_t in, int64_t out, int64_t r, bool bf16, const uint16_t* x16) {
  if (N <= 0 || r <= 0) return;
  const int64_t rows = chunk_rows(N), chunks = (N + rows - 1) / rows;
  const int64_t per_thread = kBlockRows * (r + (bf16 ? in : 0));
  float* At = scratch(r * (in + out) + omp_get_max_threads() * per_thread);
  float* sBt = At + r * in;       // (s·B)ᵀ [r, out]
  float* threads = sBt + r * out;  // per thread: u [kBlockRows, r], x's rounded rows
  transpose_operands(At, A, r, in, 1.f, bf16);
  transpose_operands(sBt, B, out, r, s, bf16);
#pragma omp parallel if (parallel_worth(chunks, N, in, out, r))
  {
    float* u = threads + omp_get_thread_num() * per_thread;
    float* xr = u + kBlockRows * r;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t n0 = c * rows; n0 < std::min(N, (c + 1) * rows); n0 += kBlockRows) {
        const int64_t m = std::min(kBlockRows, N - n0);
        down_project(u, block_operand(xr, x, x16, n0, m, in, bf16), At, m, in, r, bf16);
        tile_gemm<float>(m, out, r, u, r, 1, sBt, out, y + n0 * out, out, true);
      }
    }
  }
}

void lora_backward(float* dx, bool accumulate_dx, float* dA, float* dB, const float* dy,
                   const float* x, const float* A, const float* B, float s, int64_t N, int64_t in,
                   int64_t out, int64_t r, bool bf16, const uint16_t* x16,
                   const uint16_t* dy16) {
  if (N <= 0 || r <= 0) {
    if (N > 0 && !accumulate_dx) std::fill(dx, dx + N * in, 0.f);
    return;
  }
  const int64_t rows = chunk_rows(N), chunks = (N + rows - 1) / rows;
  const int64_t per_chunk = r * (out + in);
  const int64_t per_thread = kBlockRows * (2 * r + (bf16 ? in + out : 0));
  float* At = scratch(2 * r * in + r * out + chunks * per_chunk +
                      omp_get_max_threads() * per_thread);
  float* Ar = At + r * in;   // A as the products read it [r, in]
  float* sB = Ar + r * in;   // s·B [out, r]
  float* partials = sB + out * r;  // per chunk: Σ uᵀ dy [r, out], then Σ duᵀ x [r, in]
  float* threads = partials + chunks * per_chunk;
  transpose_operands(At, A, r, in, 1.f, bf16);
  copy_operands(Ar, A, r * in, bf16);
  for (int64_t i = 0; i < out * r; ++i) sB[i] = s * operand(B[i], bf16);
#pragma omp parallel if (parallel_worth(chunks, N, in, out, r))
  {
    float* u = threads + omp_get_thread_num() * per_thread;
    float* du = u + kBlockRows * r;
    float* xr = du + kBlockRows * r;  // rounded rows of x and dy (bf16)
    float* dyr = xr + kBlockRows * in;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      float* dBt = partials + c * per_chunk;
      float* dA_c = dBt + r * out;
      for (int64_t n0 = c * rows; n0 < std::min(N, (c + 1) * rows); n0 += kBlockRows) {
        const int64_t m = std::min(kBlockRows, N - n0);
        const float* xb = block_operand(xr, x, x16, n0, m, in, bf16);
        const float* dyb = block_operand(dyr, dy, dy16, n0, m, out, bf16);
        const bool first = n0 == c * rows;
        down_project(u, xb, At, m, in, r, bf16);
        tile_gemm<float>(m, r, out, dyb, out, 1, sB, r, du, r, false);     // du = dy (s B)
        if (bf16) copy_operands(du, du, m * r, true);
        tile_gemm<float>(r, out, m, u, 1, r, dyb, out, dBt, out, !first);  // + uᵀ dy
        tile_gemm<float>(r, in, m, du, 1, r, xb, in, dA_c, in, !first);    // + duᵀ x
        tile_gemm<float>(m, in, r, du, r, 1, Ar, in, dx + n0 * in, in, accumulate_dx);
      }
    }
    // The chunks' partials in chunk order: dB += s · Σ (uᵀ dy)ᵀ, dA += Σ duᵀ x.
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) {
        float sum = 0.f;
        for (int64_t c = 0; c < chunks; ++c) sum += partials[c * per_chunk + k * out + o];
        dB[o * r + k] += s * sum;
      }
#pragma omp for schedule(static)
    for (int64_t k = 0; k < r; ++k)
      for (int64_t i = 0; i < in; ++i) {
        float sum = 0.f;
        for (int64_t c = 0; c < chunks; ++c) sum += partials[c * per_chunk + r * out + k * in + i];
        dA[k * in + i] += sum;
      }
  }
}

}  // namespace longtron::ops
