// An in-memory DocumentSource: documents held as vectors. For tests, examples and small tools; the
// packer cannot tell it from a memory-mapped file.
#pragma once
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"

namespace longtron::data {

/// Documents given as token vectors (ids as stored: negative = input without loss, docs/data.md).
/// `name` stands in for the file path in error messages.
class MemorySource : public DocumentSource {
 public:
  explicit MemorySource(std::vector<std::vector<int32_t>> documents,
                        std::filesystem::path name = "<memory>")
      : documents_(std::move(documents)), name_(std::move(name)) {}

  size_t num_documents() const override { return documents_.size(); }
  size_t document_length(size_t i) const override { return documents_.at(i).size(); }
  void read_tokens(size_t i, size_t begin, size_t count, int32_t* out) const override {
    const auto& doc = documents_.at(i);
    check(begin <= doc.size() && count <= doc.size() - begin,
          "{}: document {} has {} tokens, asked for [{}, {})", name_.string(), i, doc.size(),
          begin, begin + count);
    if (count > 0) std::memcpy(out, doc.data() + begin, count * sizeof(int32_t));
  }
  const std::filesystem::path& path() const override { return name_; }

 private:
  std::vector<std::vector<int32_t>> documents_;
  std::filesystem::path name_;
};

}  // namespace longtron::data
