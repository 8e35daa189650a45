// LoRA against full fine-tuning (docs/lora.md, "Memory and speed"), one process:
//   bench_lora speed [--rounds 6] [--threads 2] [--dtype fp32|bf16] [--only full|lora]
//                    [--dropout P]
//     configs/small.toml's model (V 8192, H 384, 6 layers, 6 / 2 heads, P = 4 × 512), LoRA rank 16
//     on every linear against full fine-tuning, fp32 and bf16 (if the CPU has native bf16): each
//     round times one full step then one LoRA step (train::train_step, the trainer's step, in the
//     trainer's scopes), on the same rows (LoRA dropout P, default 0); prints the median step times and their ratio, the
//     median CPU time of each (all threads; includes OpenMP's idle spinning unless
//     OMP_WAIT_POLICY=passive) and the ratio of the fastest rounds. --dtype fp32|bf16 runs one
//     type, --only full|lora times one kind (for a profiler).
//   bench_lora memory full|lora [--steps 3] [--threads 2]
//     bf16, dropout 0, P = 2048, a Llama of hidden 1024, 8 layers, 16 / 8 heads, vocab 32000, no
//     checkpoint saving: the peak resident set of the training steps (VmHWM reset after set-up
//     through /proc/self/clear_refs), LoRA rank 16 on every linear with a bf16 base (the trainer's
//     default under bf16) or full fine-tuning. Run each in its own process.
// Timings on a shared machine are noisy: compare ratios measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "modes/engine.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"
#include "parallel/layout.h"
#include "train/optimizer.h"
#include "train/step.h"

using namespace longtron;

