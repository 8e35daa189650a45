// Long context under ISP (docs/isp.md): one packed row of P tokens (default 32768; documents of mixed
// lengths, log-uniform in [64, 8192], packed by build_pack) trained with the engine in mode "isp",
// T = W = world size (run with `mpirun -np T`, T = 1, 2 or 4; T = 1 is the same code path with
// groups of one). Per rank it reports:
// - resident memory after parameters, gradients and AdamW state are allocated (baseline), peak
//   resident memory (getrusage) after the steps, and activation memory = peak − baseline;
// - bytes per step of the Ulysses all-to-alls (TENSOR group) and of the weight all-gathers and
//   gradient reduce-scatters (WEIGHT group), as the communicator counts them (the send buffer a
//   rank hands to the collective), next to the Ulysses formula of docs/isp.md:
//   per layer and direction (N/P)·d·(2·h_q + 2·h_kv')·4 bytes (fp32) sent, of which (P−1)/P leave
//   the rank;
// - the step time (median of the timed steps; the first step is a warm-up).
// Options (argv): tokens=N checkpoint=0|1 overlap=0|1 steps=K layers=L hidden=H cp=C
// balance=0|1|2 ring=0|1 window_size=w compare=0|1 bf16=0|1 (defaults 32768, 0, 0, 2, 4, 128, 1,
// 1, 1, 1, 0, 0). bf16=1 trains in mixed precision as model.dtype = "bfloat16" does (the compute
// type and the step's bf16 weight copy): the weight all-gathers of the linears and the head then
// move bf16 (docs/isp.md). compare=1 also steps a plain isp engine on the same ranks after each
// step (one run, two step times and their ratio). cp=C > 1
// turns on 2D-Attention (ring=1: ring attention, window_size its inner rings; ring=0: the K/V
// all-gather form)
// (parallel.sequence_2D, head_size T / C, head_first; balance 0 contiguous, 1 zigzag, 2 document):
// its all-to-alls run on the HEAD group, the K/V all-gathers and dK/dV reduce-scatters on the
// CONTEXT group, each counted on its own. Threads per rank: hardware threads ÷ ranks (docs/cluster.md), at least 1.
// This is a plain MPI program (not Google Benchmark): each configuration is one mpirun.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
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
#include "packing/pack.h"
#include "parallel/isp_attention.h"
#include "parallel/layout.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace {

using namespace longtron;

