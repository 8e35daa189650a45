// The NumPy .npy format, for the 2-D integer arrays of InternEvo's .bin.meta files (docs/data.md).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

namespace longtron::data {

/// A 2-D integer array read from a .npy file, widened to int64, row-major.
struct NpyIntMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int64_t> values;  // [rows * cols]
  int64_t at(int64_t r, int64_t c) const { return values[static_cast<size_t>(r * cols + c)]; }
};

/// Parses a .npy (format version 1, 2 or 3) holding a C-order 2-D array of '<i4' or '<i8'.
/// Throws Error naming `path` and the byte offset for a bad magic, a header that is not the dict
/// numpy writes (each of 'descr', 'fortran_order', 'shape' once, nothing else), a dtype other than
/// those, fortran order, a shape that is not 2-D, or data not exactly the size the shape needs.
NpyIntMatrix read_npy_int_matrix(const std::filesystem::path& path);

/// Writes `values` [rows, cols] as a version 1.0 .npy of '<i8' (int64) or '<i4' (int32).
void write_npy_int_matrix(const std::filesystem::path& path, const std::vector<int64_t>& values,
                          int64_t rows, int64_t cols, bool int64 = true);

}  // namespace longtron::data
