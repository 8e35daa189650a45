// Kernels of the decoder with explicit forward and backward (no autograd), after llm.c.
// Every kernel is a template over the scalar type T (float for training, double for the
// finite-difference tests); explicit instantiations for float and double live in the .cpp files.
//
// Conventions: arguments are (outputs, saved state, inputs, weights, sizes); all
// tensors are dense row-major; N = tokens of the (local) row. Backward functions OVERWRITE input
// gradients (dx, dq, ...) and ACCUMULATE (+=) parameter gradients (dW, dweight, dtable); any
// gradient pointer may be nullptr to skip it. No kernel communicates.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ops/adamw.h"

namespace longtron::ops {

class ComputeContext;  // ops/compute_context.h

// ---- GEMM -------------------------------------------------------------------------------------
/// C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [M,K], op(B) is [K,N].
/// float → oneDNN's matmul primitive (one cached per shape, transposes, alpha and beta; for a given
/// shape and thread count the result is deterministic); double → OpenBLAS's cblas_dgemm (oneDNN has
/// no double GEMM; double serves the finite-difference tests). Uses the OpenMP threads of
/// set_num_threads. In float under a kBFloat16 context (ops/compute_context.h) A and B are first
/// rounded to bf16 (nearest even; an operand inside the context's weights is read from its bf16
/// weight copy instead, one inside an activation the caller shares from its bits) and the
/// product runs as gemm_bf16: fp32 accumulation and fp32 C. Double ignores the context.
template <typename T>
void gemm(const ComputeContext& cc, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          T alpha, const T* A, const T* B, T beta, T* C);
/// gemm in float32 (ComputeContext::fp32()).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C);

/// The same contract with bf16 inputs (raw bfloat16 bits, as core/bf16.h's float_to_bf16 and
/// round_to_bf16 make them) and an fp32 C accumulated in fp32: oneDNN's matmul primitive, one
/// primitive cached per (shape, transposes, alpha, beta). Throws longtron::Error when oneDNN has no bf16 matmul for
/// this CPU (it needs avx512_core; native bf16 dot products need avx512_core_bf16).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, const uint16_t* B, float beta, float* C);

/// C[M, N] = round_to_bf16(op(A)·op(B)) (bf16 bits) from bf16 A and B: the product gemm_bf16
/// computes with alpha = 1 and beta = 0, rounded by oneDNN's kernel as it stores each result
/// instead of in a pass of its own over an fp32 C (the same bits; checked in the GEMM tests), as
/// torch.autocast's bf16 linears write bf16. For a GEMM whose output is only read in bf16. Errors
/// as gemm_bf16.
void gemm_bf16_out16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const uint16_t* A, const uint16_t* B, uint16_t* C);

/// out[i] = float_to_bf16(x[i]) (core/bf16.h: nearest even, NaN kept quiet, subnormals kept);
/// i < n. AVX-512F where the CPU has it, else scalar (the same bits); OpenMP threads.
void round_to_bf16(const float* x, int64_t n, uint16_t* out);
/// round_to_bf16 on the calling thread alone (the same bits), for use inside a parallel region.
void round_to_bf16_serial(const float* x, int64_t n, uint16_t* out);
/// round_to_bf16 of x[0..n) into bits and, in the same pass, the rounded values into wide
/// (widen_bf16 of bits; wide may be x itself): one read of x for both. OpenMP threads.
void round_to_bf16_widened(const float* x, int64_t n, uint16_t* bits, float* wide);
/// One array for round_to_bf16_all: x[0..n) into out.
struct Bf16Rounding {
  const float* x = nullptr;
  int64_t n = 0;
  uint16_t* out = nullptr;
};
/// round_to_bf16 of every array of `jobs` in one parallel region (one fork and barrier for all;
/// the same bits).
void round_to_bf16_all(std::initializer_list<Bf16Rounding> jobs);

/// gemm<float> under kBFloat16 with B already in bf16 (raw bits: a weight rounded once, e.g. an
/// all-gathered bf16 weight): A is rounded to bf16 (nearest even) and the product is gemm_bf16's,
/// fp32 accumulation and fp32 C. Bitwise the result of gemm<float> under a kBFloat16 context on
/// any float B whose rounding is B16. Needs no context; errors as gemm_bf16.
void gemm_bf16_weight(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, const uint16_t* B16, float beta, float* C);

