// Varlen attention speed (docs/benchmarks.md): forward+backward of the tiled kernel on an
// 8192-token row of documents with exponential lengths (mean 512, seeded), 8 query heads, 2 kv
// heads, head_dim 64 and 128, against the sgemm rate of this machine measured in the same run,
// and against a dense causal-masked attention over the whole row (sgemm on [P, P] scores).
//
// Useful FLOPs (docs/model.md): forward = 4 · d · Hq · Σ lᵢ²/2 = 2 · d · Hq · Σ lᵢ² (QKᵀ and PV, each
// 2·d multiply-adds per visible pair, causal = half the square); forward+backward = 3 × forward.
// The dense baseline is credited with the same useful FLOPs (the masked half and the
// cross-document blocks are wasted work), so its GFLOP/s is comparable.
//
// Also: fwd+bwd on one 16384-token document (the long-row case, fp32 and bf16); backward alone against forward alone (target: backward rate >= 0.9 × forward), the bf16
// kernel where the CPU has AVX512-BF16 against the bf16 GEMM rate (oneDNN bf16 × bf16 → fp32 on
// operands already in bf16) measured in the same run, and a sliding window on one long document.
// Then the same targets as paired ratios (reference and kernel alternated in rounds, so the host's
// drift between benchmarks does not enter the ratio; --paired_rounds=N, default 5, 0 skips them)
// and the rate on rows of equal documents of 256, 1024 and 4096 tokens.
//
// Threads: OMP_NUM_THREADS if set (OpenMP and OpenBLAS alike), else all hardware threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "ops/compute_context.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"

namespace ops = longtron::ops;

namespace {

constexpr int64_t kTokens = 8192, kHeads = 8, kKvHeads = 2;
std::map<std::string, double> g_gflops;  // filled by each benchmark, summarised by main
std::map<std::string, double> g_cpu_gflops;  // GFLOP per CPU-second of the whole process
std::string g_paired_filter;  // --paired_filter: the paired lines to run (all when empty)

// CPU seconds of all threads of this process: on a shared machine, FLOP per CPU-second compares
// kernels fairly even when other jobs steal cores (wall-clock rates are printed too).
double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Runs `body` for every iteration of `state`, sets the wall-clock GFLOP/s counter and records
// the per-CPU-second rate under the benchmark's name. With `warm_up`, one untimed call first: the
// kernels' per-thread workspaces grow on their first call (page faults, zero fill), as they do once
// per training run, and a backward of several seconds would otherwise be timed on that call alone.
template <typename Body>
void timed(benchmark::State& state, const std::string& name, double flops, Body&& body,
           bool warm_up = true) {
  if (warm_up) body();
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) body();
  const double cpu = process_cpu_seconds() - cpu0;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/cpu-s"] = flops * 1e-9 * double(state.iterations()) / cpu;
  g_cpu_gflops[name] = flops * 1e-9 * double(state.iterations()) / cpu;
}

std::vector<int32_t> exponential_cu_seqlens(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> dist(1.0 / 512.0);
  std::vector<int32_t> cu = {0};
  while (cu.back() < kTokens) {
    const int64_t len = std::max<int64_t>(1, std::llround(dist(rng)));
    cu.push_back(static_cast<int32_t>(std::min<int64_t>(kTokens, cu.back() + len)));
  }
  return cu;
}

double sum_squares(const std::vector<int32_t>& cu) {
  double s = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) s += double(cu[i + 1] - cu[i]) * (cu[i + 1] - cu[i]);
  return s;
}

// The row of kTokens tokens cut into documents of `length` tokens.
std::vector<int32_t> equal_cu_seqlens(int64_t length) {
  std::vector<int32_t> cu = {0};
  while (cu.back() < kTokens)
    cu.push_back(static_cast<int32_t>(std::min<int64_t>(kTokens, cu.back() + length)));
  return cu;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto A = random_floats(n * n, 1), B = random_floats(n * n, 2);
  std::vector<float> C(n * n);
  timed(state, "sgemm", 2.0 * n * n * n, [&] {
    ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
    benchmark::DoNotOptimize(C.data());
  });
}

