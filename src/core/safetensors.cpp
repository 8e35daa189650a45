#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <tuple>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"
#include "core/json_read.h"
#include "core/progress.h"
#include "core/shorten.h"

static_assert(std::endian::native == std::endian::little, "safetensors reading assumes little endian");

namespace longtron::safetensors {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// The reference implementation refuses headers above 100 MB; so do we (a corrupt length would
// otherwise ask for absurd allocations).
constexpr uint64_t kMaxHeader = 100'000'000;
// A valid header nests three levels (header object, tensor entry, shape array). Parsing stops far
// deeper than that but long before a deeply nested value could exhaust the stack of anything that
// walks it recursively (printing, copying, destroying).
constexpr int kMaxDepth = 64;

constexpr struct {
  DType dtype;
  const char* name;
  size_t size;
} kDTypes[] = {{DType::F32, "F32", 4}, {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},
               {DType::F64, "F64", 8}, {DType::I64, "I64", 8},   {DType::I32, "I32", 4}};
}  // namespace

const char* dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

size_t dtype_size(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

DType parse_dtype(std::string_view name, const std::string& context) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  fail("{}: unsupported dtype {} (expected F32, BF16, F16, F64, I64 or I32)", context,
       shorten(name));
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000) << 16;
  const uint32_t exp = (bits >> 10) & 0x1F;
  const uint32_t mant = bits & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant × 2^-24
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_f16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7E00;
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to inf (max half is 65504)
  if (a < 6.103515625e-05f) {               // below the smallest normal: subnormal grid 2^-24
    // nearbyint rounds half to even in the default rounding mode.
    const float m = std::nearbyint(a * 16777216.0f);
    return sign | uint16_t(m);  // m == 1024 yields the smallest normal, which is correct
  }
  const uint32_t ua = std::bit_cast<uint32_t>(a);
  uint32_t exp = (ua >> 23) - 112;
  uint32_t mant = ua & 0x7FFFFF;
  const uint32_t rest = mant & 0x1FFF;
  mant >>= 13;
  if (rest > 0x1000 || (rest == 0x1000 && (mant & 1))) {
    if (++mant == 0x400) {
      mant = 0;
      ++exp;
    }
  }
  return sign | uint16_t(exp << 10) | uint16_t(mant);
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// File

namespace {
// Element count × dtype size of a shape, or false when it does not fit 64 bits.
bool byte_size(const std::vector<int64_t>& shape, DType dtype, uint64_t* bytes) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  *bytes = n;
  return true;
}

TensorInfo parse_entry(const std::string& name, const json& e, uint64_t data_size,
                       const std::string& where) {
  const std::string ctx = where + ": tensor " + shorten(name);
  check(e.is_object(), "{}: header entry is not an object", ctx);
  check(e.contains("dtype") && e["dtype"].is_string(), "{}: missing string 'dtype'", ctx);
  check(e.contains("shape") && e["shape"].is_array(), "{}: missing array 'shape'", ctx);
  check(e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2,
        "{}: missing 'data_offsets' [begin, end]", ctx);
  TensorInfo t;
  t.name = name;
  t.dtype = parse_dtype(e["dtype"].get<std::string>(), ctx);
  for (const auto& d : e["shape"]) {
    check(d.is_number_integer() && d.get<int64_t>() >= 0, "{}: shape has a non-integer or negative "
          "dimension {}", ctx, shorten(d.dump()));
    t.shape.push_back(d.get<int64_t>());
  }
  for (const auto& o : e["data_offsets"])
    check(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
          "{}: data_offsets must be non-negative integers, got {}", ctx,
          shorten(e["data_offsets"].dump()));
  t.begin = e["data_offsets"][0].get<uint64_t>();
  t.end = e["data_offsets"][1].get<uint64_t>();
  check(t.begin <= t.end, "{}: data_offsets [{}, {}] are reversed", ctx, t.begin, t.end);
  check(t.end <= data_size, "{}: data_offsets [{}, {}] lie outside the file's {} data bytes "
        "(truncated file?)", ctx, t.begin, t.end, data_size);
  uint64_t want = 0;
  check(byte_size(t.shape, t.dtype, &want), "{}: shape {} {} is too large (its byte count "
        "overflows 64 bits)", ctx, shorten(shape_string(t.shape)), dtype_name(t.dtype));
  check(t.end - t.begin == want, "{}: {} bytes for shape {} {} but data_offsets span {}", ctx, want,
        shorten(shape_string(t.shape)), dtype_name(t.dtype), t.end - t.begin);
  return t;
}