/// One float GEMM operand x[0..n) for bf16_operands (x = nullptr: none).
struct Bf16Operand {
  const float* x = nullptr;
  int64_t n = 0;
};
/// The bf16 roundings of float operands that several GEMMs share, so that each is rounded once
/// (then gemm_bf16): an operand inside the context's weights or a shared activation comes from
/// its bits (ComputeContext::weights, ::shared), the others are rounded as gemm rounds them
/// (nearest even) in one parallel region into the calling thread's operand buffer, the one gemm
/// rounds into, so the pointers stay valid until the next gemm, gemm_bf16_weight or
/// bf16_operands on this thread. nullptr for an absent operand.
std::array<const uint16_t*, 3> bf16_operands(const ComputeContext& cc,
                                             std::array<Bf16Operand, 3> operands);
/// bf16_operands of the one operand x[0..n).
const uint16_t* bf16_operand(const ComputeContext& cc, const float* x, int64_t n);

/// out[i] = the float value of the bf16 bits x[i] (exact: bf16 is the top half of an fp32);
/// i < n. OpenMP threads. The inverse of round_to_bf16 on its outputs.
void widen_bf16(const uint16_t* x, int64_t n, float* out);

/// The GEMM library and the instruction set its kernels dispatch to on this CPU.
struct GemmBackend {
  std::string library;       ///< e.g. "oneDNN 2.6.3"
  std::string isa;           ///< oneDNN's effective ISA, e.g. "avx512_core_bf16"
  bool native_bf16 = false;  ///< the ISA has bf16 dot-product instructions (AVX512-BF16)
};
/// Queries oneDNN (cheap; ONEDNN_MAX_CPU_ISA in the environment caps the ISA it reports and uses).
GemmBackend gemm_backend();

// ---- Linear (HF layout W[out, in]) --------------------------------------------------------------
// Each GEMM of a linear runs in the precision of the compute context `cc` (ops/compute_context.h);
// the forms without it compute in float32 (ComputeContext::fp32()).

/// y[N,out] = x[N,in] · W[out,in]ᵀ (+ bias[out] if bias != nullptr).
template <typename T>
void linear_forward(const ComputeContext& cc, T* y, const T* x, const T* W, const T* bias,
                    int64_t N, int64_t in, int64_t out);
template <typename T>
void linear_forward(T* y, const T* x, const T* W, const T* bias, int64_t N, int64_t in,
                    int64_t out);
/// linear_forward with the weight already in bf16 (W16[out,in] raw bits, gemm_bf16_weight): x
/// rounded to bf16, fp32 accumulation, fp32 y and bias. Bitwise linear_forward<float> under a
/// kBFloat16 context on a float W whose rounding is W16.
void linear_forward_bf16(float* y, const float* x, const uint16_t* W16, const float* bias,
                         int64_t N, int64_t in, int64_t out);
/// linear_forward_bf16 on an input already rounded (x16: round_to_bf16 of x, [N,in]), for a caller
/// that shares the rounding with other GEMMs: the same bits.
void linear_forward_bf16(float* y, const uint16_t* x16, const uint16_t* W16, const float* bias,
                         int64_t N, int64_t in, int64_t out);
/// dx[N,in] = beta·dx + dy16·W16 on an output gradient already rounded (dy16, [N,out]; W16
/// [out,in]), for a caller that shares the rounding with other GEMMs: the input gradient
/// linear_backward_bf16 makes from dy, the same bits; no weight gradient.
void linear_input_grad_bf16(float* dx, const uint16_t* dy16, const uint16_t* W16, int64_t N,
                            int64_t in, int64_t out, float beta);
/// The one linear backward (dense, weight-parallel and, between its communications, the
/// tensor-parallel linears all run these GEMMs): dx[N,in] = dx_beta·dx + dy·W (dx_beta 0
/// overwrites, 1 accumulates); dW[out,in] = dW_beta·dW + dyᵀ·x (1 accumulates into a parameter
/// gradient, 0 overwrites a scratch that is reduced afterwards); dbias[out] += Σ_n dy. Any of dx,
/// dW, dbias may be nullptr to skip it. In this order: dx, dW, dbias.
template <typename T>
void linear_backward(const ComputeContext& cc, T* dx, T* dW, T* dbias, const T* dy, const T* x,
                     const T* W, int64_t N, int64_t in, int64_t out, T dx_beta = T(0),
                     T dW_beta = T(1));
