// Read-only memory mapping of a whole file (the tokenized readers never copy their data).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace longtron::data {

/// A file mapped read-only into memory for the object's lifetime. An empty file maps to
/// data() == nullptr, size() == 0. Move-only.
class MappedFile {
 public:
  /// Maps `path`. Throws Error naming the file if it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace longtron::data
