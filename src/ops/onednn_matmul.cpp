// oneDNN matmul primitives, one per shape. Creating a primitive (choosing and JIT-compiling its
// kernel) costs far more than a training-size GEMM, so primitives are kept in a map keyed by
// everything the primitive descriptor depends on. A given key always runs the same kernel with the
// same blocking, so a GEMM of a given shape and thread count is deterministic.
// Where many blocks of rows share B (ops/gemm_packing.h), B is reordered once per call into the
// blocked layout the kernel reads (oneDNN's "any" weights format) and the primitive runs on that:
// its brgemm kernels otherwise copy B into that layout again for every block of rows they take.
// The kernel, its blocking and its order of summation are the same either way, so the bits are
// the same (checked on every GEMM shape of a training step, bf16 and fp32, and by the step's
// losses and checkpoints).
#include "ops/onednn_matmul.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/error.h"
#include "core/grow_buffer.h"
#include "ops/cpu_features.h"
#include "ops/gemm_packing.h"
#include "ops/ops.h"

namespace longtron::ops::detail {

namespace {
using dnnl::memory;

struct Key {
  MatmulInput input;
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  bool shared_b = false;  // B packed by the caller (SharedBf16B), whatever M
  bool out16 = false;     // C in bf16 (rounded by the kernel as it stores), not fp32
  /// Whether B may be packed (ops/gemm_packing.h): enough rows of op(A), or packed by the caller.
  bool pack_rows() const { return shared_b || M >= kGemmPackBRows; }
  bool operator<(const Key& o) const {
    return std::tie(input, M, N, K, ta, tb, alpha, beta, shared_b, out16) <
           std::tie(o.input, o.M, o.N, o.K, o.ta, o.tb, o.alpha, o.beta, o.shared_b, o.out16);
  }
};

memory::data_type input_type(const Key& k) {
  return k.input == MatmulInput::kF32 ? memory::data_type::f32 : memory::data_type::bf16;
}
// op(A) [M,K] and op(B) [K,N] as strided views of the row-major arrays the caller holds.
memory::desc a_desc(const Key& k) {
  const memory::dims strides = k.ta ? memory::dims{1, k.M} : memory::dims{k.K, 1};
  return memory::desc({k.M, k.K}, input_type(k), strides);
}
memory::desc b_desc(const Key& k) {
  const memory::dims strides = k.tb ? memory::dims{1, k.K} : memory::dims{k.N, 1};
  return memory::desc({k.K, k.N}, input_type(k), strides);
}
memory::desc c_desc(const Key& k) {
  return memory::desc({k.M, k.N}, k.out16 ? memory::data_type::bf16 : memory::data_type::f32,
                      memory::dims{k.N, 1});
}

/// A cached GEMM: the matmul, and with a packed B the reorder of the caller's B into its layout.
struct Gemm {
  dnnl::matmul matmul;
  bool packs_b = false;
  dnnl::reorder pack;         // when packs_b
  memory::desc packed;        // B's layout for `matmul` when packs_b
};

class MatmulCache {
 public:
  const dnnl::engine& engine() const { return engine_; }

  /// The primitives of `k` (reference-counted handles: valid even if the cache is cleared).
  Gemm get(const Key& k) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(k);
    if (it != cache_.end()) return it->second;
    // Shapes of a training run are few (layers × micro-batch shapes); the bound keeps callers with
    // ever-new shapes (generate, growing prompts) from holding primitives forever.
    if (cache_.size() >= kMaxCachedPrimitives) cache_.clear();
    return cache_.emplace(k, create(k)).first->second;
  }

 private:
  /// Primitives kept before the cache is emptied: far above the distinct shapes of a
  /// training run (every layer repeats the same few), small against memory (a
  /// primitive holds no weights).
  static constexpr size_t kMaxCachedPrimitives = 512;

  Gemm create(const Key& k) {
    dnnl::primitive_attr attr;
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(k.beta);
      attr.set_post_ops(po);
    }
    try {
      if (k.pack_rows()) {
        const memory::desc any({k.K, k.N}, input_type(k), memory::format_tag::any);
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc(k), any, c_desc(k)), attr,
                                              engine_);
        const memory::desc packed = pd.weights_desc();
        if (static_cast<int64_t>(packed.get_size()) <= kGemmPackedBMaxBytes)
          return Gemm{dnnl::matmul(pd), true,
                      dnnl::reorder(dnnl::reorder::primitive_desc(engine_, b_desc(k), engine_,
                                                                  packed)),
                      packed};
      }
      return Gemm{dnnl::matmul(dnnl::matmul::primitive_desc(
                      dnnl::matmul::desc(a_desc(k), b_desc(k), c_desc(k)), attr, engine_)),
                  false, {}, {}};
    } catch (const dnnl::error& e) {
      fail("{} GEMM M={} N={} K={}: oneDNN has no {} matmul on this CPU (ISA {}; bf16 needs at "
           "least avx512_core): {}", k.input == MatmulInput::kF32 ? "fp32" : "bf16", k.M, k.N, k.K,
           k.input == MatmulInput::kF32 ? "fp32" : "bf16", gemm_backend().isa, e.what());
    }
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::map<Key, Gemm> cache_;
  std::mutex mutex_;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache = [] {
    detail::limit_onednn_isa();  // before oneDNN's first primitive fixes its instruction set
    return MatmulCache();
  }();
  return cache;
}
}  // namespace