template <typename T>
void linear_backward(T* dx, T* dW, T* dbias, const T* dy, const T* x, const T* W, int64_t N,
                     int64_t in, int64_t out, T dx_beta = T(0), T dW_beta = T(1));
/// The gated FFN's two projections of one input (Megatron-LM's fused linear_fc1 of gated MLPs):
/// a[N,out] = x·W1ᵀ (+ bias1), b[N,out] = x·W3ᵀ (+ bias3), as linear_forward twice; under
/// kBFloat16 with both weights in the context's copy, x is rounded once for both GEMMs (the
/// same bits). Biases may be nullptr.
template <typename T>
void linear_pair_forward(const ComputeContext& cc, T* a, T* b, const T* x, const T* W1,
                         const T* bias1, const T* W3, const T* bias3, int64_t N, int64_t in,
                         int64_t out);
/// round_to_bf16 of linear_pair_forward's a and b into a16, b16 [N, out] (bits), written by the
/// GEMMs themselves (gemm_bf16_out16; the same bits), for a and b read only in bf16 (the gated
/// FFN's saves under mixed precision). Only under kBFloat16 with both weights in the context's
/// copy and no biases: returns false, writing nothing, otherwise.
bool linear_pair_forward_out16(const ComputeContext& cc, uint16_t* a16, uint16_t* b16,
                               const float* x, const float* W1, const float* bias1,
                               const float* W3, const float* bias3, int64_t N, int64_t in,
                               int64_t out);
/// round_to_bf16 of linear_forward's y = x·Wᵀ into y16 [N, out] (bits), written by the GEMM itself
/// (gemm_bf16_out16; the same bits), for an output read only in bf16 (a tensor-parallel gate/up
/// shard). Only under kBFloat16 with W in the context's copy (no bias: it is added in fp32):
/// returns false, writing nothing, otherwise.
bool linear_forward_out16(const ComputeContext& cc, uint16_t* y16, const float* x, const float* W,
                          int64_t N, int64_t in, int64_t out);
/// The backward of linear_pair_forward, as linear_backward for W1 (dx overwritten) then for W3
/// (dx accumulated): dx = da·W1 + db·W3; dW1 += daᵀ·x, dW3 += dbᵀ·x; dbias1 += Σ da, dbias3 +=
/// Σ db (gradients may be nullptr). Under kBFloat16 with both weights in the context's copy and
/// both weight gradients wanted, x is rounded once for the two weight gradients, and da and db
/// are read from their shared bits where the caller shares both (the same bits either way).
template <typename T>
void linear_pair_backward(const ComputeContext& cc, T* dx, T* dW1, T* dbias1, T* dW3, T* dbias3,
                          const T* da, const T* db, const T* x, const T* W1, const T* W3,
                          int64_t N, int64_t in, int64_t out);
/// linear_backward with the weight already in bf16 (W16[out,in] raw bits): dx through
/// gemm_bf16_weight (dy rounded to bf16), dW and dbias as linear_backward<float> under `cc`.
/// Bitwise linear_backward<float> under a kBFloat16 context on a float W whose rounding is W16.
void linear_backward_bf16(const ComputeContext& cc, float* dx, float* dW, float* dbias,
                          const float* dy, const float* x, const uint16_t* W16, int64_t N,
                          int64_t in, int64_t out, float dx_beta = 0.f, float dW_beta = 1.f);
/// The input gradient alone, dx[N,in] = beta·dx + dy·W: the part of linear_backward that a
/// tensor-parallel linear reduces over its group before the weight gradient.
template <typename T>
void linear_input_grad(const ComputeContext& cc, T* dx, const T* dy, const T* W, int64_t N,
                       int64_t in, int64_t out, T beta = T(0));
template <typename T>
void linear_input_grad(T* dx, const T* dy, const T* W, int64_t N, int64_t in, int64_t out,
                       T beta = T(0));