// The bf16 GEMM rate the bf16 attention is compared with: 2048³ on operands rounded beforehand.
void BM_GemmBf16(benchmark::State& state) {
  if (!ops::attention_bf16_native()) return state.SkipWithError("no AVX512-BF16 on this CPU");
  const int64_t n = state.range(0);
  const auto A = random_floats(n * n, 1), B = random_floats(n * n, 2);
  std::vector<uint16_t> Ab(A.size()), Bb(B.size());
  for (size_t i = 0; i < A.size(); ++i)
    Ab[i] = longtron::safetensors::float_to_bf16(A[i]),
    Bb[i] = longtron::safetensors::float_to_bf16(B[i]);
  std::vector<float> C(n * n);
  timed(state, "bf16gemm", 2.0 * n * n * n, [&] {
    ops::gemm_bf16(false, false, n, n, n, 1.0f, Ab.data(), Bb.data(), 0.0f, C.data());
    benchmark::DoNotOptimize(C.data());
  });
}

// Packed qkv row as the model lays it out: [N, (Hq + 2·Hkv)·d], q then k then v.
struct AttentionData {
  int64_t d;
  std::vector<int32_t> cu;
  std::vector<float> qkv, dqkv, out, lse, dout;
  ops::AttentionShape shape;
  ops::ComputeContext cc;  // float32 unless a benchmark sets bf16
  // The 8192-token row of exponential documents, or (one_document > 0) one document of that many
  // tokens.
  explicit AttentionData(int64_t head_dim, int64_t one_document = 0)
      : AttentionData(head_dim,
                      one_document > 0
                          ? std::vector<int32_t>{0, static_cast<int32_t>(one_document)}
                          : exponential_cu_seqlens(2024)) {}
  // Any documents: cu_seqlens of the row.
  AttentionData(int64_t head_dim, std::vector<int32_t> cu_seqlens)
      : d(head_dim),
        cu(std::move(cu_seqlens)),
        qkv(random_floats(cu.back() * (kHeads + 2 * kKvHeads) * head_dim, 3)),
        dqkv(qkv.size()), out(cu.back() * kHeads * head_dim), lse(kHeads * cu.back()),
        dout(random_floats(cu.back() * kHeads * head_dim, 4)) {
    const int64_t width = (kHeads + 2 * kKvHeads) * d;
    shape = {cu.back(), kHeads, kKvHeads, d, width, width, cu.data(),
             static_cast<int64_t>(cu.size()) - 1, 1.0 / std::sqrt(double(d))};
  }
  const float* q() const { return qkv.data(); }
  const float* k() const { return qkv.data() + kHeads * d; }
  const float* v() const { return qkv.data() + (kHeads + kKvHeads) * d; }
  void forward() {
    ops::varlen_attention_forward<float>(cc, out.data(), lse.data(), q(), k(), v(), shape);
  }
  void backward() {
    float* dq = dqkv.data();
    ops::varlen_attention_backward<float>(cc, dq, dq + kHeads * d, dq + (kHeads + kKvHeads) * d,
                                          dout.data(), q(), k(), v(), out.data(), lse.data(),
                                          shape);
  }
  double forward_flops() const { return 2.0 * d * kHeads * sum_squares(cu); }
};

void BM_VarlenAttentionForward(benchmark::State& state) {
  AttentionData a(state.range(0));
  timed(state, "fwd" + std::to_string(a.d), a.forward_flops(), [&] { a.forward(); });
  state.counters["segments"] = double(a.cu.size() - 1);
}

// Backward alone (out and lse computed once, outside the timing), credited with 2 × the forward's
// useful FLOPs as in fwd+bwd = 3 × forward (dV, dP, dQ, dK; the recomputed S is not counted).
void BM_VarlenAttentionBackward(benchmark::State& state) {
  AttentionData a(state.range(0));
  a.forward();
  timed(state, "bwd" + std::to_string(a.d), 2 * a.forward_flops(), [&] { a.backward(); });
}

void BM_VarlenAttentionForwardBackward(benchmark::State& state) {
  AttentionData a(state.range(0));
  timed(state, "fwdbwd" + std::to_string(a.d), 3 * a.forward_flops(), [&] {
    a.forward();
    a.backward();
  });
}

