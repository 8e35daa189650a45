// Kernels of the InternLM2 model with explicit forward and backward (no autograd), after llm.c.
// Every kernel is a template over the scalar type T (float for training, double for the
// finite-difference tests); explicit instantiations for float and double live in the .cpp files.
//
// Conventions (DESIGN.md): arguments are (outputs, saved state, inputs, weights, sizes); all
// tensors are dense row-major; N = tokens of the (local) row. Backward functions OVERWRITE input
// gradients (dx, dq, ...) and ACCUMULATE (+=) parameter gradients (dW, dweight, dtable); any
// gradient pointer may be nullptr to skip it. No kernel communicates.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace longtron::ops {

// ---- GEMM -------------------------------------------------------------------------------------
/// C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [M,K], op(B) is [K,N].
/// float → oneDNN's matmul primitive (one cached per shape, transposes, alpha and beta; for a given
/// shape and thread count the result is deterministic); double → OpenBLAS's cblas_dgemm (oneDNN has
/// no double GEMM; double serves the finite-difference tests). Uses the OpenMP threads of
/// set_num_threads.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C);

/// The same contract with bf16 inputs (raw bfloat16 bits, as core/safetensors.h's float_to_bf16
/// makes them) and an fp32 C accumulated in fp32: oneDNN's matmul primitive, one primitive cached
/// per (shape, transposes, alpha, beta). Throws longtron::Error when oneDNN has no bf16 matmul for
/// this CPU (it needs avx512_core; native bf16 dot products need avx512_core_bf16).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, const uint16_t* B, float beta, float* C);

/// The GEMM library and the instruction set its kernels dispatch to on this CPU.
struct GemmBackend {
  std::string library;       ///< e.g. "oneDNN 2.6.3"
  std::string isa;           ///< oneDNN's effective ISA, e.g. "avx512_core_bf16"
  bool native_bf16 = false;  ///< the ISA has bf16 dot-product instructions (AVX512-BF16)
};
/// Queries oneDNN (cheap; ONEDNN_MAX_CPU_ISA in the environment caps the ISA it reports and uses).
GemmBackend gemm_backend();

// ---- Linear (HF layout W[out, in]) --------------------------------------------------------------
/// y[N,out] = x[N,in] · W[out,in]ᵀ (+ bias[out] if bias != nullptr).
template <typename T>
void linear_forward(T* y, const T* x, const T* W, const T* bias, int64_t N, int64_t in,
                    int64_t out);
/// dx[N,in] = dy·W (overwritten); dW[out,in] += dyᵀ·x; dbias[out] += Σ_n dy.
template <typename T>
void linear_backward(T* dx, T* dW, T* dbias, const T* dy, const T* x, const T* W, int64_t N,
                     int64_t in, int64_t out);

// ---- Embedding ----------------------------------------------------------------------------------
/// out[N,H] = table[ids[n], :]. ids must be in [0, V); the caller maps negative ids to abs(id).
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t N, int64_t H);
/// dtable[ids[n], :] += dout[n, :].
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t H);

// ---- RMSNorm ------------------------------------------------------------------------------------
/// out[N,H] = x / sqrt(mean(x²) + eps) ⊙ weight[H]; rstd[N] saved for backward.
template <typename T>
void rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t H, T eps);
/// dx[N,H] (overwritten), dweight[H] (+=).
template <typename T>
void rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight,
                       const T* rstd, int64_t N, int64_t H);

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

// ---- Varlen causal attention (document-masked, flash-style) -----------------------------------
/// Shapes of one attention call. Tokens are the rows of a packed sequence of N tokens, split into
/// segments by cu_seqlens[0..num_segments] (cu_seqlens[0] = 0, cu_seqlens[num_segments] = N).
/// Attention is causal inside each segment and never crosses one. GQA: query head h uses kv head
/// h / (num_heads / num_kv_heads). q is [N, num_heads, head_dim] with token stride q_stride; k, v
/// are [N, num_kv_heads, head_dim] with token strides kv_stride (so they may live inside a packed
/// qkv buffer); out is dense [N, num_heads, head_dim]. scale is usually 1/sqrt(head_dim).
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
  /// cu_seqlens. Otherwise keys are a separate [num_kv_tokens] buffer split by
  /// cu_seqlens_k[0..num_segments], and segment i's queries are aligned to the END of its keys
  /// (flash_attn_varlen_func's bottom-right causal rule): query r of a segment with Lq queries and
  /// Lk keys sees key c when c <= r + Lk − Lq.
  const int32_t* cu_seqlens_k = nullptr;
  int64_t num_kv_tokens = 0;
  /// Sliding window (Mistral): a query sees only the last `window` keys of its own document, key c
  /// visible to query r when r − window < c <= r (Hugging Face's rule). 0 = no window.
  int64_t window = 0;
};
/// out[N,Hq,d] and the log-sum-exp of every score row lse[Hq, N] (saved for backward; natural log
/// of Σ exp(scale · q·k)). Tiled (64×64 blocks inside each segment, the q heads of a kv group
/// stacked as tile rows) with an online softmax; blocks above the diagonal and across segments are
/// never computed: work ≈ Σ lᵢ²/2 · d per head, extra memory O(N · Hkv · d) (packed Kᵀ tiles) plus
/// a few tiles per thread. Parallel over (segment, kv head, query block), largest first, dynamic.
/// Throws longtron::Error on an inconsistent shape or cu_seqlens. Float uses a vectorised exp with
/// ≈1e-7 relative error. Method: FlashAttention-2 (Dao 2023), varlen as flash_attn_varlen_func.
template <typename T>
void varlen_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const AttentionShape& s);
/// dq (same layout as q), dk, dv (layout of k, v) OVERWRITTEN, from dout[N,Hq,d]; uses
/// D = rowsum(dout ∘ out) and the saved lse (P is recomputed per tile, never stored). GQA
/// gradients of the shared kv heads are summed. Only the head columns of the strided buffers are
/// written, so dq, dk, dv may be views into one packed dqkv buffer. Parallel over (segment, kv
/// head, key block): dK/dV accumulate privately (FA2 Algorithm 2 loop order), dQ tiles are added
/// under a per-(query block, kv head) lock. Extra memory O(N · Hq · d) (packed q, dO, dq).
template <typename T>
void varlen_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                               const T* v, const T* out, const T* lse, const AttentionShape& s);

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

// ---- AdamW --------------------------------------------------------------------------------------
/// One AdamW update (Loshchilov & Hutter 2019, PyTorch's formulation) of n parameters with
/// decoupled weight decay; step is 1-based (bias correction). m, v updated in place.
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step);

}  // namespace longtron::ops
