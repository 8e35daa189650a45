// Distributed step benchmark (docs/benchmarks.md); run under mpirun, one layout per job
// so that peak RSS belongs to that layout (bench/bench_parallel.sh runs them all):
//   mpirun -np 2 bench_parallel --tp 2 --mode msp [--zero1 -1] [--steps 3] [--dtype bfloat16]
//     [--no-overlap | --overlap-ab]
// On configs/small.toml's model (V 8192, H 384, 6 layers, 6 heads / 2 kv heads, P = 4 × 512) with
// rows packed by the real loader from synthetic documents (log-normal lengths, median ≈ 200), each
// rank prints: mean step time (forward+backward, reductions, clipping, AdamW), payload bytes it
// sent per step by collective kind and the ring-algorithm bytes it sent (the communicator's
// counters, CommStats::bytes and ::sent), its peak RSS (getrusage) and
// the model's activation workspace, and the seconds of the data-parallel gradient reduction spent
// inside backward and after it (--overlap-ab: steps alternate overlapping it with backward and
// not, each setting reported on its own line). Fixed iteration counts (no Google Benchmark timing loop):
// every rank must issue the same collectives.
//   bench_parallel --sum-l2 [--dp 2,4,8] [--steps 50]   (one process, no MPI)
// prints each dp rank's attention cost Σ lᵢ² per step (the load-balance question of packed
// training) under the sampler's split, and its spread across ranks: (max − min) / mean per step,
// mean and worst.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/memory_source.h"
#include "model/decoder.h"
#include "modes/engine.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"
#include "packing/loader.h"
#include "parallel/layout.h"
#include "train/optimizer.h"
#include "train/step.h"

using namespace longtron;

