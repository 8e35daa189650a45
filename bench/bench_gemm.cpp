// GEMM rates on the shapes of a configs/small.toml training step (P = 2048 tokens, hidden 384,
// qkv 640, FFN 1024, vocab 8192; forward x·Wᵀ, backward dy·W and dyᵀ·x with beta = 1) plus 2048³:
//   openblas    cblas_sgemm (the foil: the library the engine used before oneDNN)
//   dnnl_sgemm  oneDNN's BLAS-like sgemm (the alternative measured when choosing the fp32 path)
//   fp32        ops::gemm<float> = oneDNN matmul primitive, one per shape (the engine's fp32 path)
//   bf16        ops::gemm_bf16 = oneDNN matmul bf16 × bf16 → fp32 on operands already in bf16
//   scope       ops::gemm<float> under a bf16 compute context: rounds both fp32 operands to bf16,
//               then the bf16 matmul (model.dtype = "bfloat16"'s path; the gap to bf16 is the
//               conversion)
// Each shape's variants run interleaved for several rounds; the best round of each is kept.
// Usage: OMP_NUM_THREADS=2 bench_gemm [rounds]   (threads: OMP_NUM_THREADS, else all)
#include <cblas.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.h>
#include <random>
#include <vector>

#include "core/safetensors.h"
#include "ops/compute_context.h"
#include "ops/ops.h"
#include "ops/threads.h"

using namespace longtron;

namespace {
struct Shape {
  int64_t M, N, K;
  bool ta, tb;
  float beta;
  const char* what;
};

template <typename F>
double seconds_per_call(F&& f) {
  f();  // warm-up (JIT, primitive creation, caches)
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < 0.2);
  return elapsed / calls;
}
}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  const int threads = set_num_threads(env != nullptr ? std::atoi(env) : 0);
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const ops::ComputeContext bf16_context(ops::ComputeType::kBFloat16);
  const std::vector<Shape> shapes = {
      {2048, 640, 384, false, true, 0, "wqkv fwd"},   {2048, 384, 640, false, false, 0, "wqkv dx"},
      {640, 384, 2048, true, false, 1, "wqkv dW"},    {2048, 1024, 384, false, true, 0, "w1 fwd"},
      {2048, 384, 1024, false, false, 0, "w2 fwd"},   {1024, 384, 2048, true, false, 1, "w1 dW"},
      {384, 1024, 2048, true, false, 1, "w2 dW"},     {2048, 8192, 384, false, true, 0, "head fwd"},
      {2048, 384, 8192, false, false, 0, "head dx"},  {8192, 384, 2048, true, false, 1, "head dW"},
      {2048, 2048, 2048, false, false, 0, "2048^3"}};
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  const size_t size = 8192 * 2048;
  std::vector<float> A(size), B(size), C(size);
  for (auto& x : A) x = normal(gen);
  for (auto& x : B) x = normal(gen);
  std::vector<uint16_t> Ab(size), Bb(size);
  for (size_t i = 0; i < size; ++i)
    Ab[i] = safetensors::float_to_bf16(A[i]), Bb[i] = safetensors::float_to_bf16(B[i]);
  const ops::GemmBackend be = ops::gemm_backend();
  // oneDNN has a bf16 matmul from AVX-512 on (converted to fp32 without AVX512-BF16); on an AVX2
  // CPU (or under LONGTRON_CPU_FEATURES_MASK=avx512f) the bf16 columns are marked n/a.
  const bool bf16 = be.isa.rfind("avx512", 0) == 0;
  fmt::print("{} threads; {} (ISA {});{}{}\n", threads, be.library, be.isa, OPENBLAS_VERSION,
             bf16 ? "" : "; no bf16 matmul on this ISA: bf16 and scope columns n/a");
  const auto rate = [](double flops, double seconds) {
    return std::isfinite(seconds) ? fmt::format("{:.1f}", flops / seconds * 1e-9) : std::string("n/a");
  };
  const auto ratio = [](double a, double b) {
    return std::isfinite(a) && std::isfinite(b) ? fmt::format("{:.2f}x", a / b) : std::string("n/a");
  };
  fmt::print("{:>10} {:>17} | GFLOP/s: {:>8} {:>10} {:>8} {:>8} {:>8} | fp32/openblas bf16/fp32 "
             "scope/fp32\n", "", "M x N x K", "openblas", "dnnl_sgemm", "fp32", "bf16", "scope");
  double total_flops = 0, t_sum[5] = {0, 0, 0, 0, 0};
  for (size_t id = 0; id < shapes.size(); ++id) {
    const Shape& s = shapes[id];
    const double flops = 2.0 * s.M * s.N * s.K;
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < rounds; ++r) {
      best[0] = std::min(best[0], seconds_per_call([&] {
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                    s.M, s.N, s.K, 1.0f, A.data(), s.ta ? s.M : s.K, B.data(), s.tb ? s.K : s.N, s.beta,
                    C.data(), s.N);
      }));
      best[1] = std::min(best[1], seconds_per_call([&] {
        dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, A.data(), s.ta ? s.M : s.K,
                   B.data(), s.tb ? s.K : s.N, s.beta, C.data(), s.N);
      }));
      best[2] = std::min(best[2], seconds_per_call([&] {
        ops::gemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), s.beta, C.data());
      }));
      if (!bf16) continue;
      best[3] = std::min(best[3], seconds_per_call([&] {
        ops::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.0f, Ab.data(), Bb.data(), s.beta, C.data());
      }));
      best[4] = std::min(best[4], seconds_per_call([&] {
        ops::gemm<float>(bf16_context, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), s.beta,
                         C.data());
      }));
    }
    if (!bf16) best[3] = best[4] = std::numeric_limits<double>::infinity();
    total_flops += flops;
    for (int v = 0; v < 5; ++v) t_sum[v] += best[v];
    fmt::print("{:>10} {:>5}x{:>5}x{:>5} | GFLOP/s: {:>8} {:>10} {:>8} {:>8} {:>8} | "
               "{:>13} {:>9} {:>10}\n", s.what, s.M, s.N, s.K, rate(flops, best[0]),
               rate(flops, best[1]), rate(flops, best[2]), rate(flops, best[3]),
               rate(flops, best[4]), ratio(best[0], best[2]), ratio(best[2], best[3]),
               ratio(best[2], best[4]));
  }
  fmt::print("{:>28} | GFLOP/s: {:>8} {:>10} {:>8} {:>8} {:>8} | {:>13} {:>9} {:>10}  (all "
             "shapes)\n", "total", rate(total_flops, t_sum[0]), rate(total_flops, t_sum[1]),
             rate(total_flops, t_sum[2]), rate(total_flops, t_sum[3]), rate(total_flops, t_sum[4]),
             ratio(t_sum[0], t_sum[2]), ratio(t_sum[2], t_sum[3]), ratio(t_sum[2], t_sum[4]));
  return 0;
}