// Parses the header JSON with its nesting depth bounded and each top-level key seen once (a JSON
// object would otherwise keep the last of two equal keys without a word).
json parse_header(const uint8_t* begin, const uint8_t* end, const std::string& where) {
  std::set<std::string> keys;
  const json::parser_callback_t bound = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxDepth)
      fail("{}: header is nested deeper than {} levels (not a safetensors header)", where,
           kMaxDepth);
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string())
      check(keys.insert(parsed.get<std::string>()).second,
            "{}: tensor {} appears twice in the header", where, shorten(parsed.get<std::string>()));
    return true;
  };
  // nlohmann's lexer takes a NUL for the end of the text: what follows one would go unread.
  if (const void* nul = std::memchr(begin, 0, static_cast<size_t>(end - begin)))
    fail("{}: header holds a NUL byte at byte {} of the header, which JSON does not allow", where,
         static_cast<const uint8_t*>(nul) - begin);
  try {
    return json::parse(begin, end, bound);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", where, shorten(e.what(), 200));
  }
}

// The tensors, sorted by offsets, must cover [0, data_size) exactly once: no overlap, no hole,
// nothing after the last one (the safetensors format's own rule).
void check_tiling(const std::vector<TensorInfo>& sorted, uint64_t data_size,
                  const std::string& where) {
  uint64_t covered = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorInfo& t = sorted[i];
    if (t.begin < covered)  // then i > 0: `covered` is the end of the previous tensor
      fail("{}: tensor {}: data_offsets [{}, {}] overlap tensor {}'s [{}, {}]", where,
           shorten(t.name), t.begin, t.end, shorten(sorted[i - 1].name), sorted[i - 1].begin,
           sorted[i - 1].end);
    check(t.begin == covered, "{}: data bytes [{}, {}) belong to no tensor (a hole before tensor "
          "{})", where, covered, t.begin, shorten(t.name));
    covered = t.end;
  }
  check(covered == data_size, "{}: the file has {} data bytes but its tensors cover {} of them "
        "(truncated header or trailing garbage?)", where, data_size, covered);
}
}  // namespace

File::File(const fs::path& path) : path_(path) {
  const std::string where = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, "{}: cannot open ({})", where, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat", where);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    check(m != MAP_FAILED, "{}: cannot map ({})", where, std::strerror(errno));
    map_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
  try {
    check(size_ >= 8, "{}: file is {} bytes, shorter than the 8-byte header length", where, size_);
    uint64_t n = 0;
    std::memcpy(&n, map_, 8);
    check(n <= kMaxHeader, "{}: header length {} is implausible (not a safetensors file?)", where, n);
    check(8 + n <= size_, "{}: header length {} runs past the end of the {}-byte file (truncated?)",
          where, n, size_);
    data_start_ = 8 + size_t(n);
    const json header = parse_header(map_ + 8, map_ + 8 + n, where);
    check(header.is_object(), "{}: header is not a JSON object", where);
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        check(entry.is_object(), "{}: __metadata__ is not an object", where);
        metadata_ = entry;
        continue;
      }
      tensors_.push_back(parse_entry(name, entry, size_ - data_start_, where));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    check_tiling(tensors_, size_ - data_start_, where);
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    throw;
  }
}

File::~File() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

bool File::contains(const std::string& name) const { return index_.count(name) > 0; }

