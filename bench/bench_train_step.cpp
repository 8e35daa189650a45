// A full training step of configs/small.toml (docs/benchmarks.md): the trainer's own loop
// (micro-batches from the sampler, forward+backward, gradient-norm clipping, AdamW) on a random
// dataset of documents with exponential lengths (mean 300 tokens, seeded), written to a temporary
// Megatron dataset. Reports step time, tokens/s, MFU (docs/training.md: model FLOPs ÷ step time ÷
// the GEMM FLOP/s of the dtype, measured by the trainer at start-up) and peak RSS, in float32 and in
// bfloat16 (model.dtype) with their ratio; then the peak RSS of one step at P = 2048, 4096 and 8192
// (seq_len 512 × micro_bsz 4, 8, 16) in each dtype, each in a fresh process, so the per-token
// growth shows whether anything grows with P², with the memory plan's peak (train --dry-run) for
// each and the bfloat16 / float32 ratio of the peak at P = 8192.
//
// Usage: bench_train_step [--steps N] [--config FILE]   (threads: train.num_threads, 0 = all)
//        bench_train_step --child MICRO_BSZ STEPS CONFIG DTYPE [MEAN_DOC_LEN]   (one run; prints
//        one line; documents of mean length 300 unless MEAN_DOC_LEN)
//        bench_train_step --write-dataset DIR VOCAB TOKENS MEAN_DOC_LEN   (the same random
//        documents as a Megatron dataset DIR/random.{bin,idx}, for bench/bench_balance_time.sh)
#include <fmt/core.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/megatron.h"
#include "ops/threads.h"
#include "train/config.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace longtron;

namespace {

/// Random documents (ids 3…vocab-1, exponential lengths of mean `mean`, at least 2) until
/// `tokens` are written.
void write_random_dataset(const fs::path& dir, int64_t vocab, int64_t tokens, uint64_t seed,
                          double mean) {
  fs::create_directories(dir);
  data::MegatronWriter w(dir / "random", data::MegatronDtype::kUint16);
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> length(1.0 / mean);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> doc;
  for (int64_t written = 0; written < tokens;) {
    doc.resize(static_cast<size_t>(std::max<int64_t>(2, std::llround(length(rng)))));
    for (auto& t : doc) t = id(rng);
    w.add_document(doc.data(), doc.size());
    written += static_cast<int64_t>(doc.size());
  }
  w.finish();
}

/// CPU seconds of all threads of this process (on a shared machine a fairer clock than the wall).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// One run of `steps` steps in `dtype`; prints "P rss_mib median_step_s median_tgs median_mfu
/// gemm_gflops plan_mib cpu_s_per_step" (the GEMM rate of the dtype, the memory plan's peak; CPU
/// seconds of the whole run_training, start-up and first step included, ÷ steps: an upper bound on a
/// step's). Documents have mean length `mean`.
int child(int64_t micro_bsz, int64_t steps, const std::string& config_path, const std::string& dtype,
          double mean) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("longtron_bench_{}", getpid());
  train::TrainConfig c = train::load_config(config_path, {}, {.model_shape = true, .data = false});
  c.data.train_folder = (dir / "train").string();
  c.data.valid_folder.clear();
  c.data.micro_bsz = micro_bsz;
  c.train.total_steps = steps;
  c.train.checkpoint_dir.clear();
  c.train.metrics_file.clear();
  c.model.dtype = dtype;
  const int64_t P = c.data.seq_len * micro_bsz;
  write_random_dataset(dir / "train", c.model.vocab_size, P * c.data.micro_num * (steps + 2), 2024,
                       mean);
  train::TrainOptions o;
  o.console = false;
  o.progress = false;
  const double cpu0 = process_cpu_seconds();
  const train::TrainSummary s = train::run_training(c, o, comm::make_local_communicator());
  const double cpu_per_step = (process_cpu_seconds() - cpu0) / double(std::max<int64_t>(1, steps));
  fs::remove_all(dir);
  std::vector<double> t, tgs, mfu;
  // The first step pays for allocating the workspace: leave it out when there are others.
  for (size_t i = s.rows.size() > 1 ? 1 : 0; i < s.rows.size(); ++i) {
    t.push_back(s.rows[i].step_time_s);
    tgs.push_back(s.rows[i].tgs);
    mfu.push_back(s.rows[i].mfu);
  }
  fmt::print("{} {:.1f} {:.4f} {:.1f} {:.4f} {:.1f} {:.1f} {:.4f}\n", P, peak_rss_mib(), median(t),
             median(tgs), median(mfu),
             (s.dtype == "bfloat16" ? s.bf16_gemm_flops : s.sgemm_flops) * 1e-9,
             s.planned_peak_bytes / 1048576.0, cpu_per_step);
  return 0;
}

