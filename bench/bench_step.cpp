// One training micro-batch of configs/small.toml (docs/benchmarks.md): forward+backward
// of InternLM2 (vocab 8192, hidden 384, 6 layers, 6 heads, 2 kv heads, mlp_ratio 8/3) on a packed
// row of P = micro_bsz 4 × seq_len 512 = 2048 tokens holding random documents of exponential
// length (mean 300, seeded), cut into segments of at most seq_len as the packer does.
//
// MFU (docs/training.md) = model FLOPs of the micro-batch (docs/model.md: 6 × matmul parameters ×
// tokens + 6 × layers × hidden × Σ lᵢ²) ÷ step time ÷ the sgemm FLOP/s measured in the same run
// (2048³). Also printed: peak resident memory of the process (getrusage) and the model's workspace.
// LONGTRON_BENCH_ROUNDS (default 5) sets the interleaved rounds; 0 skips them, so that
// `--benchmark_filter=BM_Step/0` alone gives the peak RSS of one training configuration.
// OMP_WAIT_POLICY defaults to passive here (see main); set it to compare.
// Threads: OMP_NUM_THREADS if set (OpenMP and OpenBLAS alike), else all hardware threads.
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "model/decoder.h"
#include "ops/ops.h"
#include "ops/threads.h"
#include "packing/batch.h"

namespace model = longtron::model;
namespace data = longtron::data;

namespace {

constexpr int64_t kSeqLen = 512, kMicroBsz = 4, kP = kSeqLen * kMicroBsz;
std::map<std::string, double> g_value;  // benchmark name + "/" + counter → value

model::ModelConfig small_config(bool checkpoint) {
  model::ModelConfig c;
  c.vocab_size = 8192;
  c.hidden_size = 384;
  c.num_layers = 6;
  c.num_attention_heads = 6;
  c.num_kv_attention_heads = 2;
  c.checkpoint = checkpoint;
  return c;
}

/// A packed row of random documents (exponential lengths, mean 300); segments cut at seq_len
/// from each document's start; the last document is cut by the row edge (label of its last
/// token kept, as the packer does across rows).
data::MicroBatch random_row(uint64_t seed, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> length(1.0 / 300.0);
  std::uniform_int_distribution<int32_t> id(1, static_cast<int32_t>(vocab - 1));
  data::MicroBatch b;
  b.cu_seqlens = {0};
  while (static_cast<int64_t>(b.input_ids.size()) < kP) {
    std::vector<int32_t> doc(static_cast<size_t>(std::max<int64_t>(1, std::llround(length(rng)))));
    for (auto& t : doc) t = id(rng);
    const int64_t n = static_cast<int64_t>(doc.size());
    const int64_t take = std::min<int64_t>(n, kP - static_cast<int64_t>(b.input_ids.size()));
    for (int64_t i = 0; i < take; ++i) {
      b.input_ids.push_back(doc[static_cast<size_t>(i)]);
      b.labels.push_back(i + 1 < n ? doc[static_cast<size_t>(i + 1)] : data::kIgnoreIndex);
      b.indexes.push_back(static_cast<int32_t>(i % kSeqLen));
      if (i % kSeqLen == kSeqLen - 1 || i == take - 1)
        b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
    }
  }
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s)
    b.max_seqlen = std::max(b.max_seqlen, b.cu_seqlens[s] - b.cu_seqlens[s - 1]);
  return b;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto A = random_floats(n * n, 1), B = random_floats(n * n, 2);
  std::vector<float> C(static_cast<size_t>(n * n));
  for (auto _ : state) {
    longtron::ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
    benchmark::DoNotOptimize(C.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Step(benchmark::State& state) {
  const model::ModelConfig c = small_config(state.range(0) != 0);
  const model::ParamTable layout(c);
  model::Params<float> params(layout), grads(layout);
  model::init_params(params, 1);
  model::Decoder<float> net(layout, params);
  const data::MicroBatch row = random_row(2024, c.vocab_size);
  net.forward_backward(row, grads, 1.0);  // warm-up: workspace allocation
  double loss = 0;
  for (auto _ : state) {
    const model::LossSum l = net.forward_backward(row, grads, 1.0);
    loss = l.sum / double(l.count);
  }
  const double flops = model::model_flops(c, kP, model::sum_squared_segments(row.cu_seqlens));
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["loss"] = loss;
  state.counters["workspace_MB"] = double(net.workspace_bytes()) / 1048576.0;
  state.counters["segments"] = double(row.cu_seqlens.size() - 1);
}

/// MFU measured robustly on a shared machine: rounds of (one 2048³ sgemm, one step) back to
/// back, so both see the same load; returns the median over rounds of the per-round MFU and
/// prints the best round too.
void interleaved_mfu(bool checkpoint, int rounds) {
  if (rounds <= 0) return;
  const model::ModelConfig c = small_config(checkpoint);
  const model::ParamTable layout(c);
  model::Params<float> params(layout), grads(layout);
  model::init_params(params, 1);
  model::Decoder<float> net(layout, params);
  const data::MicroBatch row = random_row(2024, c.vocab_size);
  const double flops = model::model_flops(c, kP, model::sum_squared_segments(row.cu_seqlens));
  const int64_t n = 2048;
  const auto A = random_floats(n * n, 1), B = random_floats(n * n, 2);
  std::vector<float> C(static_cast<size_t>(n * n));
  net.forward_backward(row, grads, 1.0);
  std::vector<double> mfu, cpu_mfu, step_s, sgemm_gf;
  const auto cpu_now = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  const auto sgemm = [&] {
    longtron::ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
  };
  for (int r = 0; r < rounds; ++r) {
    // sgemm before and after the step, so both see the same load on a shared machine.
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    sgemm();
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = cpu_now();
    net.forward_backward(row, grads, 1.0);
    const auto t2 = std::chrono::steady_clock::now();
    const double c2 = cpu_now();
    sgemm();
    const auto t3 = std::chrono::steady_clock::now();
    const double c3 = cpu_now();
    const double gemm_s = std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count() / 2;
    const double g = 2.0 * n * n * n / gemm_s;
    const double s = std::chrono::duration<double>(t2 - t1).count();
    sgemm_gf.push_back(g * 1e-9);
    step_s.push_back(s);
    mfu.push_back(flops / s / g);
    // CPU-time ratio: robust to preemption by other jobs (exact for one thread; with more,
    // spin-waiting threads count as busy).
    cpu_mfu.push_back(flops / (c2 - c1) / (2.0 * n * n * n / ((c1 - c0 + c3 - c2) / 2)));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("interleaved (checkpoint=%d, %d rounds): median MFU %.3f (CPU-time MFU %.3f); "
              "median step %.1f ms, median sgemm %.1f GFLOP/s; workspace %.0f MiB\n",
              checkpoint ? 1 : 0, rounds, median(mfu), median(cpu_mfu),
              1e3 * median(step_s), median(sgemm_gf), double(net.workspace_bytes()) / 1048576.0);
}

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      for (const auto& [k, v] : r.counters) g_value[r.benchmark_name() + "/" + k] = v.value;
      g_value[r.benchmark_name() + "/ms"] = r.GetAdjustedRealTime();
    }
  }
};

}  // namespace