/// The weight gradient of every linear, dense or parallel: dW[out,in] = beta·dW + dyᵀ·x over
/// dy[N,out] and x[N,in] (beta 1 accumulates, as parameter gradients do; 0 overwrites a scratch
/// that is reduced afterwards).
template <typename T>
void linear_weight_grad(const ComputeContext& cc, T* dW, const T* dy, const T* x, int64_t N,
                        int64_t in, int64_t out, T beta = T(1));
template <typename T>
void linear_weight_grad(T* dW, const T* dy, const T* x, int64_t N, int64_t in, int64_t out,
                        T beta = T(1));
/// The bias gradient of every linear: dbias[out] += Σ_n dy[n,:] over dy[rows,out] (column sums in
/// double). No-op when dbias is nullptr.
template <typename T>
void bias_grad(T* dbias, const T* dy, int64_t rows, int64_t out);

// ---- Embedding ----------------------------------------------------------------------------------
/// out[N,H] = table[ids[n], :]. ids must be in [0, V); the caller maps negative ids to abs(id).
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t N, int64_t H);
/// dtable[ids[n], :] += dout[n, :].
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t H);

// ---- RMSNorm ------------------------------------------------------------------------------------
/// out[N,H] = x / sqrt(mean(x²) + eps) ⊙ (offset + weight[H]); rstd[N] saved for backward.
/// offset 0 is Llama's RMSNorm; offset 1 is Gemma's, which scales by 1 + w with w stored as
/// Transformers stores it (Gemma3RMSNorm: zeros at init). With out16 (float only), also
/// round_to_bf16 of out into out16[N,H], each row while it is in cache: the bits a bf16 GEMM
/// reading out would make.
template <typename T>
void rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t H, T eps,
                      uint16_t* out16 = nullptr, T offset = T(0));
/// dx[N,H] (overwritten), dweight[H] (+=), for the forward with the same offset.
template <typename T>
void rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight,
                       const T* rstd, int64_t N, int64_t H, T offset = T(0));

// ---- RoPE (Hugging Face rotate_half), in place ------------------------------------------------
/// x[N, heads, d] rotated at positions indexes[N]: angle(n, i) = indexes[n] · base^(-2i/d),
/// pairs (i, i + d/2). Applied in place; `row_stride` is the distance between tokens in elements
/// (heads·d for a dense tensor) so q and k inside a packed qkv buffer can be rotated directly.
template <typename T>
void rope_forward(T* x, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                  int64_t row_stride, double base);
/// The adjoint: rotates the gradient by the negative angle, in place.
template <typename T>
void rope_backward(T* dx, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                   int64_t row_stride, double base);
/// base^(−2i/d) for i < d/2: the inverse frequencies of plain RoPE.
/// RoPE's rotation one token at a time (rope_forward with sign +1, rope_backward with −1, the
/// same values bit for bit), for a caller that rotates a token's heads while it moves them, so
/// the row is rotated while in cache. Built on the calling thread for the positions
/// indexes[0..N) (d even, else Error); rotate() may then run on any thread until the next
/// RopeRotation or rope_* call of the building thread (which may regrow its table).
template <typename T>
class RopeRotation {
 public:
  RopeRotation(const int32_t* indexes, int64_t N, int64_t d, const double* inv_freq, double sign);
  /// Rotates heads [0, heads) of x, each d long and consecutive, at position pos.
  void rotate(T* x, int64_t heads, int32_t pos) const;

 private:
  int64_t half_;
  double sign_;
  const double* inv_freq_;
  const T* cos_ = nullptr;  // the building thread's table, [positions, d/2]; nullptr: none
  const T* sin_ = nullptr;
};

std::vector<double> rope_inv_freq(double base, int64_t d);
/// The same rotations with given inverse frequencies inv_freq[d/2] (angle(n, i) = indexes[n] ·
/// inv_freq[i]): the scaled RoPE variants (model/rope_scaling.h).
template <typename T>
void rope_forward(T* x, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                  int64_t row_stride, const double* inv_freq);
template <typename T>
void rope_backward(T* dx, const int32_t* indexes, int64_t N, int64_t heads, int64_t d,
                   int64_t row_stride, const double* inv_freq);