std::vector<double> run_child(const std::string& self, int64_t micro_bsz, int64_t steps,
                              const std::string& config, const std::string& dtype) {
  const std::string cmd =
      fmt::format("'{}' --child {} {} '{}' {}", self, micro_bsz, steps, config, dtype);
  std::FILE* pipe = popen(cmd.c_str(), "r");
  std::vector<double> v(8, 0.0);
  if (pipe == nullptr) return v;
  char line[512] = {};
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::vector<double> parsed(8, 0.0);
    if (std::sscanf(line, "%lf %lf %lf %lf %lf %lf %lf %lf", &parsed[0], &parsed[1], &parsed[2],
                    &parsed[3], &parsed[4], &parsed[5], &parsed[6], &parsed[7]) == 8)
      v = parsed;
  }
  pclose(pipe);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  longtron::ensure_passive_omp_wait(argv);  // see ops/threads.h: spinning OpenMP workers starve the BLAS
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 5 && args[0] == "--write-dataset") {
    write_random_dataset(args[1], std::atoll(args[2].c_str()), std::atoll(args[3].c_str()), 2024,
                         std::atof(args[4].c_str()));
    return 0;
  }
  if ((args.size() == 5 || args.size() == 6) && args[0] == "--child")
    return child(std::atoll(args[1].c_str()), std::atoll(args[2].c_str()), args[3], args[4],
                 args.size() == 6 ? std::atof(args[5].c_str()) : 300.0);
  int64_t steps = 6;
  std::string config = "configs/small.toml";
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--steps") steps = std::atoll(args[i + 1].c_str());
    if (args[i] == "--config") config = args[i + 1];
  }
  const std::string self = fs::canonical("/proc/self/exe").string();
  const char* dtypes[2] = {"float32", "bfloat16"};
  std::vector<double> runs[2];
  for (int k = 0; k < 2; ++k) {
    runs[k] = run_child(self, 4, steps, config, dtypes[k]);
    const auto& r = runs[k];
    fmt::print("full training step of {} in {} (P = {:.0f}, {} steps, first left out): median step "
               "{:.3f} s, {:.0f} tokens/s, MFU {:.3f} (GEMM {:.1f} GFLOP/s), peak RSS {:.1f} MiB\n",
               config, dtypes[k], r[0], steps, r[2], r[3], r[4], r[5], r[1]);
  }
  if (runs[0][3] > 0)
    fmt::print("bfloat16 / float32 tokens/s: {:.2f}\n", runs[1][3] / runs[0][3]);
  for (int k = 0; k < 2; ++k) {
    std::vector<std::vector<double>> mem;
    for (int64_t b : {4, 8, 16}) mem.push_back(run_child(self, b, 1, config, dtypes[k]));
    for (const auto& m : mem)
      fmt::print("  {} P = {:5.0f}: peak RSS {:8.1f} MiB (1 step, {:.2f} s); memory plan {:.1f} "
                 "MiB, plan / measured {:.2f}\n",
                 dtypes[k], m[0], m[1], m[2], m[6], m[1] > 0 ? m[6] / m[1] : 0.0);
    for (size_t i = 1; i < mem.size(); ++i)
      fmt::print("  {} RSS growth P {:.0f} -> {:.0f}: {:.1f} KiB per added token\n", dtypes[k],
                 mem[i - 1][0], mem[i][0], (mem[i][1] - mem[i - 1][1]) * 1024.0 / (mem[i][0] - mem[i - 1][0]));
    runs[k] = mem.back();
  }
  if (runs[0][1] > 0)
    fmt::print("peak RSS at P = {:.0f}, bfloat16 / float32: {:.2f}\n", runs[0][0], runs[1][1] / runs[0][1]);
  return 0;
}