namespace {
// Executing a primitive is thread-safe; a stream is not shared between threads.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(matmul_cache().engine());
  return stream;
}

// B packed by g's reorder into `buffer` (grown without a fill: the reorder writes all of it).
memory pack_b(const Gemm& g, const Key& k, const void* B, GrowBuffer<PackedLine>& buffer) {
  const dnnl::engine& e = matmul_cache().engine();
  const auto lines =
      static_cast<int64_t>((g.packed.get_size() + sizeof(PackedLine) - 1) / sizeof(PackedLine));
  memory bp(g.packed, e, buffer.get(lines));
  memory b(b_desc(k), e, const_cast<void*>(B));
  g.pack.execute(thread_stream(), b, bp);
  return bp;
}

void run(const Gemm& g, const Key& k, const void* A, const memory& b, void* C) {
  const dnnl::engine& e = matmul_cache().engine();
  g.matmul.execute(thread_stream(), {{DNNL_ARG_SRC, memory(a_desc(k), e, const_cast<void*>(A))},
                                     {DNNL_ARG_WEIGHTS, b},
                                     {DNNL_ARG_DST, memory(c_desc(k), e, C)}});
  thread_stream().wait();
}

void run_key(const Key& k, const void* A, const void* B, void* C) {
  const Gemm g = matmul_cache().get(k);
  thread_local GrowBuffer<PackedLine> packed;  // this thread's packed B
  run(g, k, A,
      g.packs_b ? pack_b(g, k, B, packed)
                : memory(b_desc(k), matmul_cache().engine(), const_cast<void*>(B)),
      C);
}
}  // namespace

void onednn_matmul(MatmulInput input, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const void* A, const void* B, float beta, float* C) {
  run_key(Key{input, M, N, K, trans_a, trans_b, alpha, beta}, A, B, C);
}

void onednn_matmul_bf16_out(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const uint16_t* A, const uint16_t* B, uint16_t* C) {
  Key k{MatmulInput::kBF16, M, N, K, trans_a, trans_b, 1.0f, 0.0f};
  k.out16 = true;
  run_key(k, A, B, C);
}

}  // namespace longtron::ops::detail

namespace longtron::ops {

SharedBf16B::SharedBf16B(GrowBuffer<PackedLine>& buffer, bool ta, bool tb, int64_t M, int64_t N,
                         int64_t K, float alpha, float beta, const uint16_t* B)
    : ta_(ta), tb_(tb), M_(M), N_(N), K_(K), alpha_(alpha), beta_(beta) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  using namespace detail;
  const Key k{MatmulInput::kBF16, M, N, K, ta, tb, alpha, beta, true};
  const Gemm g = matmul_cache().get(k);
  if (!g.packs_b) return;
  const memory bp = pack_b(g, k, B, buffer);
  thread_stream().wait();
  packed_ = static_cast<const PackedLine*>(bp.get_data_handle());
}

void SharedBf16B::gemm(int64_t M, const uint16_t* A, const uint16_t* B, float* C) const {
  if (packed_ == nullptr || M != M_) return gemm_bf16(ta_, tb_, M, N_, K_, alpha_, A, B, beta_, C);
  using namespace detail;
  const Key k{MatmulInput::kBF16, M, N_, K_, ta_, tb_, alpha_, beta_, true};
  const Gemm g = matmul_cache().get(k);
  run(g, k, A, memory(g.packed, matmul_cache().engine(), const_cast<PackedLine*>(packed_)), C);
}

void gemm_bf16_out16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const uint16_t* A, const uint16_t* B, uint16_t* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // a matmul with K = 0 is not defined in oneDNN: C = +0
    std::fill_n(C, M * N, uint16_t{0});
    return;
  }
  detail::onednn_matmul_bf16_out(trans_a, trans_b, M, N, K, A, B, C);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, const uint16_t* B, float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // a matmul with K = 0 is not defined in oneDNN: C = beta·C
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
    return;
  }
  detail::onednn_matmul(detail::MatmulInput::kBF16, trans_a, trans_b, M, N, K, alpha, A, B, beta,
                        C);
}

}  // namespace longtron::ops