// ---- SwiGLU -------------------------------------------------------------------------------------
/// out[N,F] = silu(a) ⊙ b, a = w1·z, b = w3·z.
template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, int64_t count);
/// da, db (overwritten) from dout.
template <typename T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t count);

/// The same two kernels over a and b saved as bf16 bits (mixed precision keeps the gate and up
/// projections for backward in bf16, as torch.autocast saves the bf16 outputs of its linears);
/// the arithmetic is fp32 and the outputs are float. swiglu_backward_bf16 reads dout[i] before
/// it writes da[i] and db[i], so either may alias dout.
/// With out16, swiglu_forward_bf16 also writes round_to_bf16 of out there, a block at a time
/// while it is in cache (the bits a bf16 GEMM reading out would make); with out = nullptr it
/// writes only those bits (the same bits; Error if out16 is nullptr too).
void swiglu_forward_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t count,
                         uint16_t* out16 = nullptr);
/// a and b rounded to bf16 into a16 and b16 (round_to_bf16: keeping them for backward), then
/// swiglu_forward_bf16(out, a16, b16, count, out16): one pass, a block at a time, instead of a
/// rounding pass over each input and a pass over the rounded values.
void swiglu_forward_saving_bf16(float* out, const float* a, const float* b, uint16_t* a16,
                                uint16_t* b16, int64_t count, uint16_t* out16 = nullptr);
/// With da16 and db16, swiglu_backward_bf16 also writes round_to_bf16 of da and db there, a
/// block at a time after the block's reads (so da16 may be a and db16 may be b: their last
/// reader overwritten in place).
void swiglu_backward_bf16(float* da, float* db, const float* dout, const uint16_t* a,
                          const uint16_t* b, int64_t count, uint16_t* da16 = nullptr,
                          uint16_t* db16 = nullptr);

// ---- GeGLU (tanh GELU) --------------------------------------------------------------------------
/// out[i] = gelu_tanh(a[i]) · b[i], gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))): the FFN
/// down(gelu_tanh(gate(z)) ⊙ up(z)) of Gemma (Transformers' GemmaMLP / Gemma3MLP with
/// hidden_activation "gelu_pytorch_tanh", i.e. torch's gelu(approximate="tanh"); Shazeer 2020).
template <typename T>
void geglu_tanh_forward(T* out, const T* a, const T* b, int64_t count);
/// da, db (overwritten; either may be nullptr) from dout.
template <typename T>
void geglu_tanh_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t count);
/// The same over a and b saved as bf16 bits, as swiglu_forward_bf16,
/// swiglu_forward_saving_bf16 and swiglu_backward_bf16 (the same arguments, aliasing and
/// errors), with the tanh GELU for silu.
void geglu_tanh_forward_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t count,
                             uint16_t* out16 = nullptr);
void geglu_tanh_forward_saving_bf16(float* out, const float* a, const float* b, uint16_t* a16,
                                    uint16_t* b16, int64_t count, uint16_t* out16 = nullptr);
void geglu_tanh_backward_bf16(float* da, float* db, const float* dout, const uint16_t* a,
                              const uint16_t* b, int64_t count, uint16_t* da16 = nullptr,
                              uint16_t* db16 = nullptr);