namespace {

model::ModelConfig small_model() {  // configs/small.toml [model]
  model::ModelConfig c;
  c.vocab_size = 8192;
  c.hidden_size = 384;
  c.num_layers = 6;
  c.num_attention_heads = 6;
  c.num_kv_attention_heads = 2;
  c.mlp_ratio = 8.0 / 3.0;
  return c;
}

data::DataConfig small_data() {  // configs/small.toml [data]
  data::DataConfig d;
  d.pack.seq_len = 512;
  d.pack.micro_bsz = 4;
  d.micro_num = 1;
  return d;
}

/// Synthetic corpus: log-normal document lengths (median e^5.3 ≈ 200 tokens, long tail past
/// seq_len), uniform ids. Deterministic.
data::Dataset synthetic_dataset(int64_t docs, int64_t vocab) {
  std::mt19937_64 gen(2024);
  std::lognormal_distribution<double> len(5.3, 1.0);
  std::uniform_int_distribution<int32_t> id(1, int32_t(vocab) - 1);
  std::vector<std::vector<int32_t>> documents;
  for (int64_t i = 0; i < docs; ++i) {
    const int64_t n = std::clamp<int64_t>(int64_t(len(gen)), 2, 4096);
    std::vector<int32_t> d(static_cast<size_t>(n));
    for (auto& t : d) t = id(gen);
    documents.push_back(std::move(d));
  }
  data::Dataset ds;
  ds.push_back(std::make_unique<data::MemorySource>(std::move(documents), "<synthetic>"));
  return ds;
}

std::string arg(int argc, char** argv, const std::string& key, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (key == argv[i]) return argv[i + 1];
  return fallback;
}
bool flag(int argc, char** argv, const std::string& key) {
  for (int i = 1; i < argc; ++i)
    if (key == argv[i]) return true;
  return false;
}

int sum_l2_report(int argc, char** argv) {
  const int steps = std::stoi(arg(argc, argv, "--steps", "50"));
  std::string dps = arg(argc, argv, "--dp", "2,4,8");
  for (char& c : dps) c = c == ',' ? ' ' : c;
  char* p = dps.data();
  for (long dp = std::strtol(p, &p, 10); dp > 0; dp = std::strtol(p, &p, 10)) {
    data::BatchLoader loader(synthetic_dataset(20000, 8192), small_data(), dp);
    double spread_sum = 0, spread_max = 0, cost_sum = 0;
    for (int s = 0; s < steps; ++s) {
      std::vector<double> cost;
      for (int r = 0; r < dp; ++r) {
        double c = 0;
        for (const auto& b : loader.step(r, s)) c += model::sum_squared_segments(b.cu_seqlens);
        cost.push_back(c);
      }
      const auto [lo, hi] = std::minmax_element(cost.begin(), cost.end());
      double mean = 0;
      for (double c : cost) mean += c / double(dp);
      const double spread = (*hi - *lo) / mean;
      spread_sum += spread, spread_max = std::max(spread_max, spread), cost_sum += mean;
      if (s < 3) {
        std::printf("sum_l2 dp %ld step %d:", dp, s);
        for (double c : cost) std::printf(" %.3g", c);
        std::printf("  (max-min)/mean %.2f\n", spread);
      }
    }
    std::printf("sum_l2 dp %ld over %d steps: mean per-rank Σl² %.3g, (max-min)/mean mean %.2f, "
                "worst %.2f  (one full segment of 2048 would be %.3g, four of 512 %.3g)\n",
                dp, steps, cost_sum / steps, spread_sum / steps, spread_max, 2048.0 * 2048.0,
                4 * 512.0 * 512.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  longtron::ensure_passive_omp_wait(argv);  // see ops/threads.h: spinning OpenMP workers starve the BLAS
  if (flag(argc, argv, "--sum-l2")) return sum_l2_report(argc, argv);
  comm::CommPtr world = comm::init(argc, argv);
  int status = comm::abort_on_error([&] {
    parallel::Layout layout;
    layout.tensor_size = std::stoi(arg(argc, argv, "--tp", "1"));
    layout.tensor_mode = parallel::parse_tensor_mode(arg(argc, argv, "--mode", "mtp"), "--mode");
    layout.zero1_size = std::stoi(arg(argc, argv, "--zero1", "1"));
    const int steps = std::stoi(arg(argc, argv, "--steps", "3"));
    set_num_threads(0, world->size());  // cores ÷ ranks (one machine)
    parallel::Grid grid = parallel::make_grid(world, layout);
    const data::DataConfig dc = small_data();
    data::BatchLoader loader(synthetic_dataset(4000, 8192), dc, grid.dp);
    parallel::ParallelEngine engine(small_model(), grid, 1, dc.pack.packed_length());
    train::OptimizerConfig oc;
    train::AdamW adam(engine.local_layout(), oc, grid.zero1);
    // --overlap-ab: odd steps overlap the dp gradient reduction (the all-reduce, or ZeRO-1's
    // reduce-scatter with --zero1) with backward, even ones do not
    // (same process, interleaved, so the machine's load hits both alike).
    const bool ab = flag(argc, argv, "--overlap-ab");
    const bool bf16 = arg(argc, argv, "--dtype", "float32") == "bfloat16";
    engine.set_overlap_gradient_reduction(!flag(argc, argv, "--no-overlap"));
    double seconds = 0;
    double ab_seconds[2] = {0, 0}, ab_in[2] = {0, 0}, ab_after[2] = {0, 0};
    int ab_steps[2] = {0, 0};
    comm::CommStats before;
    for (int s = 0; s <= steps; ++s) {  // step 0 warms up (workspace, first-touch)
      if (s == 1) before = comm::global_stats();
      if (ab) engine.set_overlap_gradient_reduction(s % 2 == 1);
      world->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      const auto batches = loader.step(grid.data->rank(), s);
      train::StepOptions so;  // the trainer's step: token loss, clip at 1, lr 1e-3
      so.lr = 1e-3;
      so.clip_grad_norm = 1.0;
      engine.set_compute_type(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32);
      const train::StepResult r = train::train_step(engine, adam, batches, so);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) {
        seconds += dt;
        const int k = engine.overlaps_gradient_reduction() ? 1 : 0;
        ab_seconds[k] += dt;
        ab_in[k] += engine.reduction_times().in_backward;
        ab_after[k] += engine.reduction_times().after_backward;
        ++ab_steps[k];
      }
      if (world->rank() == 0 && s == steps)
        std::printf("mode %s tp %d dp %d zero1 %d: last loss %.4f grad norm %.4f\n",
                    engine.mode().c_str(), grid.tp, grid.dp, grid.zero1->size(),
                    r.loss, r.grad_norm);
    }
    comm::CommStats delta = comm::global_stats();
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    // One line per rank, in rank order.
    for (int r = 0; r < world->size(); ++r) {
      world->barrier();
      if (r != world->rank()) continue;
      std::printf("rank %d %s: step %.3f s, peak RSS %.1f MiB, model workspace %.1f MiB, params "
                  "%.2f M local; bytes/step:",
                  r, engine.mode().c_str(), seconds / steps, double(usage.ru_maxrss) / 1024.0,
                  double(engine.model().workspace_bytes()) / 1048576.0,
                  double(engine.local_layout().numel()) * 1e-6);
      for (int k = 0; k < comm::kNumKinds; ++k) {
        const double bytes = double(delta.bytes[size_t(k)] - before.bytes[size_t(k)]) / steps;
        const double calls = double(delta.calls[size_t(k)] - before.calls[size_t(k)]) / steps;
        if (calls > 0)
          std::printf(" %s %.2f MB (%.0f calls)", comm::kind_name(comm::Kind(k)), bytes * 1e-6,
                      calls);
      }
      std::printf("; ring bytes sent/step: %.2f MB\n",
                  double(delta.total_sent() - before.total_sent()) / steps * 1e-6);
      for (int k = 0; k < 2; ++k)
        if (ab_steps[k] > 0)
          std::printf("rank %d dp gradient reduction %s: %d steps, step %.3f s, reduction in "
                      "backward %.4f s, after backward %.4f s\n", r,
                      k ? "overlapped" : "after backward", ab_steps[k], ab_seconds[k] / ab_steps[k],
                      ab_in[k] / ab_steps[k], ab_after[k] / ab_steps[k]);
      std::fflush(stdout);
    }
    return 0;
  });
  world.reset();
  comm::finalize();
  return status;
}