namespace {

data::MicroBatch random_row(int64_t P, int64_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  data::MicroBatch b;
  b.cu_seqlens.push_back(0);
  while (b.cu_seqlens.back() < P) {
    int32_t len = std::uniform_int_distribution<int32_t>(50, 600)(gen);
    len = std::min<int32_t>(len, int32_t(P) - b.cu_seqlens.back());
    b.cu_seqlens.push_back(b.cu_seqlens.back() + len);
    b.max_seqlen = std::max(b.max_seqlen, len);
    for (int32_t i = 0; i < len; ++i) {
      b.input_ids.push_back(std::uniform_int_distribution<int32_t>(0, int32_t(vocab) - 1)(gen));
      b.indexes.push_back(i);
    }
  }
  b.labels.resize(b.input_ids.size());
  for (size_t i = 0; i + 1 < b.labels.size(); ++i) b.labels[i] = b.input_ids[i + 1];
  b.labels.back() = data::kIgnoreIndex;
  return b;
}

struct Job {
  std::unique_ptr<parallel::ParallelEngine> engine;
  std::unique_ptr<train::AdamW> adam;
};

Job make_job(const model::ModelConfig& c, bool bf16) {
  parallel::Grid grid =
      parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  Job j;
  j.engine = std::make_unique<parallel::ParallelEngine>(c, grid, 1);
  if (c.lora.enabled() && bf16) j.engine->freeze_lora_base(model::LoraBaseStorage::kBFloat16);
  train::OptimizerConfig o;
  o.lr = 1e-4;
  j.adam = std::make_unique<train::AdamW>(j.engine->train_layout(), o);
  return j;
}

/// The CPU time of the process so far (every thread), seconds.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/// The wall time of one step; `cpu` receives its CPU time (all threads, idle spinning included).
double step(Job& j, const std::vector<data::MicroBatch>& rows, bool bf16, double* cpu = nullptr) {
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  if (j.engine->compute().bf16() != bf16)
    j.engine->set_compute_type(bf16 ? ops::ComputeType::kBFloat16 : ops::ComputeType::kFloat32);
  train::StepOptions so;
  so.lr = 1e-4;
  so.clip_grad_norm = 1.0;
  train::train_step(*j.engine, *j.adam, rows, so);
  if (cpu) *cpu = cpu_seconds() - c0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

std::string arg_str(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "speed";
  set_num_threads(arg_int(argc, argv, "--threads", 2));
  if (what == "speed") {
    model::ModelConfig c;  // configs/small.toml
    c.vocab_size = 8192;
    c.hidden_size = 384;
    c.num_layers = 6;
    c.num_attention_heads = 6;
    c.num_kv_attention_heads = 2;
    const int rounds = arg_int(argc, argv, "--rounds", 6);
    const std::vector<data::MicroBatch> rows = {random_row(2048, c.vocab_size, 3)};
    const bool native = ops::cpu_has_avx512_bf16() && ops::gemm_backend().native_bf16;
    // --dtype fp32|bf16 runs one type; --only full|lora times one kind (for a profiler).
    const std::string dtype = arg_str(argc, argv, "--dtype", ""), only = arg_str(argc, argv, "--only", "");
    for (bool bf16 : {false, true}) {
      if (bf16 && !native) continue;
      if (!dtype.empty() && dtype != (bf16 ? "bf16" : "fp32")) continue;
      model::ModelConfig l = c;
      l.lora.rank = 16;
      l.lora.alpha = 32;
      l.lora.dropout = std::stod(arg_str(argc, argv, "--dropout", "0"));
      Job full = make_job(c, bf16), lora = make_job(l, bf16);
      const bool run_full = only != "lora", run_lora = only != "full";
      if (run_full) step(full, rows, bf16);  // warm-up (workspaces, primitives)
      if (run_lora) step(lora, rows, bf16);
      std::vector<double> tf, tl, cf(static_cast<size_t>(rounds)), cl(static_cast<size_t>(rounds));
      for (int r = 0; r < rounds; ++r) {
        tf.push_back(run_full ? step(full, rows, bf16, &cf[size_t(r)]) : 0.0);
        tl.push_back(run_lora ? step(lora, rows, bf16, &cl[size_t(r)]) : 0.0);
      }
      std::printf("%s: full fine-tuning %.3f s/step, LoRA r16 all linears (dropout %g) %.3f "
                  "s/step (median of %d alternating rounds): ratio %.3f\n",
                  bf16 ? "bf16" : "fp32", median(tf), l.lora.dropout, median(tl), rounds, median(tl) / median(tf));
      std::printf("  CPU time: full %.3f s/step, LoRA %.3f s/step (medians): ratio %.3f; fastest "
                  "rounds: ratio %.3f\n",
                  median(cf), median(cl), median(cl) / median(cf),
                  *std::min_element(tl.begin(), tl.end()) / *std::min_element(tf.begin(), tf.end()));
      for (int r = 0; r < rounds; ++r)
        std::printf("  round %d: full %.3f s (CPU %.3f s), LoRA %.3f s (CPU %.3f s)\n", r,
                    tf[size_t(r)], cf[size_t(r)], tl[size_t(r)], cl[size_t(r)]);
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "memory") {
    const bool lora = argc > 2 && std::strcmp(argv[2], "lora") == 0;
    model::ModelConfig c;
    c.type = "llama";
    c.vocab_size = 32000;
    c.hidden_size = 1024;
    c.num_layers = 8;
    c.num_attention_heads = 16;
    c.num_kv_attention_heads = 8;
    if (lora) {
      c.lora.rank = 16;
      c.lora.alpha = 32;
    }
    const int steps = arg_int(argc, argv, "--steps", 3);
    const std::vector<data::MicroBatch> rows = {random_row(2048, c.vocab_size, 3)};
    Job j = make_job(c, /*bf16=*/true);
    { std::ofstream("/proc/self/clear_refs") << "5"; }  // reset VmHWM: the steps' peak from here
    const int64_t setup = vm_hwm_bytes();
    double t = 0;
    for (int s = 0; s < steps; ++s) t += step(j, rows, true);
    std::printf("%s: peak RSS of %d training steps %.1f MiB (RSS after set-up %.1f MiB), %.2f "
                "s/step\n",
                lora ? "LoRA r16 all linears, bf16 base" : "full fine-tuning", steps,
                double(vm_hwm_bytes()) / (1 << 20), double(setup) / (1 << 20), t / steps);
    std::fflush(stdout);
    return 0;
  }
  std::fprintf(stderr, "usage: bench_lora speed|memory [full|lora]\n");
  return 2;
}
