// 2D tensor parallel versus 1D tensor parallel (MSP): payload bytes per rank per step on each group
// against the per-layer formulas of docs/tp2d.md (with the gathered input kept
// for backward, tp_linear.h), and step time of each overlap option. Run under mpirun with 4
// ranks (docs/tp2d.md):
//   OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe build/bench_tp2d configs/tp_bench.toml [steps]
// Per-layer bytes are measured as bytes(num_layers = L) − bytes(num_layers = L − 1), so the edges
// (embedding, head, final norm) cancel; "edges" is the rest. Payload as comm/communicator.h counts
// it (all-gather: the send chunk; reduce-scatter and all-to-all: the whole send buffer).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "modes/engine.h"
#include "ops/threads.h"
#include "parallel/layout.h"
#include "train/config.h"

using namespace longtron;

namespace {

using Bytes = std::map<std::string, double>;  // "group kind" → bytes per rank per step

data::MicroBatch bench_row(int64_t P, int64_t vocab) {
  std::mt19937 gen(5);
  data::MicroBatch b;
  b.cu_seqlens = {0, int32_t(P / 4), int32_t(P / 2), int32_t(P)};
  b.max_seqlen = int32_t(P / 2);
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s)
    for (int32_t i = 0; i < b.cu_seqlens[s] - b.cu_seqlens[s - 1]; ++i) {
      b.input_ids.push_back(int32_t(gen() % uint32_t(vocab)));
      b.indexes.push_back(i);
    }
  b.labels.assign(b.input_ids.begin() + 1, b.input_ids.end());
  b.labels.push_back(data::kIgnoreIndex);
  return b;
}

struct Measured {
  Bytes bytes;
  double step_s = 0;
};