// The same kernels in bf16 (AVX512-BF16 tile products, fp32 softmax and accumulators), when this
// CPU has them; credited with the same useful FLOPs.
void BM_VarlenAttentionBf16Forward(benchmark::State& state) {
  if (!ops::attention_bf16_native()) return state.SkipWithError("no AVX512-BF16 on this CPU");
  AttentionData a(state.range(0));
  a.cc.set_type(ops::ComputeType::kBFloat16);
  timed(state, "bf16fwd" + std::to_string(a.d), a.forward_flops(), [&] { a.forward(); });
}

void BM_VarlenAttentionBf16Backward(benchmark::State& state) {
  if (!ops::attention_bf16_native()) return state.SkipWithError("no AVX512-BF16 on this CPU");
  AttentionData a(state.range(0));
  a.cc.set_type(ops::ComputeType::kBFloat16);
  a.forward();
  timed(state, "bf16bwd" + std::to_string(a.d), 2 * a.forward_flops(), [&] { a.backward(); });
}

void BM_VarlenAttentionBf16ForwardBackward(benchmark::State& state) {
  if (!ops::attention_bf16_native()) return state.SkipWithError("no AVX512-BF16 on this CPU");
  AttentionData a(state.range(0));
  a.cc.set_type(ops::ComputeType::kBFloat16);
  timed(state, "bf16fwdbwd" + std::to_string(a.d), 3 * a.forward_flops(), [&] {
    a.forward();
    a.backward();
  });
}

// Sliding window (Mistral): fwd+bwd over ONE 4096-token document, head_dim 128, window
// state.range(0) (0 = none). Credited with the useful FLOPs of the visible pairs only, so equal
// GFLOP/s at every window means the time scales with visible_pairs ≈ l·W, not l².
void BM_VarlenAttentionWindow(benchmark::State& state) {
  constexpr int64_t kLength = 4096;
  AttentionData a(128);
  a.cu = {0, static_cast<int32_t>(kLength)};
  a.shape.num_tokens = kLength;
  a.shape.cu_seqlens = a.cu.data();
  a.shape.num_segments = 1;
  a.shape.window = state.range(0);
  const double flops = 3 * 4.0 * a.d * kHeads * double(ops::visible_pairs(kLength, state.range(0)));
  timed(state, "window" + std::to_string(state.range(0)), flops, [&] {
    a.forward();
    a.backward();
  });
}

// One 16384-token document (the long-row case): fwd+bwd in fp32 (state.range(0) = 0) or bf16 (1)
// at head_dim state.range(1), credited with the same useful FLOPs as the varlen row (3 × forward).
constexpr int64_t kLongDocument = 16384;
void BM_OneDocumentForwardBackward(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  if (bf16 && !ops::attention_bf16_native())
    return state.SkipWithError("no AVX512-BF16 on this CPU");
  AttentionData a(state.range(1), kLongDocument);
  a.cc.set_type(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32);
  timed(state, std::string(bf16 ? "bf16" : "") + "doc" + std::to_string(a.d), 3 * a.forward_flops(),
        [&] {
          a.forward();
          a.backward();
        });
}

