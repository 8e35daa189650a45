// The base fingerprint of a LoRA checkpoint (train/peft.h, docs/lora.md): base_fingerprint over a
// 1 GiB weights file (page-cached after the first pass), against reading the same bytes once (a
// 64-bit sum over the memory-mapped file, same threads). Rates are bytes per wall-clock second.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "train/peft.h"

namespace fs = std::filesystem;

namespace {

constexpr size_t kBytes = size_t{1} << 30;

struct Folder {
  fs::path dir;
  Folder() {
    dir = fs::temp_directory_path() / ("longtron_bench_fingerprint_" + std::to_string(getpid()));
    fs::create_directories(dir);
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    std::mt19937_64 g(1);
    std::vector<uint64_t> block(1 << 20);
    for (size_t written = 0; written < kBytes; written += block.size() * 8) {
      for (auto& w : block) w = g();
      out.write(reinterpret_cast<const char*>(block.data()), std::streamsize(block.size() * 8));
    }
  }
  ~Folder() { fs::remove_all(dir); }
};

Folder& folder() {
  static Folder f;
  return f;
}

void BM_BaseFingerprint(benchmark::State& state) {
  const std::string dir = folder().dir.string();
  for (auto _ : state) benchmark::DoNotOptimize(longtron::train::base_fingerprint(dir));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kBytes));
}

void BM_ReadOnce(benchmark::State& state) {
  const fs::path file = folder().dir / "model.safetensors";
  for (auto _ : state) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    void* map = ::mmap(nullptr, kBytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    const auto* w = static_cast<const uint64_t*>(map);
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (int64_t i = 0; i < int64_t(kBytes / 8); ++i) sum += w[i];
    benchmark::DoNotOptimize(sum);
    ::munmap(map, kBytes);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kBytes));
}

}  // namespace

BENCHMARK(BM_BaseFingerprint)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_ReadOnce)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK_MAIN();