Measured measure(const model::ModelConfig& m, const comm::CommPtr& world, const parallel::Layout& l,
                 int64_t P, int steps) {
  parallel::Grid grid = parallel::make_grid(world, l);
  parallel::ParallelEngine engine(m, grid, 1, P);
  const data::MicroBatch row = bench_row(P, m.vocab_size);
  const std::vector<std::pair<std::string, comm::CommPtr>> groups = {
      {"tensor", grid.tensor}, {"x", grid.x}, {"y", grid.y}};
  const auto step = [&] {
    engine.zero_grads();
    engine.forward_backward(row, 1e-3);
    engine.finish_gradients();
  };
  step();  // warm-up (workspaces)
  for (auto& [_, c] : groups) c->reset_stats();
  step();
  Measured out;
  for (auto& [name, c] : groups)
    for (int k = 0; k < comm::kNumKinds; ++k)
      if (c->stats().bytes[size_t(k)] > 0)
        out.bytes[name + " " + comm::kind_name(comm::Kind(k))] += double(c->stats().bytes[size_t(k)]);
  std::vector<double> times;
  for (int s = 0; s < steps; ++s) {
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    world->barrier();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  out.step_s = times[times.size() / 2];
  return out;
}

/// Per-layer payload bytes (docs/tp2d.md) per rank (fp32 activations, fp64 norm statistics) for 2D
/// x × y, or MSP with t = x when y = 0.
Bytes formula(const model::ModelConfig& m, int64_t N, int x, int y) {
  const double H = double(m.hidden_size), Q = double(m.qkv_size()), F = double(m.ffn_size());
  const double d = double(m.head_dim()), A = double(m.num_attention_heads) * d;
  Bytes b;
  if (y == 0) {  // MSP, t = x: AG before wqkv and w1/w3 (fwd), wo and w2 (bwd); RS the others
    b["tensor all_gather"] = 4 * (N / x) * H * 4;
    b["tensor reduce_scatter"] = 4 * N * H * 4;
    b["tensor all_reduce"] = 2 * H * 4;  // norm-weight gradient sums
    return b;
  }
  if (x > 1) {  // wqkv, w1/w3 (A = X) AG fwd, RS bwd; wo, w2 (R = X) RS fwd, AG bwd
    b["x all_gather"] = 4 * (N / x) * (H / y) * 4;
    b["x reduce_scatter"] = 4 * N * (H / y) * 4;
    b["x all_reduce"] = 2 * (H / y) * 4;  // norm-weight gradient sums over x
  }
  if (y > 1) {
    b["y reduce_scatter"] = (N * Q / x + 2 * N * F / x + N * A / x + N * F / x) * 4;
    b["y all_gather"] = ((N / y) * (A / x + F / x) + (N / y) * (Q / x + 2 * F / x)) * 4;
    b["y all_reduce"] = 2 * 3 * (N / x) * 8;  // Σx² per norm: fwd, recomputed fwd, bwd
    const double hq = m.num_attention_heads / x / y;
    const double kv_x = double(m.num_kv_attention_heads / x);
    const double hkv = kv_x >= y ? kv_x / y : 1;  // Ulysses repeats kv heads when y > kv per x
    b["y all_to_all"] = 2 * N * d * (2 * hq + 2 * hkv) * 4;
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  longtron::ensure_passive_omp_wait(argv);  // see ops/threads.h: spinning OpenMP workers starve the BLAS
  comm::CommPtr world = comm::init(argc, argv);
  const std::string path = argc > 1 ? argv[1] : "configs/tp_bench.toml";
  const int steps = argc > 2 ? std::stoi(argv[2]) : 5;
  const train::TrainConfig cfg = train::load_config(path);
  model::ModelConfig m = cfg.model;
  const int64_t P = cfg.data.seq_len * cfg.data.micro_bsz;
  const int L = int(m.num_layers);
  const bool root = world->rank() == 0;
  if (root)
    std::printf("model: hidden %lld, heads %lld, kv heads %lld, ffn %lld, vocab %lld, layers %d, "
                "P %lld tokens; %d ranks\n",
                (long long)m.hidden_size, (long long)m.num_attention_heads,
                (long long)m.num_kv_attention_heads, (long long)m.ffn_size(),
                (long long)m.vocab_size, L, (long long)P, world->size());
  struct Case {
    std::string name;
    parallel::Layout layout;
    int x, y;  // for the formula (y = 0: MSP with t = x)
  };
  std::vector<Case> cases;
  {
    parallel::Layout msp;
    msp.tensor_size = world->size();
    msp.tensor_mode = parallel::TensorMode::kMsp;
    cases.push_back({"1D tp" + std::to_string(world->size()) + " msp", msp, world->size(), 0});
  }
  for (const char* o : {"none", "ag_with_matmul", "matmul_with_rs"}) {
    parallel::Layout l;
    l.tensor_2d_x = 2, l.tensor_2d_y = world->size() / 2, l.tensor_2d_overlap = o;
    cases.push_back({std::string("2D x2 y") + std::to_string(world->size() / 2) + " " + o, l, 2,
                     world->size() / 2});
  }
  for (const Case& c : cases) {
    Measured full = measure(m, world, c.layout, P, steps);
    model::ModelConfig less = m;
    less.num_layers = L - 1;
    Measured edge = measure(less, world, c.layout, P, 1);
    const Bytes f = formula(m, P, c.x, c.y);
    // Ranks can differ (uneven shards): report the max over ranks.
    if (root) std::printf("\n%s: step %.3f s (median of %d)\n", c.name.c_str(), full.step_s, steps);
    // The same keys on every rank (the all-reduce below is collective).
    std::vector<std::string> keys;
    for (const char* g : {"tensor", "x", "y"})
      for (int k = 0; k < comm::kNumKinds; ++k)
        keys.push_back(std::string(g) + " " + comm::kind_name(comm::Kind(k)));
    for (const std::string& k : keys) {
      double v[3] = {full.bytes[k] - edge.bytes[k], edge.bytes[k] - (L - 1) * (full.bytes[k] - edge.bytes[k]),
                     full.bytes[k]};
      world->all_reduce(v, 3, comm::ReduceOp::kMax);
      const double want = f.count(k) ? f.at(k) : 0.0;
      if (root && (v[2] > 0 || want > 0))
        std::printf("  %-22s per layer %10.0f B (formula %10.0f, %s)  edges %10.0f B  step total "
                    "%10.0f B\n",
                    k.c_str(), v[0], want, v[0] == want ? "equal" : "DIFFERS", v[1], v[2]);
    }
  }
  world.reset();
  comm::finalize();
  return 0;
}