// Dense baseline: per query head, S = QKᵀ over the whole row [P, P] (sgemm), causal mask (not the
// document mask: the baseline is what a kernel without varlen support would compute), softmax,
// O = PV; backward dP = dO Vᵀ, dV = Pᵀ dO, dS = P ∘ (dP − D), dQ = dS K, dK = dSᵀ Q.
void dense_causal_attention(AttentionData& a, std::vector<float>& S, std::vector<float>& dP) {
  const int64_t P = kTokens, d = a.d, G = kHeads / kKvHeads;
  std::vector<float> Q(P * d), K(P * d), V(P * d), O(P * d), dO(P * d), dQ(P * d), dK(P * d),
      dV(P * d), D(P);
  const float scale = 1.0f / std::sqrt(float(d));
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t n = 0; n < P; ++n) {
      for (int64_t x = 0; x < d; ++x) {
        Q[n * d + x] = a.q()[n * a.shape.q_stride + h * d + x];
        K[n * d + x] = a.k()[n * a.shape.kv_stride + (h / G) * d + x];
        V[n * d + x] = a.v()[n * a.shape.kv_stride + (h / G) * d + x];
        dO[n * d + x] = a.dout[(n * kHeads + h) * d + x];
      }
    }
    ops::gemm<float>(false, true, P, P, d, scale, Q.data(), K.data(), 0.0f, S.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < P; ++i) {
      float* row = &S[i * P];
      float mx = -std::numeric_limits<float>::infinity(), sum = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
      for (int64_t j = 0; j < P; ++j) {
        row[j] = j <= i ? std::exp(row[j] - mx) : 0.0f;
        sum += row[j];
      }
      for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
    }
    ops::gemm<float>(false, false, P, d, P, 1.0f, S.data(), V.data(), 0.0f, O.data());
    for (int64_t i = 0; i < P; ++i) {
      float s = 0;
      for (int64_t x = 0; x < d; ++x) s += O[i * d + x] * dO[i * d + x];
      D[i] = s;
    }
    ops::gemm<float>(false, true, P, P, d, 1.0f, dO.data(), V.data(), 0.0f, dP.data());
    ops::gemm<float>(true, false, P, d, P, 1.0f, S.data(), dO.data(), 0.0f, dV.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < P; ++i)
      for (int64_t j = 0; j < P; ++j) dP[i * P + j] = S[i * P + j] * (dP[i * P + j] - D[i]) * scale;
    ops::gemm<float>(false, false, P, d, P, 1.0f, dP.data(), K.data(), 0.0f, dQ.data());
    ops::gemm<float>(true, false, P, d, P, 1.0f, dP.data(), Q.data(), 0.0f, dK.data());
    benchmark::DoNotOptimize(dQ.data());
    benchmark::DoNotOptimize(dK.data());
  }
}

void BM_DenseCausalAttentionForwardBackward(benchmark::State& state) {
  AttentionData a(state.range(0));
  std::vector<float> S(kTokens * kTokens), dP(kTokens * kTokens);
  timed(state, "dense" + std::to_string(a.d), 3 * a.forward_flops(),
        [&] { dense_causal_attention(a, S, dP); }, false);
}

}  // namespace

// Paired ratios. This host's speed drifts by ±15% within minutes (it is shared), so the ratio of
// two rates measured minutes apart above mostly measures the drift. Here each round times the
// reference (a GEMM, or the forward) and then the kernel back to back, each for at least a
// quarter of a second, and the summary takes the median of the rounds' ratios.
struct PairedRatio {
  double median, lo, hi;
};

// Wall seconds per call of `body`, called until `min_seconds` have passed (at least once).
double seconds_per_call(const std::function<void()>& body, double min_seconds) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    body();
    ++calls;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / double(calls);
}

// (kernel FLOP/s) ÷ (reference FLOP/s) over `rounds` alternating rounds, after one warm-up call
// of each (the kernels' workspaces grow on their first call).
PairedRatio paired_ratio(const std::function<void()>& reference, double reference_flops,
                         const std::function<void()>& kernel, double kernel_flops, int rounds) {
  reference();
  kernel();
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    const double t_ref = seconds_per_call(reference, 0.25);
    const double t_kernel = seconds_per_call(kernel, 0.25);
    ratios.push_back((kernel_flops / t_kernel) / (reference_flops / t_ref));
  }
  std::sort(ratios.begin(), ratios.end());
  return {ratios[ratios.size() / 2], ratios.front(), ratios.back()};
}

// The 2048³ GEMMs of BM_Sgemm and BM_GemmBf16 as plain calls, for the paired rounds.
struct GemmCalls {
  static constexpr int64_t n = 2048;
  std::vector<float> A = random_floats(n * n, 1), B = random_floats(n * n, 2), C{};
  std::vector<uint16_t> Ab, Bb;
  GemmCalls() {
    C.resize(n * n);
    for (size_t i = 0; i < A.size(); ++i)
      Ab.push_back(longtron::safetensors::float_to_bf16(A[i])),
          Bb.push_back(longtron::safetensors::float_to_bf16(B[i]));
  }
  double flops() const { return 2.0 * n * n * n; }
  void sgemm() {
    ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
  }
  void bf16() {
    ops::gemm_bf16(false, false, n, n, n, 1.0f, Ab.data(), Bb.data(), 0.0f, C.data());
  }
};

