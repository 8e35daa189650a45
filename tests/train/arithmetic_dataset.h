// A learnable synthetic corpus for the trainer tests: arithmetic runs a, a+s, a+2s, … (mod 60,
// ids 2…61) of random start, stride and length, written as a Megatron dataset at dir/data.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include "data/megatron.h"

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

}  // namespace longtron::testing
