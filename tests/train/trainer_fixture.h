// Shared by the trainer tests: a learnable synthetic corpus (arithmetic runs a, a+s, a+2s, … mod 60,
// ids 2…61, of random start, stride and length, written as a Megatron dataset at dir/data) and a
// quiet one-process run of the trainer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "data/megatron.h"
#include "train/trainer.h"

namespace longtron::testing {

/// `documents` runs of 8 … 8 + max_extra_length − 1 tokens, from `seed`.
inline void write_arithmetic_dataset(const std::filesystem::path& dir, int documents, uint32_t seed,
                                     int max_extra_length) {
  std::filesystem::create_directories(dir);
  data::MegatronWriter w(dir / "data", data::MegatronDtype::kInt32);
  std::mt19937 rng(seed);
  for (int d = 0; d < documents; ++d) {
    const int start = static_cast<int>(rng() % 60), stride = 1 + static_cast<int>(rng() % 3);
    const int len = 8 + static_cast<int>(rng() % max_extra_length);
    std::vector<int32_t> ids;
    for (int i = 0; i < len; ++i) ids.push_back(2 + (start + i * stride) % 60);
    w.add_document(ids.data(), ids.size());
  }
  w.finish();
}

/// Trainer options for tests: no console, no progress bar, a small start-up GEMM timing.
inline train::TrainOptions quiet() {
  train::TrainOptions o;
  o.console = false;
  o.progress = false;
  o.sgemm_size = 128;
  return o;
}

/// run_training on one process.
inline train::TrainSummary train_run(const train::TrainConfig& c, const train::TrainOptions& o) {
  return train::run_training(c, o, comm::make_local_communicator());
}

}  // namespace longtron::testing