// fwd+bwd of `a` against the GEMM of its dtype, paired.
PairedRatio paired_against_gemm(AttentionData& a, GemmCalls& g, int rounds) {
  const bool half = a.cc.bf16();
  return paired_ratio([&] { half ? g.bf16() : g.sgemm(); }, g.flops(),
                      [&] { a.forward(), a.backward(); }, 3 * a.forward_flops(), rounds);
}

// One line of the paired summary; `floor` ≤ 0: no target.
void print_paired(const char* what, const PairedRatio& r, double floor) {
  std::printf("  %-46s %.2f  [%.2f, %.2f]", what, r.median, r.lo, r.hi);
  if (floor > 0) std::printf("  (target >= %.2f)", floor);
  std::printf("\n");
}

// Whether --paired_filter selects the paired line `what`.
bool wanted(const char* what) {
  return g_paired_filter.empty() || std::string(what).find(g_paired_filter) != std::string::npos;
}

// The targets, each as a paired ratio: fwd+bwd against the same dtype's GEMM on the varlen row
// and on one 16384-token document, and the backward against the forward on the row.
void run_paired(int rounds) {
  std::printf("\npaired rounds (reference and kernel alternated, %d rounds): median [min, max]\n",
              rounds);
  GemmCalls g;
  const bool bf16 = ops::attention_bf16_native();
  for (int d : {64, 128}) {
    for (int64_t doc : {int64_t(0), kLongDocument}) {
      for (bool half : {false, true}) {
        if (half && !bf16) continue;
        AttentionData a(d, doc);
        if (half) a.cc.set_type(ops::ComputeType::kBFloat16);
        char what[96];
        std::snprintf(what, sizeof(what), "%s, head_dim %d: %s fwd+bwd / %s",
                      doc > 0 ? "one 16384-token document" : "varlen row", d,
                      half ? "bf16" : "fp32", half ? "bf16 GEMM" : "sgemm");
        const double floor = half && d == 64 ? 0.65 : 0.75;
        if (wanted(what)) print_paired(what, paired_against_gemm(a, g, rounds), floor);
        if (doc > 0) continue;
        std::snprintf(what, sizeof(what), "varlen row, head_dim %d: %s backward / forward", d,
                      half ? "bf16" : "fp32");
        if (wanted(what))
          print_paired(what, paired_ratio([&] { a.forward(); }, a.forward_flops(),
                                          [&] { a.backward(); }, 2 * a.forward_flops(), rounds),
                       0.9);
      }
    }
  }
  // How the rate depends on the documents' length: each query block and key block costs the
  // same packing and stores whatever the length, but meets fewer products in short documents.
  for (int64_t length : {256, 1024, 4096}) {
    for (bool half : {false, true}) {
      if (half && !bf16) continue;
      AttentionData a(128, equal_cu_seqlens(length));
      if (half) a.cc.set_type(ops::ComputeType::kBFloat16);
      char what[96];
      std::snprintf(what, sizeof(what), "%ld-token documents, head_dim 128: %s fwd+bwd / GEMM",
                    long(length), half ? "bf16" : "fp32");
      if (wanted(what)) print_paired(what, paired_against_gemm(a, g, rounds), 0);
    }
  }
}

