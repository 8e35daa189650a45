// Packing throughput (docs/benchmarks.md): packed micro-batches built single-threaded from a
// memory-mapped Megatron dataset (uint16 tokens) of >= 100M tokens written to a temp folder.
// Rates are per wall-clock second (UseRealTime). Reports rows/s, tokens/s and `x1M_tok_per_s` (the
// token rate as a multiple of 1M tokens/s; the target is >= 50). Rows are visited in the sampler's
// shuffled order, as training does.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "data/megatron.h"
#include "data/memory_source.h"
#include "packing/pack.h"
#include "packing/sampler.h"

namespace fs = std::filesystem;
using namespace longtron::data;

namespace {

constexpr int64_t kTokens = 100'000'000;

// Documents of 16..8191 tokens (log-uniform-ish, like a web corpus), random ids < 65000.
struct BenchData {
  fs::path dir;
  std::unique_ptr<DocumentSource> source;
  std::unique_ptr<DocumentSource> memory;  // the same documents as int32 vectors (reader baseline)
  BenchData() {
    std::vector<std::vector<int32_t>> docs;
    dir = fs::temp_directory_path() / ("longtron_bench_pack_" + std::to_string(getpid()));
    fs::create_directories(dir);
    MegatronWriter writer(dir / "data", MegatronDtype::kUint16);
    std::mt19937 g(1);
    std::vector<int32_t> doc;
    for (int64_t written = 0; written < kTokens;) {
      const int shift = std::uniform_int_distribution<int>(4, 12)(g);
      doc.resize(std::uniform_int_distribution<int>(1 << shift, (2 << shift) - 1)(g));
      for (auto& t : doc) t = static_cast<int32_t>(g() % 65000);
      writer.add_document(doc.data(), doc.size());
      docs.push_back(doc);
      written += static_cast<int64_t>(doc.size());
    }
    writer.finish();
    source = open_megatron(dir / "data");
    memory = std::make_unique<MemorySource>(std::move(docs));
  }
  ~BenchData() { fs::remove_all(dir); }
};

BenchData& data() {
  static BenchData d;
  return d;
}

// Args: seq_len, micro_bsz, pack_sample_into_one, source (0: mapped Megatron uint16, 1: the same
// documents in memory as int32, to tell the packer's cost from the reader's).
void BM_PackedRows(benchmark::State& state) {
  const DocumentSource& src = state.range(3) == 0 ? *data().source : *data().memory;
  PackConfig c;
  c.seq_len = state.range(0);
  c.micro_bsz = state.range(1);
  c.pack_sample_into_one = state.range(2) != 0;
  PackedRows rows(src, document_order(src, 0, true, 1024), c);
  StaticBatchSampler sampler(rows.num_rows(), 1, 1, true, 1024);
  MicroBatch mb;
  int64_t step = 0, made = 0;
  for (auto _ : state) {
    rows.row_into(sampler.rows(0, step)[0], mb);
    benchmark::DoNotOptimize(mb.input_ids.data());
    benchmark::DoNotOptimize(mb.labels.data());
    step = (step + 1) % sampler.steps_per_epoch();
    ++made;
  }
  const double tokens = static_cast<double>(made) * static_cast<double>(c.packed_length());
  state.counters["rows_per_s"] = benchmark::Counter(static_cast<double>(made), benchmark::Counter::kIsRate);
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["x1M_tok_per_s"] = benchmark::Counter(tokens / 1e6, benchmark::Counter::kIsRate);
  state.counters["dataset_tokens"] = static_cast<double>(rows.num_tokens());
}

// Baseline for a ratio measured in the same run: copying the same number of
// int32 tokens from random offsets of a 400 MB buffer with memcpy.
void BM_MemcpyBaseline(benchmark::State& state) {
  static std::vector<int32_t> big(kTokens, 1);
  const int64_t P = state.range(0);
  std::vector<int32_t> out(P);
  std::mt19937_64 g(1);
  int64_t made = 0;
  for (auto _ : state) {
    const int64_t at = static_cast<int64_t>(g() % static_cast<uint64_t>(kTokens - P));
    std::memcpy(out.data(), big.data() + at, P * sizeof(int32_t));
    benchmark::DoNotOptimize(out.data());
    ++made;
  }
  const double tokens = static_cast<double>(made) * static_cast<double>(P);
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["x1M_tok_per_s"] = benchmark::Counter(tokens / 1e6, benchmark::Counter::kIsRate);
}

BENCHMARK(BM_MemcpyBaseline)->Arg(4096)->Arg(8192)->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK(BM_PackedRows)->Args({4096, 1, 0, 0})->Args({2048, 4, 0, 0})->Args({32768, 1, 0, 0})
    ->Args({2048, 4, 1, 0})->Args({2048, 4, 0, 1})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
