// .npy format: "\x93NUMPY", u8 major, u8 minor, header length (u16 for v1, u32 for v2/v3), then an
// ASCII Python dict {'descr': '<i8', 'fortran_order': False, 'shape': (N, 2), } padded with spaces
// and a newline so the data starts on a 64-byte boundary (numpy/lib/format.py).
#include "data/npy.h"

#include <charconv>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/io_error.h"
#include "core/shorten.h"
#include "data/mapped_file.h"

namespace longtron::data {

namespace {

// A strict reader of the header dict numpy writes: {'descr': '<i8', 'fortran_order': False,
// 'shape': (3, 2), } with any whitespace, either quote, keys in any order, each exactly once.
// numpy itself reads it with ast.literal_eval; anything else here is an error naming the byte.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, size_t base, const std::string& file)
      : text_(text), base_(base), file_(file) {}

  struct Dict {
    std::string descr;
    bool fortran_order = false;
    std::vector<int64_t> shape;
  };

  Dict parse() {
    Dict dict;
    bool seen[3] = {false, false, false};
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      const std::string key = quoted();
      skip_ws();
      expect(':');
      skip_ws();
      const int slot = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
      if (slot < 0) bad(fmt::format("unknown key '{}'", shorten(key)));
      if (seen[slot]) bad(fmt::format("key '{}' given twice", key));
      seen[slot] = true;
      if (slot == 0) dict.descr = quoted();
      if (slot == 1) dict.fortran_order = boolean();
      if (slot == 2) dict.shape = tuple();
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_ws();
      if (peek() != '}') bad("expected ',' or '}'");
    }
    ++pos_;
    skip_ws();
    if (pos_ != text_.size()) bad("text after the closing '}'");
    for (int k = 0; k < 3; ++k)
      if (!seen[k]) bad(fmt::format("no '{}'", k == 0 ? "descr" : k == 1 ? "fortran_order" : "shape"));
    return dict;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: byte offset {}: malformed .npy header: {}", file_, base_ + pos_, what);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) bad(fmt::format("expected '{}'", c));
    ++pos_;
  }
  std::string quoted() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    const size_t close = text_.find(q, pos_ + 1);
    if (close == std::string_view::npos) bad("unterminated string");
    std::string out(text_.substr(pos_ + 1, close - pos_ - 1));
    pos_ = close + 1;
    return out;
  }
  bool boolean() {
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const std::string_view w(word);
      if (text_.substr(pos_, w.size()) == w) {
        pos_ += w.size();
        return value;
      }
    }
    bad("expected True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> out;
    expect('(');
    while (true) {
      skip_ws();
      if (peek() == ')') break;
      int64_t value = 0;
      const auto [next, ec] = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), value);
      if (ec != std::errc() || next == text_.data() + pos_ || value < 0)
        bad("expected a non-negative dimension that fits 64 bits");
      pos_ = size_t(next - text_.data());
      out.push_back(value);
      skip_ws();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') bad("expected ',' or ')' in the shape");
    }
    ++pos_;
    return out;
  }

  std::string_view text_;
  size_t base_;
  const std::string& file_;
  size_t pos_ = 0;
};

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
  check(header_len <= n - header_start,
        "{}: byte offset {}: .npy header of {} bytes runs past the end of the {}-byte file", file,
        header_start, header_len, n);
  const std::string_view header(reinterpret_cast<const char*>(p + header_start), header_len);
  check(!header.empty() && header.back() == '\n',
        "{}: byte offset {}: .npy header does not end with a newline", file,
        header_start + header_len - (header_len > 0 ? 1 : 0));
  const auto dict = HeaderParser(header, header_start, file).parse();
  const bool int64 = dict.descr == "<i8";
  const bool int32 = dict.descr == "<i4";
  check(int64 || int32, "{}: .npy dtype '{}' is not '<i4' or '<i8' (little-endian int32/int64)", file,
        shorten(dict.descr));
  check(!dict.fortran_order, "{}: .npy array is in Fortran order, expected C order", file);
  check(dict.shape.size() == 2, "{}: .npy array has {} dimensions, expected 2 ((N, 2) or (N, 3))",
        file, dict.shape.size());
  NpyIntMatrix matrix{dict.shape[0], dict.shape[1], {}};
  const size_t elem = int64 ? 8 : 4;
  const size_t data_start = header_start + header_len;
  const uint64_t have = n - data_start;
  uint64_t need = 0;
  const bool fits = !__builtin_mul_overflow(uint64_t(matrix.rows), uint64_t(matrix.cols), &need) &&
                    !__builtin_mul_overflow(need, uint64_t(elem), &need);
  check(fits && need == have,
        "{}: byte offset {}: .npy data holds {} bytes, shape ({}, {}) of {} needs {}", file,
        data_start, have, matrix.rows, matrix.cols, dict.descr,
        fits ? std::to_string(need) : std::string("more than 2^64"));
  const size_t count = need / elem;
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
  check(!out.fail(), "{}: write failed ({})", path.string(), io_error_text());
}

}  // namespace longtron::data