BENCHMARK(BM_Sgemm)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VarlenAttentionForward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VarlenAttentionBackward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VarlenAttentionForwardBackward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmBf16)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VarlenAttentionBf16Forward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VarlenAttentionBf16Backward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VarlenAttentionBf16ForwardBackward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_OneDocumentForwardBackward)->ArgsProduct({{0, 1}, {64, 128}})->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_VarlenAttentionWindow)->Arg(0)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);
BENCHMARK(BM_DenseCausalAttentionForwardBackward)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// Records each run's wall-clock time (ms) under the short names used by `timed`.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const std::string& f = r.run_name.function_name;
      const std::string arg = r.run_name.args.substr(0, r.run_name.args.find('/'));
      const std::string key = f == "BM_Sgemm"                            ? "sgemm"
                              : f == "BM_GemmBf16"                       ? "bf16gemm"
                              : f == "BM_VarlenAttentionBf16ForwardBackward" ? "bf16fwdbwd" + arg
                              : f == "BM_VarlenAttentionForward"         ? "fwd" + arg
                              : f == "BM_VarlenAttentionBackward"        ? "bwd" + arg
                              : f == "BM_VarlenAttentionBf16Forward"     ? "bf16fwd" + arg
                              : f == "BM_VarlenAttentionBf16Backward"    ? "bf16bwd" + arg
                              : f == "BM_VarlenAttentionWindow"          ? "window" + arg
                              : f == "BM_OneDocumentForwardBackward"
                                  ? (arg == "0" ? "doc" : "bf16doc") +
                                        r.run_name.args.substr(r.run_name.args.find('/') + 1)
                              : f == "BM_VarlenAttentionForwardBackward" ? "fwdbwd" + arg
                                                                         : "dense" + arg;
      ms[key] = r.GetAdjustedRealTime();
      auto it = r.counters.find("GFLOP/s");
      if (it != r.counters.end()) g_gflops[key] = it->second.value;
    }
  }
  std::map<std::string, double> ms;
};

// Takes --paired_rounds=N (default 5; 0 skips the paired rounds) and --paired_filter=TEXT (only
// the paired lines whose label contains TEXT, e.g. "varlen row, head_dim 64: fp32 fwd+bwd": the
// one-document lines take minutes on a small machine) out of argv.
int paired_rounds_flag(int& argc, char** argv) {
  int rounds = 5;
  const std::string flag = "--paired_rounds=", filter = "--paired_filter=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(flag, 0) == 0)
      rounds = std::max(0, std::atoi(arg.c_str() + flag.size()));
    else if (arg.rfind(filter, 0) == 0)
      g_paired_filter = arg.substr(filter.size());
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  return rounds;
}