const TensorInfo& File::info(const std::string& name) const {
  auto it = index_.find(name);
  check(it != index_.end(), "{}: no tensor {}", path_.string(), name);
  return tensors_[it->second];
}

std::span<const uint8_t> File::bytes(const std::string& name) const {
  const TensorInfo& t = info(name);
  return {map_ + data_start_ + t.begin, size_t(t.end - t.begin)};
}

namespace {
template <typename T>
T load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));  // unaligned-safe
  return v;
}
}  // namespace

namespace {
// Decodes n floating values of `dtype` at p into out. Returns the index of the first value that
// is not finite after conversion, or n. `dtype` is a floating type.
size_t decode(DType dtype, const uint8_t* p, size_t n, float* out) {
  uint32_t bad = 0;
  switch (dtype) {
    case DType::F32:
      if (n > 0) std::memcpy(out, p, n * 4);  // an empty tensor's buffer may be null
      for (size_t i = 0; i < n; ++i) bad |= (std::bit_cast<uint32_t>(out[i]) & 0x7F800000u) == 0x7F800000u;
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = load<uint16_t>(p, i);
        out[i] = bf16_to_float(b);
        bad |= (b & 0x7F80u) == 0x7F80u;  // exponent all ones: inf or NaN
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = load<uint16_t>(p, i);
        out[i] = f16_to_float(h);
        bad |= (h & 0x7C00u) == 0x7C00u;
      }
      break;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) {
        out[i] = float(load<double>(p, i));
        bad |= (std::bit_cast<uint32_t>(out[i]) & 0x7F800000u) == 0x7F800000u;
      }
      break;
    default:
      break;
  }
  if (!bad) return n;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i])) return i;
  return n;
}
}  // namespace

void File::read_floats(const std::string& name, std::span<const int64_t> expected_shape, float* out,
                       bool check_shape) const {
  const TensorInfo& t = info(name);
  if (check_shape)
    check(std::equal(t.shape.begin(), t.shape.end(), expected_shape.begin(), expected_shape.end()),
          "{}: tensor {} has shape {} but the model expects {}", path_.string(), name,
          shape_string(t.shape), shape_string(expected_shape));
  read_block(name, 0, t.shape.empty() ? 1 : t.shape[0], 0,
             t.shape.empty() || t.shape[0] == 0 ? 1 : t.numel() / t.shape[0], out);
}

void File::read_block(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                      int64_t cols, float* out) const {
  const TensorInfo& t = info(name);
  check(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16 ||
            t.dtype == DType::F64,
        "{}: tensor {} has dtype {}, expected a floating type (F32, BF16, F16, F64)",
        path_.string(), name, dtype_name(t.dtype));
  const int64_t all_rows = t.shape.empty() ? 1 : t.shape[0];
  const int64_t row_len = all_rows == 0 ? 0 : t.numel() / all_rows;
  check(row0 >= 0 && rows >= 0 && col0 >= 0 && cols >= 0 && row0 + rows <= all_rows &&
            (rows == 0 || cols == 0 || col0 + cols <= row_len),
        "{}: tensor {} {}: block rows [{}, {}) × columns [{}, {}) lies outside it", path_.string(),
        name, shape_string(t.shape), row0, row0 + rows, col0, col0 + cols);
  const size_t es = dtype_size(t.dtype);
  const uint8_t* base = map_ + data_start_ + t.begin;
  const bool whole_rows = col0 == 0 && cols == row_len;  // one contiguous run
  const int64_t runs = whole_rows ? (rows > 0 ? 1 : 0) : rows;
  const int64_t run_len = whole_rows ? rows * cols : cols;
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t first = (row0 + r) * row_len + col0;  // element index in the tensor
    const size_t n = size_t(run_len);
    const size_t bad = decode(t.dtype, base + size_t(first) * es, n, out + r * run_len);
    if (bad < n)
      fail("{}: tensor {} element {} is {} (not finite: a corrupt or diverged checkpoint)",
           path_.string(), shorten(name), first + int64_t(bad), double(out[r * run_len + int64_t(bad)]));
    decoded_ += n * es;
  }
}