double rss_mib() {  // current resident set
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return double(resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::map<std::string, long> parse_args(int argc, char** argv) {
  std::map<std::string, long> a{{"tokens", 32768}, {"checkpoint", 0}, {"overlap", 0},
                                {"steps", 2},      {"layers", 4},     {"hidden", 128},
                                {"cp", 1},         {"balance", 1},   {"ring", 1},
                                {"window_size", 1}, {"compare", 0}, {"bf16", 0}};
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    const auto eq = s.find('=');
    if (eq == std::string::npos || !a.count(s.substr(0, eq))) {
      std::fprintf(stderr, "unknown option %s (tokens= checkpoint= overlap= steps= layers= hidden= cp= balance= ring= window_size= compare= bf16=)\n",
                   argv[i]);
      std::exit(2);
    }
    a[s.substr(0, eq)] = std::atol(s.c_str() + eq + 1);
  }
  return a;
}

/// One packed row of P tokens from documents of log-uniform lengths in [64, 8192] (seeded).
data::MicroBatch long_row(int64_t P, int64_t vocab) {
  std::mt19937 gen(2024);
  std::vector<std::vector<int32_t>> docs;
  int64_t total = 0;
  while (total < P + 8192) {
    const double u = std::uniform_real_distribution<double>(std::log(64.0), std::log(8192.0))(gen);
    std::vector<int32_t> d(size_t(std::exp(u)));
    for (auto& t : d) t = std::uniform_int_distribution<int32_t>(1, int32_t(vocab) - 1)(gen);
    total += int64_t(d.size());
    docs.push_back(std::move(d));
  }
  data::MemorySource src(docs);
  data::PackConfig pc;
  pc.seq_len = P;
  pc.micro_bsz = 1;
  std::vector<int64_t> order(docs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  data::MicroBatch row;
  data::build_pack(src, order, pc)->row_into(0, row);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  ensure_passive_omp_wait(argv);
  comm::CommPtr world = comm::init(argc, argv);
  const auto a = parse_args(argc, argv);
  {  // everything holding communicators ends before finalize
  const int T = world->size(), rank = world->rank();
  set_num_threads(0, T);

  model::ModelConfig c;
  c.vocab_size = 4096;
  c.hidden_size = a.at("hidden");
  c.num_layers = a.at("layers");
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;  // T = 4 repeats each kv head twice
  c.multiple_of = 64;
  c.checkpoint = a.at("checkpoint") != 0;
  const int64_t P = a.at("tokens");
  const data::MicroBatch row = long_row(P, c.vocab_size);

  parallel::Layout layout;
  layout.tensor_size = T;
  layout.tensor_mode = parallel::TensorMode::kIsp;
  layout.weight_size = T;
  layout.weight_overlap = a.at("overlap") != 0;
  const int C = int(a.at("cp"));
  if (C > 1) {
    static const char* const kBalance[] = {"contiguous", "zigzag", "document"};
    layout.seq2d = true;
    layout.seq2d_context = C;
    layout.seq2d_head = T / C;
    layout.seq2d_balance = data::parse_context_balance(kBalance[std::clamp<long>(a.at("balance"), 0, 2)]);
    layout.seq2d_ring = a.at("ring") != 0;
    layout.seq2d_window = int(a.at("window_size"));
  }
  parallel::Grid grid = parallel::make_grid(world, layout);
  parallel::ParallelEngine engine(c, grid, 42, P);
  train::OptimizerConfig oc;
  train::AdamW adam(engine.local_layout(), oc, grid.zero1);
  // compare=1 (with cp > 1): a second engine in plain isp over the same T ranks, stepped after
  // each step of the first on the same row, so the two step times come from one run under the
  // same load (memory figures then include both engines).
  std::unique_ptr<parallel::Grid> grid_b;
  std::unique_ptr<parallel::ParallelEngine> engine_b;
  std::unique_ptr<train::AdamW> adam_b;
  if (a.at("compare") != 0 && C > 1) {
    parallel::Layout plain = layout;
    plain.seq2d = false;
    grid_b = std::make_unique<parallel::Grid>(parallel::make_grid(world, plain));
    engine_b = std::make_unique<parallel::ParallelEngine>(c, *grid_b, 42, P);
    adam_b = std::make_unique<train::AdamW>(engine_b->local_layout(), oc, grid_b->zero1);
  }
  std::vector<double> times_b;
  world->barrier();
  const double baseline = rss_mib();

  // bf16=1: the trainer's mixed precision (train_step's update refreshes the weight copy).
  const bool bf16 = a.at("bf16") != 0;
  engine.set_compute_type(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32);
  std::vector<double> times;
  comm::CommStats tensor_bytes, weight_bytes, context_bytes;
  double loss = 0;
  for (long s = 0; s < a.at("steps"); ++s) {
    grid.head->reset_stats();
    grid.context->reset_stats();
    grid.weight->reset_stats();
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    train::StepOptions so;  // the trainer's step: token loss, clip at 1, lr 1e-3
    so.lr = 1e-3;
    so.clip_grad_norm = 1.0;
    const train::StepResult l = train::train_step(engine, adam, {row}, so);
    world->barrier();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    tensor_bytes = grid.head->stats();
    context_bytes = grid.context->stats();
    weight_bytes = grid.weight->stats();
    loss = l.loss;
    if (engine_b) {
      world->barrier();
      const auto t1 = std::chrono::steady_clock::now();
      const train::StepResult lb = train::train_step(*engine_b, *adam_b, {row}, so);
      world->barrier();
      times_b.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
      if (rank == 0)
        std::printf("  step %ld: 2D %.3f s (loss %.4f), isp T = %d %.3f s (loss %.4f), ratio %.3f\n",
                    s + 1, times.back(), l.loss, T, times_b.back(), lb.loss,
                    times.back() / times_b.back());
    }
  }
  const double peak = peak_rss_mib();

  double mine[3] = {baseline, peak, peak - baseline};
  std::vector<double> all(size_t(3 * T));
  world->all_gather(all.data(), mine, 3);
  std::vector<double> timed(times.begin() + (times.size() > 1 ? 1 : 0), times.end());
  std::sort(timed.begin(), timed.end());
  if (rank == 0) {
    const int Th = T / C;  // the head group: Ulysses runs over it
    const auto h = parallel::ulysses_heads(c.num_attention_heads, c.num_kv_attention_heads, Th);
    const double d = double(c.head_dim()), n_local = double(P) / T;
    const double per_layer_dir = n_local * d * double(2 * h.hq + 2 * h.hkv_local * Th) * 4.0;
    // Passes over the layers: forward, backward, and under checkpointing the recomputed forward
    // of every block but the last (the model still holds the last block's activations).
    const int64_t passes = c.checkpoint ? 3 * c.num_layers - 1 : 2 * c.num_layers;
    const auto k = [](comm::Kind kind) { return int(kind); };
    std::printf("isp_long %s tokens %lld T %d (head %d x context %d, %s) W %d checkpoint %d overlap %d "
                "layers %lld hidden %lld threads/rank %d: loss %.4f step %.3f s (median of %zu)\n",
                bf16 ? "bf16" : "fp32", (long long)P, T, Th, C, C > 1 ? data::context_balance_name(layout.seq2d_balance).c_str() : "-", T,
                int(c.checkpoint), int(layout.weight_overlap),
                (long long)c.num_layers, (long long)c.hidden_size, num_threads(), loss,
                timed[timed.size() / 2], timed.size());
    for (int r = 0; r < T; ++r)
      std::printf("  rank %d: baseline %.1f MiB, peak %.1f MiB, activation %.1f MiB\n", r,
                  all[size_t(3 * r)], all[size_t(3 * r + 1)], all[size_t(3 * r + 2)]);
    std::printf("  bytes/step/rank: all_to_all %.2f MiB (%llu calls); formula %lld layer passes x "
                "(N/P)d(2hq+2hkv')4 = %.2f MiB sent, %.2f MiB leaving the rank\n",
                tensor_bytes.bytes[k(comm::Kind::kAllToAll)] / 1048576.0,
                (unsigned long long)tensor_bytes.calls[k(comm::Kind::kAllToAll)], (long long)passes,
                double(passes) * per_layer_dir / 1048576.0,
                double(passes) * per_layer_dir * (Th - 1) / Th / 1048576.0);
    std::printf("  bytes/step/rank: context K/V all_gather %.2f MiB sent (%llu calls), dK/dV "
                "reduce_scatter %.2f MiB (%llu calls)\n",
                context_bytes.bytes[k(comm::Kind::kAllGather)] / 1048576.0,
                (unsigned long long)context_bytes.calls[k(comm::Kind::kAllGather)],
                context_bytes.bytes[k(comm::Kind::kReduceScatter)] / 1048576.0,
                (unsigned long long)context_bytes.calls[k(comm::Kind::kReduceScatter)]);
    std::printf("  bytes/step/rank: context ring sends %.2f MiB (%llu messages), skipped as "
                "invisible %.2f MiB; per layer %.2f MiB sent, %.2f MiB skipped\n",
                context_bytes.bytes[k(comm::Kind::kSend)] / 1048576.0,
                (unsigned long long)context_bytes.calls[k(comm::Kind::kSend)],
                context_bytes.skipped[k(comm::Kind::kSend)] / 1048576.0,
                context_bytes.bytes[k(comm::Kind::kSend)] / 1048576.0 / double(c.num_layers),
                context_bytes.skipped[k(comm::Kind::kSend)] / 1048576.0 / double(c.num_layers));
    std::printf("  bytes/step/rank: weight all_gather %.2f MiB sent (%llu calls, x%d gathered), "
                "reduce_scatter %.2f MiB (%llu calls)\n",
                weight_bytes.bytes[k(comm::Kind::kAllGather)] / 1048576.0,
                (unsigned long long)weight_bytes.calls[k(comm::Kind::kAllGather)], T,
                weight_bytes.bytes[k(comm::Kind::kReduceScatter)] / 1048576.0,
                (unsigned long long)weight_bytes.calls[k(comm::Kind::kReduceScatter)]);
  }
  }
  world.reset();
  comm::finalize();
  return 0;
}