BENCHMARK(BM_Sgemm)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

int main(int argc, char** argv) {
  longtron::ensure_passive_omp_wait(argv);
  const char* env = std::getenv("OMP_NUM_THREADS");
  const int threads = longtron::set_num_threads(env != nullptr ? std::atoi(env) : 0);
  benchmark::Initialize(&argc, argv);
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const data::MicroBatch row = random_row(2024, 8192);
  const double sgemm = g_value["BM_Sgemm/2048/real_time/GFLOP/s"];
  std::printf("\nthreads %d; P = %ld tokens in %zu segments, sum l^2 = %.4g; model FLOPs %.4g\n",
              threads, long(kP), row.cu_seqlens.size() - 1,
              model::sum_squared_segments(row.cu_seqlens),
              model::model_flops(small_config(false), kP,
                                 model::sum_squared_segments(row.cu_seqlens)));
  std::printf("OMP_WAIT_POLICY=%s\nsgemm 2048^3: %.1f GFLOP/s\n", std::getenv("OMP_WAIT_POLICY"),
              sgemm);
  for (int ckpt : {0, 1}) {
    const std::string name = "BM_Step/" + std::to_string(ckpt) + "/min_time:3.000/real_time/";
    const double gf = g_value[name + "GFLOP/s"];
    std::printf("step (checkpoint=%d): %.1f ms, %.1f model GFLOP/s, MFU %.3f (target >= 0.55), "
                "workspace %.0f MiB\n",
                ckpt, g_value[name + "ms"], gf, sgemm > 0 ? gf / sgemm : 0.0,
                g_value[name + "workspace_MB"]);
  }
  const char* rounds = std::getenv("LONGTRON_BENCH_ROUNDS");
  for (bool ckpt : {false, true}) interleaved_mfu(ckpt, rounds ? std::atoi(rounds) : 5);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("peak RSS of the process: %.0f MiB\n", double(usage.ru_maxrss) / 1024.0);
  return 0;
}