template <typename T>
void File::check_finite(const T* values, size_t n, const std::string& name) const {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i]))
      fail("{}: tensor {} element {} is {} (not finite: a corrupt or diverged checkpoint)",
           path_.string(), shorten(name), i, double(values[i]));
}

std::vector<float> File::read_floats(const std::string& name) const {
  std::vector<float> out(size_t(info(name).numel()));
  read_floats(name, {}, out.data(), false);
  return out;
}

std::vector<int64_t> File::read_ints(const std::string& name) const {
  const TensorInfo& t = info(name);
  const uint8_t* p = map_ + data_start_ + t.begin;
  std::vector<int64_t> out(size_t(t.numel()));
  if (t.dtype == DType::I64)
    for (size_t i = 0; i < out.size(); ++i) out[i] = load<int64_t>(p, i);
  else if (t.dtype == DType::I32)
    for (size_t i = 0; i < out.size(); ++i) out[i] = load<int32_t>(p, i);
  else
    fail("{}: tensor {} has dtype {}, expected I64 or I32", path_.string(), name,
         dtype_name(t.dtype));
  return out;
}

std::vector<double> File::read_doubles(const std::string& name) const {
  const TensorInfo& t = info(name);
  const uint8_t* p = map_ + data_start_ + t.begin;
  std::vector<double> out(size_t(t.numel()));
  if (t.dtype == DType::F64)
    for (size_t i = 0; i < out.size(); ++i) out[i] = load<double>(p, i);
  else if (t.dtype == DType::F32)
    for (size_t i = 0; i < out.size(); ++i) out[i] = load<float>(p, i);
  else
    fail("{}: tensor {} has dtype {}, expected F64 or F32", path_.string(), name,
         dtype_name(t.dtype));
  check_finite(out.data(), out.size(), name);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reader (single file, folder, or sharded folder)

Reader::Reader(const fs::path& path, const std::string& stem) : path_(path) {
  const std::string where = path.string();
  check(fs::exists(path), "{}: no such file or folder", where);
  auto add_file = [&](const fs::path& p) {
    files_.push_back(std::make_unique<File>(p));
    for (const auto& t : files_.back()->tensors()) {
      check(!where_.count(t.name), "{}: tensor {} appears in more than one shard", where,
            shorten(t.name));
      where_[t.name] = files_.size() - 1;
    }
  };
  if (!fs::is_directory(path)) {
    add_file(path);
    return;
  }
  const fs::path single = path / (stem + ".safetensors");
  const fs::path index = path / (stem + ".safetensors.index.json");
  if (fs::exists(index)) {
    const json j = read_json_file(index);
    check(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
          "{}: missing object 'weight_map'", index.string());
    std::map<std::string, std::vector<std::string>> by_shard;
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      check(shard.is_string(), "{}: weight_map[{}] is not a file name", index.string(), shorten(tensor));
      by_shard[shard.get<std::string>()].push_back(tensor);
    }
    for (const auto& [shard, tensors] : by_shard) {
      const fs::path p = path / shard;
      check(fs::exists(p), "{}: shard {} named in weight_map does not exist", index.string(),
            shorten(shard));
      add_file(p);
      for (const auto& t : tensors)
        check(files_.back()->contains(t), "{}: weight_map puts {} in {}, which lacks it",
              index.string(), shorten(t), shorten(shard));
    }
    return;
  }
  check(fs::exists(single), "{}: folder holds neither {} nor {}", where, single.filename().string(),
        index.filename().string());
  add_file(single);
}

Reader::~Reader() = default;

std::vector<std::string> Reader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : where_) out.push_back(name);
  return out;
}

bool Reader::contains(const std::string& name) const { return where_.count(name) > 0; }

uint64_t Reader::bytes_decoded() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->bytes_decoded();
  return n;
}

uint64_t Reader::data_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->data_bytes();
  return n;
}

