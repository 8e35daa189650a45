// Synthetic corpora of document lengths only, for the balance benchmarks: packing plans and
// context assignments read cu_seqlens, never tokens.
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "data/dataset.h"

namespace longtron::bench {

/// Documents of given lengths whose tokens all read as 1.
class LengthSource : public data::DocumentSource {
 public:
  explicit LengthSource(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {}
  size_t num_documents() const override { return lengths_.size(); }
  size_t document_length(size_t i) const override { return static_cast<size_t>(lengths_[i]); }
  void read_tokens(size_t, size_t, size_t count, int32_t* out) const override {
    std::fill(out, out + count, 1);
  }
  const std::filesystem::path& path() const override { return name_; }

 private:
  std::vector<int64_t> lengths_;
  std::filesystem::path name_ = "<exponential>";
};

/// One file of exponential lengths (mean `mean`, at least 1) holding >= `tokens` tokens.
inline data::Dataset exponential(double mean, int64_t tokens, uint32_t seed) {
  std::mt19937_64 g(seed);
  std::exponential_distribution<double> e(1.0 / mean);
  std::vector<int64_t> lengths;
  for (int64_t total = 0; total < tokens;) {
    lengths.push_back(1 + static_cast<int64_t>(e(g)));
    total += lengths.back();
  }
  data::Dataset d;
  d.push_back(std::make_unique<LengthSource>(std::move(lengths)));
  return d;
}

}  // namespace longtron::bench
