// .npy format: "\x93NUMPY", u8 major, u8 minor, header length (u16 for v1, u32 for v2/v3), then an
// ASCII Python dict {'descr': '<i8', 'fortran_order': False, 'shape': (N, 2), } padded with spaces
// and a newline so the data starts on a 64-byte boundary (numpy/lib/format.py).
#include "data/npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <string>

#include "core/error.h"
#include "data/mapped_file.h"

namespace longtron::data {

namespace {

// The value text of `key` in the header dict, e.g. "'<i8'" or "(3, 2)" or "False".
std::string dict_value(const std::string& header, const std::string& key, const std::string& file) {
  const std::regex pattern("['\"]" + key + "['\"]\\s*:\\s*('[^']*'|\"[^\"]*\"|\\([^)]*\\)|\\w+)");
  std::smatch match;
  check(std::regex_search(header, match, pattern), "{}: byte offset 10: .npy header has no '{}'",
        file, key);
  return match[1].str();
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& file) {
  std::vector<int64_t> shape;
  const std::regex number("\\d+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator();
       ++it)
    shape.push_back(std::stoll(it->str()));
  check(shape.size() == 2, "{}: byte offset 10: .npy shape {} is not 2-D (expected (N, 2) or (N, 3))",
        file, text);
  return shape;
}

}  // namespace

NpyIntMatrix read_npy_int_matrix(const std::filesystem::path& path) {
  const MappedFile mapped(path);
  const std::string file = path.string();
  const uint8_t* p = mapped.data();
  const size_t n = mapped.size();
  check(n >= 10 && std::memcmp(p, "\x93NUMPY", 6) == 0,
        "{}: byte offset 0: not a .npy file (expected magic \\x93NUMPY)", file);
  const uint8_t major = p[6];
  check(major >= 1 && major <= 3, "{}: byte offset 6: unsupported .npy version {}", file, major);
  size_t header_len = 0, header_start = 10;
  if (major == 1) {
    header_len = static_cast<size_t>(p[8]) | (static_cast<size_t>(p[9]) << 8);
  } else {
    check(n >= 12, "{}: truncated .npy header", file);
    uint32_t len;
    std::memcpy(&len, p + 8, 4);
    header_len = len;
    header_start = 12;
  }
  check(header_start + header_len <= n, "{}: byte offset {}: .npy header of {} bytes runs past the end",
        file, header_start, header_len);
  const std::string header(reinterpret_cast<const char*>(p + header_start), header_len);
  const std::string descr = dict_value(header, "descr", file);
  const bool int64 = descr == "'<i8'" || descr == "\"<i8\"";
  const bool int32 = descr == "'<i4'" || descr == "\"<i4\"";
  check(int64 || int32, "{}: .npy dtype {} is not '<i4' or '<i8' (little-endian int32/int64)", file,
        descr);
  check(dict_value(header, "fortran_order", file) == "False",
        "{}: .npy array is in Fortran order, expected C order", file);
  const auto shape = parse_shape(dict_value(header, "shape", file), file);
  NpyIntMatrix matrix{shape[0], shape[1], {}};
  const size_t elem = int64 ? 8 : 4;
  const size_t data_start = header_start + header_len;
  const auto count = static_cast<size_t>(matrix.rows * matrix.cols);
  check(count <= (n - data_start) / elem,
        "{}: byte offset {}: .npy data holds {} bytes, shape ({}, {}) needs {}", file, data_start,
        n - data_start, matrix.rows, matrix.cols, count * elem);
  matrix.values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (int64) {
      std::memcpy(&matrix.values[i], p + data_start + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, p + data_start + 4 * i, 4);
      matrix.values[i] = v;
    }
  }
  return matrix;
}

void write_npy_int_matrix(const std::filesystem::path& path, const std::vector<int64_t>& values,
                          int64_t rows, int64_t cols, bool int64) {
  check(static_cast<int64_t>(values.size()) == rows * cols, "{}: {} values for shape ({}, {})",
        path.string(), values.size(), rows, cols);
  std::string header = std::string("{'descr': '") + (int64 ? "<i8" : "<i4") +
                       "', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  check(out.good(), "{}: cannot open for writing", path.string());
  const auto len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(len & 0xff));
  out.put(static_cast<char>(len >> 8));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (int64_t v : values) {
    if (int64) {
      out.write(reinterpret_cast<const char*>(&v), 8);
    } else {
      const auto v32 = static_cast<int32_t>(v);
      out.write(reinterpret_cast<const char*>(&v32), 4);
    }
  }
  out.close();
  check(!out.fail(), "{}: write failed", path.string());
}

}  // namespace longtron::data