const File& Reader::file_of(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "{}: no tensor {}", path_.string(), name);
  return *files_[it->second];
}

void Reader::read_floats(const std::string& name, std::span<const int64_t> expected_shape,
                         float* out) const {
  file_of(name).read_floats(name, expected_shape, out, true);
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {
uint64_t byte_count(const WriteTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) {
    check(d >= 0, "tensor {}: negative dimension in shape {}", t.name, shape_string(t.shape));
    n *= d;
  }
  return uint64_t(n) * dtype_size(t.dtype);
}

void write_data(std::ofstream& out, const WriteTensor& t, uint64_t bytes) {
  const size_t n = bytes / dtype_size(t.dtype);
  if (n == 0) return;  // an empty tensor has no bytes, whatever its dtype
  if (t.raw) {
    out.write(static_cast<const char*>(t.raw), std::streamsize(bytes));
    return;
  }
  check(t.f32 != nullptr || n == 0, "tensor {}: no data given", t.name);
  if (t.dtype == DType::F32) {
    out.write(reinterpret_cast<const char*>(t.f32), std::streamsize(bytes));
    return;
  }
  check(t.dtype == DType::BF16 || t.dtype == DType::F16,
        "tensor {}: cannot convert float data to {}", t.name, dtype_name(t.dtype));
  std::vector<uint16_t> buf(std::min<size_t>(n, 1 << 16));
  for (size_t i = 0; i < n; i += buf.size()) {
    const size_t m = std::min(buf.size(), n - i);
    for (size_t k = 0; k < m; ++k)
      buf[k] = t.dtype == DType::BF16 ? float_to_bf16(t.f32[i + k]) : float_to_f16(t.f32[i + k]);
    out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(m * 2));
  }
}
}  // namespace

void write_file(const fs::path& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata,
                const std::string& progress_label) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    check(!t.name.empty() && t.name != "__metadata__", "{}: invalid tensor name '{}'",
          path.string(), t.name);
    check(seen.insert(t.name).second, "{}: tensor {} given twice", path.string(), t.name);
    check(t.raw != nullptr || t.f32 != nullptr || byte_count(t) == 0,
          "{}: tensor {} has no data", path.string(), t.name);
    sizes.push_back(byte_count(t));
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + sizes.back()}}};
    offset += sizes.back();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  write_atomically(path, [&](const fs::path& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    check(out.good(), "{}: cannot create ({})", tmp.string(), io_error_text());
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    Progress progress(progress_label, static_cast<int64_t>(offset), "bytes",
                      !progress_label.empty() && offset >= uint64_t(kProgressMinBytes));
    uint64_t written = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      write_data(out, tensors[i], sizes[i]);
      progress.update(static_cast<int64_t>(written += sizes[i]));
    }
    out.close();
    progress.finish();
    check(out.good(), "{}: write failed ({})", path.string(), io_error_text());
  });
}

int write_sharded(const fs::path& dir, const std::vector<WriteTensor>& tensors,
                  uint64_t max_shard_bytes, const std::string& stem,
                  const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<WriteTensor>> shards(1);
  uint64_t used = 0, total = 0;
  for (const auto& t : tensors) {
    const uint64_t b = byte_count(t);
    if (!shards.back().empty() && used + b > max_shard_bytes) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(t);
    used += b;
    total += b;
  }
  const int n = int(shards.size());
  json weight_map = json::object();
  for (int i = 0; i < n; ++i) {
    const std::string file = fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, i + 1, n);
    write_file(dir / file, shards[size_t(i)], metadata);
    for (const auto& t : shards[size_t(i)]) weight_map[t.name] = file;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const fs::path index_path = dir / (stem + ".safetensors.index.json");
  write_atomically(index_path, [&](const fs::path& tmp) {
    std::ofstream out(tmp);
    out << index.dump(2) << "\n";
    out.close();
    check(out.good(), "{}: write failed ({})", index_path.string(), io_error_text());
  });
  return n;
}

}  // namespace longtron::safetensors