int main(int argc, char** argv) {
  longtron::ensure_passive_omp_wait(argv);  // see ops/threads.h: spinning OpenMP workers starve the BLAS
  const int paired_rounds = paired_rounds_flag(argc, argv);
  const char* env = std::getenv("OMP_NUM_THREADS");
  const int threads = longtron::set_num_threads(env != nullptr ? std::atoi(env) : 0);
  benchmark::Initialize(&argc, argv);
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const auto cu = exponential_cu_seqlens(2024);
  std::printf("\nthreads %d; row %ld tokens in %zu documents, sum l^2 = %.4g (dense P^2 = %.4g)\n",
              threads, long(kTokens), cu.size() - 1, sum_squares(cu), double(kTokens) * kTokens);
  const double sgemm = g_gflops["sgemm"], sgemm_cpu = g_cpu_gflops["sgemm"];
  std::printf("sgemm 2048^3: %.1f GFLOP/s wall, %.1f GFLOP per CPU-second\n", sgemm, sgemm_cpu);
  if (g_gflops["bf16gemm"] > 0)
    std::printf("bf16 GEMM 2048^3: %.1f GFLOP/s wall, %.1f GFLOP per CPU-second\n",
                g_gflops["bf16gemm"], g_cpu_gflops["bf16gemm"]);
  for (int d : {64, 128}) {
    const std::string ds = std::to_string(d);
    const double fb = g_gflops["fwdbwd" + ds], fb_cpu = g_cpu_gflops["fwdbwd" + ds];
    const double ms = reporter.ms["fwdbwd" + ds], dense_ms = reporter.ms["dense" + ds];
    std::printf(
        "head_dim %3d: varlen fwd %.1f GFLOP/s, fwd+bwd %.1f GFLOP/s = %.2f x sgemm wall "
        "(%.2f per CPU-second; target >= 0.75); fwd+bwd %.0f ms vs dense causal %.0f ms: "
        "speed-up %.1fx\n",
        d, g_gflops["fwd" + ds], fb, sgemm > 0 ? fb / sgemm : 0.0,
        sgemm_cpu > 0 ? fb_cpu / sgemm_cpu : 0.0, ms, dense_ms, ms > 0 ? dense_ms / ms : 0.0);
    const double f = g_gflops["fwd" + ds], b = g_gflops["bwd" + ds];
    const double f_cpu = g_cpu_gflops["fwd" + ds], b_cpu = g_cpu_gflops["bwd" + ds];
    std::printf(
        "head_dim %3d: backward %.1f GFLOP/s = %.2f x forward wall (%.1f vs %.1f GFLOP per "
        "CPU-second = %.2f; target >= 0.9)\n",
        d, b, f > 0 ? b / f : 0.0, b_cpu, f_cpu, f_cpu > 0 ? b_cpu / f_cpu : 0.0);
    const double hf = g_gflops["bf16fwd" + ds], hb = g_gflops["bf16bwd" + ds];
    const double hfb = g_gflops["bf16fwdbwd" + ds], hgemm = g_gflops["bf16gemm"];
    if (hfb > 0 && hgemm > 0) {
      std::printf(
          "head_dim %3d: bf16 fwd+bwd %.1f GFLOP/s = %.2f x bf16 GEMM (%.1f) wall (%.2f per "
          "CPU-second; target >= %.2f)\n",
          d, hfb, hfb / hgemm, hgemm,
          g_cpu_gflops["bf16gemm"] > 0 ? g_cpu_gflops["bf16fwdbwd" + ds] / g_cpu_gflops["bf16gemm"]
                                       : 0.0,
          d == 64 ? 0.65 : 0.75);  // at 64 the softmax and dS work per score weigh twice
    }
    if (hf > 0 && hb > 0) {
      std::printf(
          "head_dim %3d: bf16 forward %.1f GFLOP/s (%.2f x fp32), backward %.1f (%.2f x fp32), "
          "backward = %.2f x forward (%.2f per CPU-second)\n",
          d, hf, f > 0 ? hf / f : 0.0, hb, b > 0 ? hb / b : 0.0, hb / hf,
          g_cpu_gflops["bf16fwd" + ds] > 0
              ? g_cpu_gflops["bf16bwd" + ds] / g_cpu_gflops["bf16fwd" + ds]
              : 0.0);
    }
  }
  for (int d : {64, 128}) {
    const std::string ds = std::to_string(d);
    const double f = g_gflops["doc" + ds], h = g_gflops["bf16doc" + ds];
    if (f > 0 && sgemm > 0)
      std::printf("one %ld-token document, head_dim %3d: fwd+bwd %.1f GFLOP/s = %.2f x sgemm wall "
                  "(%.2f per CPU-second)\n",
                  long(kLongDocument), d, f, f / sgemm,
                  sgemm_cpu > 0 ? g_cpu_gflops["doc" + ds] / sgemm_cpu : 0.0);
    if (h > 0 && g_gflops["bf16gemm"] > 0)
      std::printf("one %ld-token document, head_dim %3d: bf16 fwd+bwd %.1f GFLOP/s = %.2f x bf16 "
                  "GEMM wall (%.2f per CPU-second)\n",
                  long(kLongDocument), d, h, h / g_gflops["bf16gemm"],
                  g_cpu_gflops["bf16gemm"] > 0
                      ? g_cpu_gflops["bf16doc" + ds] / g_cpu_gflops["bf16gemm"]
                      : 0.0);
  }
  const double none_ms = reporter.ms["window0"];
  for (int w : {256, 1024}) {
    const std::string key = "window" + std::to_string(w);
    if (none_ms <= 0 || reporter.ms[key] <= 0) continue;
    std::printf(
        "window %4d on one 4096-token document: fwd+bwd %.0f ms vs %.0f ms without = %.3f of the "
        "time for %.3f of the pairs\n",
        w, reporter.ms[key], none_ms, reporter.ms[key] / none_ms,
        double(ops::visible_pairs(4096, w)) / double(ops::visible_pairs(4096)));
  }
  if (paired_rounds > 0) run_paired(paired_rounds);
  return 0;
}
