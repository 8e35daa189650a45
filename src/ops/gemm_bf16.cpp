// bf16 × bf16 → fp32 GEMM through oneDNN's matmul primitive, one primitive per shape.
// Creating a matmul primitive (choosing and JIT-compiling its kernel) costs far more than a
// training-size GEMM, so primitives are kept in a map keyed by everything the primitive
// descriptor depends on; the engine and stream are created once.
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {
using dnnl::memory;

struct Key {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  bool operator<(const Key& o) const {
    return std::tie(M, N, K, ta, tb, alpha, beta) <
           std::tie(o.M, o.N, o.K, o.ta, o.tb, o.alpha, o.beta);
  }
};

// op(A) [M,K] and op(B) [K,N] as strided views of the row-major arrays the caller holds.
memory::desc a_desc(const Key& k) {
  return memory::desc({k.M, k.K}, memory::data_type::bf16,
                      k.ta ? memory::dims{1, k.M} : memory::dims{k.K, 1});
}
memory::desc b_desc(const Key& k) {
  return memory::desc({k.K, k.N}, memory::data_type::bf16,
                      k.tb ? memory::dims{1, k.K} : memory::dims{k.N, 1});
}
memory::desc c_desc(const Key& k) {
  return memory::desc({k.M, k.N}, memory::data_type::f32, memory::dims{k.N, 1});
}

class MatmulCache {
 public:
  MatmulCache() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  void run(const Key& k, const uint16_t* A, const uint16_t* B, float* C) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(k);
    if (it == cache_.end()) {
      // Shapes of a run are few (layers × micro-batch sizes); a bound keeps odd callers (generate
      // with growing prompts) from holding primitives forever.
      if (cache_.size() >= kCapacity) cache_.clear();
      it = cache_.emplace(k, create(k)).first;
    }
    memory a(a_desc(k), engine_, const_cast<uint16_t*>(A));
    memory b(b_desc(k), engine_, const_cast<uint16_t*>(B));
    memory c(c_desc(k), engine_, C);
    it->second.execute(stream_, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream_.wait();
  }

 private:
  static constexpr size_t kCapacity = 512;

  dnnl::matmul create(const Key& k) {
    dnnl::primitive_attr attr;
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(k.beta);
      attr.set_post_ops(po);
    }
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc(k), b_desc(k), c_desc(k)), attr,
                                      engine_);
      return dnnl::matmul(pd);
    } catch (const dnnl::error& e) {
      fail("bf16 GEMM M={} N={} K={}: oneDNN has no bf16 matmul on this CPU (ISA {}; bf16 needs "
           "at least avx512_core): {}", k.M, k.N, k.K, gemm_backend().isa, e.what());
    }
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Key, dnnl::matmul> cache_;
  std::mutex mutex_;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, const uint16_t* B, float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
    return;
  }
  matmul_cache().run(Key{M, N, K, trans_a, trans_b, alpha, beta}, A, B, C);
}

}  // namespace longtron::ops