// ---- Varlen causal attention (document-masked, flash-style) -----------------------------------
/// Shapes of one attention call. Query tokens are the rows of a packed sequence of N tokens,
/// split into segments by cu_seqlens[0..num_segments] (cu_seqlens[0] = 0, cu_seqlens[num_segments]
/// = N). Attention is causal inside each segment and never crosses one. GQA: query head h uses kv
/// head h / (num_heads / num_kv_heads). q is [N, num_heads, head_dim] with token stride q_stride;
/// k, v are [N_k, num_kv_heads, head_dim] with token strides kv_stride (so they may live inside a
/// packed qkv buffer); out is dense [N, num_heads, head_dim]. scale is usually 1/sqrt(head_dim).
/// N_k = N unless cu_seqlens_k is given.
struct AttentionShape {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t q_stride;
  int64_t kv_stride;
  const int32_t* cu_seqlens;
  int64_t num_segments;
  double scale;
  /// Key segments, when they differ from the query segments (context parallelism: a rank's query
  /// chunk of a document against every key of that document up to the chunk's end). nullptr =
  /// cu_seqlens (and num_kv_tokens is ignored). Otherwise k and v have N_k = num_kv_tokens rows
  /// split by cu_seqlens_k[0..num_segments] (starting at 0, non-decreasing, ending at
  /// num_kv_tokens), every segment has at least as many keys Lk as queries Lq, and its queries
  /// are aligned to the END of its keys (flash_attn_varlen_func's bottom-right causal rule):
  /// query r of the segment (0-based) sits at key position r + Lk − Lq and sees key c when
  /// c <= r + Lk − Lq. Segments with Lq = 0 are allowed (their keys get zero gradients).
  const int32_t* cu_seqlens_k = nullptr;
  int64_t num_kv_tokens = 0;
  /// Per segment (only with cu_seqlens_k), the key index at which the segment's first query sits:
  /// query r of segment i sees key c when c <= r + key_offsets[i] (and, with a window,
  /// c > r + key_offsets[i] − window). nullptr = bottom-right alignment, Lk − Lq. With offsets a
  /// segment may have more queries than keys, and a query that sees no key gets out = 0 and
  /// lse = −inf (and no gradient): ring attention's partial blocks, where a rank's query run
  /// sees the whole of an earlier key block (offset >= Lk − 1) or the part of it inside a window
  /// (offset = query start − key start in row positions).
  const int32_t* key_offsets = nullptr;
  /// Sliding window (Mistral): a query sees only the last `window` keys of its own document, key c
  /// visible to the query at position p (p = r + Lk − Lq, above) when p − window < c <= p
  /// (Hugging Face's rule). 0 = no window; negative is an error. Tiles entirely outside the
  /// window are skipped, so the work is O(Σ lᵢ · window · d), not O(Σ lᵢ² · d).
  int64_t window = 0;
};

/// Number of (query, key) pairs that attend in a causal document of `len` tokens under a sliding
/// window of `window` keys (0 = none): len(len+1)/2 without a window (or when len <= window),
/// else window(window+1)/2 + (len − window)·window. The attention term of FLOP and cost models.
constexpr int64_t visible_pairs(int64_t len, int64_t window = 0) {
  if (window <= 0 || len <= window) return len * (len + 1) / 2;
  return window * (window + 1) / 2 + (len - window) * window;
}

/// out[N,Hq,d] and the log-sum-exp of every score row lse[Hq, N] (saved for backward; natural log
/// of Σ exp(scale · q·k) over the visible keys). Tiled (64×64 blocks inside each segment, the q
/// heads of a kv group stacked as tile rows) with an online softmax; tiles with no visible pair
/// (above the diagonal, before the window, across segments) are never computed: work ≈
/// visible_pairs · 4d per head, extra memory O(N_k · Hkv · d) (packed Kᵀ and V tiles) plus a few tiles
/// per thread. Parallel over (segment, kv head, query block), largest first, dynamic. A query
/// that sees no key (impossible for a valid shape) gets out = 0 and lse = −inf. Throws
/// longtron::Error on an inconsistent shape, cu_seqlens, cu_seqlens_k or window. Float uses a
/// vectorised exp with ≈1e-7 relative error. Method: FlashAttention-2 (Dao 2023), varlen and
/// windows as flash_attn_varlen_func (window_size = (W − 1, 0)). In float under a kBFloat16
/// context `cc` with attention_bf16_runs(), q, k, v are rounded to bf16 and QKᵀ, PV run as
/// bf16 × bf16 → fp32 products (AMX tiles where the CPU has them and Linux grants them, else
/// vdpbf16ps; P rounded to bf16); softmax and lse stay fp32. The kernel rounds its tiles with
/// VCVTNEPS2BF16, which flushes subnormals to zero (core/bf16.h keeps them).
template <typename T>
void varlen_attention_forward(const ComputeContext& cc, T* out, T* lse, const T* q, const T* k,
                              const T* v, const AttentionShape& s);
/// varlen_attention_forward in float32 (ComputeContext::fp32()).
template <typename T>
void varlen_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const AttentionShape& s);
/// dq (same layout as q), dk, dv (layout of k, v: N_k rows) OVERWRITTEN, from dout[N,Hq,d]; uses
/// D = rowsum(dout ∘ out) and the saved lse (P is recomputed per tile, never stored). GQA
/// gradients of the shared kv heads are summed; keys no query sees get zero gradients. Only the
/// head columns of the strided buffers are written, so dq, dk, dv may be views into one packed
/// dqkv buffer. Parallel over (segment, kv head, key block): dK/dV accumulate privately (FA2
/// Algorithm 2 loop order), dQ tiles are added under a per-(query block, kv head) lock. Extra
/// memory O(N · Hq · d) (packed q, dO, dq). The bf16 path of the forward applies here too: q, k,
/// v, dout rounded to bf16, the five tile products bf16 × bf16 → fp32, P and dS rounded to bf16
/// as product inputs, D and every accumulation fp32.
template <typename T>
void varlen_attention_backward(const ComputeContext& cc, T* dq, T* dk, T* dv, const T* dout,
                               const T* q, const T* k, const T* v, const T* out, const T* lse,
                               const AttentionShape& s);
/// varlen_attention_backward in float32 (ComputeContext::fp32()).
template <typename T>
void varlen_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                               const T* v, const T* out, const T* lse, const AttentionShape& s);

/// Whether varlen attention in float runs its bf16 kernel under a kBFloat16 compute context: the
/// CPU has AVX512-BF16 (checked at run time, the build needs no -march flag) and oneDNN's
/// effective ISA includes it (so ONEDNN_MAX_CPU_ISA=avx512_core masks it for the GEMMs and
/// attention alike). Otherwise float attention stays fp32.
bool attention_bf16_native();

/// Whether float attention runs a bf16 kernel under a kBFloat16 compute type:
/// attention_bf16_native(), or else the kernel with its bf16 instructions emulated in AVX-512F
/// where bf16_emulated() (ops/precision.h; a test-only switch).
bool attention_bf16_runs();
/// Whether float attention under `cc` runs the bf16 kernel: cc computes in kBFloat16 and
/// attention_bf16_runs() holds (the choice every float attention entry point makes).
bool attention_bf16_runs(const ComputeContext& cc);

// ---- Cross-entropy with ignore_index -100 -----------------------------------------------------
/// Over logits[N,V] and labels[N] (-100 = ignored): returns Σ over valid rows of
/// (lse_n − logits[n, label_n]) in double, sets *count to the number of valid rows, and saves
/// lse[N] for backward. The loss is carried as (sum, count) until the step ends (Marian).
template <typename T>
double cross_entropy_forward(T* lse, int64_t* count, const T* logits, const int32_t* labels,
                             int64_t N, int64_t V);
/// dlogits[N,V] = scale · (softmax(logits) − onehot(label)) for valid rows, 0 for ignored rows
/// (overwritten). scale is d(loss)/d(loss_sum), e.g. 1 / total valid tokens of the step.
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* labels,
                            int64_t N, int64_t V, T scale);
/// cross_entropy_forward and then cross_entropy_backward, with the gradient rounded to bf16
/// (float_to_bf16 of cross_entropy_backward's values) into dlogits16[N,V]: each row's logits
/// are read once from memory and no fp32 gradient is stored. The same loss, lse and bits as the
/// two calls and round_to_bf16. Errors as cross_entropy_forward.
double cross_entropy_forward_backward_bf16(uint16_t* dlogits16, float* lse, int64_t* count,
                                           const float* logits, const int32_t* labels, int64_t N,
                                           int64_t V, float scale);

// ---- Logit soft-capping ----------------------------------------------------------------------
/// x[i] = cap · tanh(x[i] / cap) in place (cap > 0; Error otherwise): the final logit
/// soft-capping of Gemma 2 and Gemma 3 (Transformers' Gemma3ForCausalLM, final_logit_softcapping).
template <typename T>
void logit_softcap_forward(T* x, int64_t count, T cap);
/// dx[i] ·= 1 − (c[i] / cap)² in place, c the capped values logit_softcap_forward wrote (the
/// derivative of cap · tanh(x / cap) is 1 − tanh²(x / cap)). Error if cap <= 0.
template <typename T>
void logit_softcap_backward(T* dx, const T* capped, int64_t count, T cap);

}  // namespace longtron::ops
