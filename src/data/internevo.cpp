// InternEvo JSON-lines tokenized files. Lines are parsed by hand (the {"tokens": [...]} shape is
// fixed and this is the hot path of packing); anything else falls back to nlohmann-json so an
// object with extra keys is still read, and a malformed line is reported precisely.
#include "data/internevo.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/io_error.h"
#include "core/json_read.h"
#include "data/mapped_file.h"
#include "data/npy.h"

namespace longtron::data {

namespace {

// Parses one line: counts its tokens and copies those with index in [skip, skip + count) to out.
// Returns the token count, or -1 if the line is not exactly {"tokens": [ints]} (fast path failed).
int64_t parse_tokens_fast(const char* p, const char* end, size_t skip, size_t count, int32_t* out) {
  auto ws = [&] { while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p; };
  auto expect = [&](const char* text) {
    const size_t len = std::strlen(text);
    if (static_cast<size_t>(end - p) < len || std::memcmp(p, text, len) != 0) return false;
    p += len;
    return true;
  };
  ws();
  if (!expect("{")) return -1;
  ws();
  if (!expect("\"tokens\"")) return -1;
  ws();
  if (!expect(":")) return -1;
  ws();
  if (!expect("[")) return -1;
  ws();
  int64_t n = 0;
  if (p < end && *p == ']') {
    ++p;
  } else {
    while (true) {
      int32_t value;
      const auto [next, ec] = std::from_chars(p, end, value);
      if (ec != std::errc() || next == p) return -1;
      // JSON has no leading zeros ("01", "-007"): leave those to the slow path, which refuses them.
      const char* digits = *p == '-' ? p + 1 : p;
      if (*digits == '0' && next - digits > 1) return -1;
      p = next;
      if (static_cast<size_t>(n) >= skip && static_cast<size_t>(n) < skip + count) out[n - skip] = value;
      ++n;
      ws();
      if (p < end && *p == ',') {
        ++p;
        ws();
        continue;
      }
      if (!expect("]")) return -1;
      break;
    }
  }
  ws();
  if (!expect("}")) return -1;
  ws();
  return p == end ? n : -1;
}

// The slow path: any JSON object with a "tokens" array of int32. Returns -1 if the line is not one.
int64_t parse_tokens_json(const char* p, const char* end, size_t skip, size_t count, int32_t* out) {
  const auto parsed = try_parse_json(std::string_view(p, static_cast<size_t>(end - p)));
  if (!parsed) return -1;
  const nlohmann::json& json = *parsed;
  if (!json.is_object() || !json.contains("tokens")) return -1;
  const auto& tokens = json["tokens"];
  if (!tokens.is_array()) return -1;
  int64_t n = 0;
  for (const auto& t : tokens) {
    if (!t.is_number_integer()) return -1;
    // An unsigned value above 2^63 must not wrap around to a small negative one.
    if (t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max()))
      return -1;
    const auto v = t.get<int64_t>();
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) return -1;
    if (static_cast<size_t>(n) >= skip && static_cast<size_t>(n) < skip + count)
      out[n - skip] = static_cast<int32_t>(v);
    ++n;
  }
  return n;
}

class InternEvoSource final : public DocumentSource {
 public:
  explicit InternEvoSource(const std::filesystem::path& bin_path) : bin_(bin_path) {
    const std::filesystem::path meta_path = bin_path.string() + ".meta";
    if (std::filesystem::exists(meta_path)) {
      load_meta(meta_path);
    } else {
      scan();
    }
  }

  size_t num_documents() const override { return lengths_.size(); }
  size_t document_length(size_t i) const override { return static_cast<size_t>(lengths_[i]); }
  const std::filesystem::path& path() const override { return bin_.path(); }

  void read_tokens(size_t i, size_t begin, size_t count, int32_t* out) const override {
    check(i < num_documents() && begin + count <= document_length(i),
          "{}: read of tokens [{}, {}) of document {} is out of range", path().string(), begin,
          begin + count, i);
    const int64_t n = parse_line(offsets_[i], begin, count, out);
    if (n != lengths_[i])
      fail("{}: line {} (byte offset {}): {} tokens, but {}.meta says {}", path().string(),
           line_number(offsets_[i]), offsets_[i], n, path().string(), lengths_[i]);
  }

 private:
  const char* chars() const { return reinterpret_cast<const char*>(bin_.data()); }

  const char* line_end(int64_t offset) const {
    const char* start = chars() + offset;
    const char* nl = static_cast<const char*>(std::memchr(start, '\n', bin_.size() - offset));
    return nl != nullptr ? nl : chars() + bin_.size();
  }

  // 1-based line number of the byte at `offset` (only on the error path: it counts newlines).
  int64_t line_number(int64_t offset) const {
    return 1 + std::count(chars(), chars() + offset, '\n');
  }

  int64_t parse_line(int64_t offset, size_t skip, size_t count, int32_t* out) const {
    const char* start = chars() + offset;
    const char* end = line_end(offset);
    int64_t n = parse_tokens_fast(start, end, skip, count, out);
    if (n < 0) n = parse_tokens_json(start, end, skip, count, out);
    if (n < 0)
      fail("{}: line {} (byte offset {}): expected a JSON object {{\"tokens\": [int32, ...]}}",
           path().string(), line_number(offset), offset);
    return n;
  }

  void load_meta(const std::filesystem::path& meta_path) {
    const NpyIntMatrix meta = read_npy_int_matrix(meta_path);
    check(meta.cols == 2 || meta.cols == 3,
          "{}: shape ({}, {}), expected (N, 2) (offset, length) or (N, 3) (offset, length, index)",
          meta_path.string(), meta.rows, meta.cols);
    const auto size = static_cast<int64_t>(bin_.size());
    for (int64_t r = 0; r < meta.rows; ++r) {
      const int64_t offset = meta.at(r, 0), length = meta.at(r, 1);
      check(offset >= 0 && offset < size,
            "{}: row {}: byte offset {} is outside {} ({} bytes)", meta_path.string(), r, offset,
            bin_.path().string(), size);
      check(offset == 0 || chars()[offset - 1] == '\n',
            "{}: row {}: byte offset {} is not the start of a line of {}", meta_path.string(), r,
            offset, bin_.path().string());
      check(length >= 0, "{}: row {}: negative token count {}", meta_path.string(), r, length);
      // Each token takes at least two bytes ("7,"), so no line can hold more than this; checking
      // it here keeps a corrupt count from sizing a reader's buffer.
      check(length <= (size - offset) / 2 + 1,
            "{}: row {}: token count {} cannot fit in the {} bytes of {} from byte offset {}",
            meta_path.string(), r, length, size - offset, bin_.path().string(), offset);
      offsets_.push_back(offset);
      lengths_.push_back(length);
    }
  }

  void scan() {
    const auto size = static_cast<int64_t>(bin_.size());
    int64_t offset = 0;
    while (offset < size) {
      const char* end = line_end(offset);
      const auto next = static_cast<int64_t>(end - chars()) + 1;
      const bool blank = std::all_of(chars() + offset, end,
                                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
      if (!blank) {
        offsets_.push_back(offset);
        lengths_.push_back(parse_line(offset, 0, 0, nullptr));
      }
      offset = next;
    }
  }

  MappedFile bin_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> lengths_;
};

}  // namespace

std::unique_ptr<DocumentSource> open_internevo(const std::filesystem::path& bin_path) {
  return std::make_unique<InternEvoSource>(bin_path);
}

InternEvoWriter::InternEvoWriter(const std::filesystem::path& bin_path)
    : path_(bin_path), bin_(bin_path, std::ios::binary) {
  check(bin_.good(), "{}: cannot open for writing", bin_path.string());
}

void InternEvoWriter::add_document(const int32_t* tokens, size_t count) {
  line_.assign("{\"tokens\": [");
  char number[16];
  for (size_t j = 0; j < count; ++j) {
    check(tokens[j] != kStoredLossZero, "{}: document {}, token {}: id 0 carrying loss cannot be "
          "stored in InternEvo's format (a stored 0 carries no loss); write a pre-tokenized "
          ".jsonl with labels instead", path_.string(), lengths_.size(), j);
    if (j > 0) line_.append(", ");
    const auto [end, ec] = std::to_chars(number, number + sizeof(number), tokens[j]);
    line_.append(number, end);
  }
  line_.append("]}\n");
  bin_.write(line_.data(), static_cast<std::streamsize>(line_.size()));
  if (bin_.fail() && bin_errno_ == 0) bin_errno_ = errno;
  offsets_.push_back(bytes_);
  lengths_.push_back(static_cast<int64_t>(count));
  bytes_ += static_cast<int64_t>(line_.size());
}

void InternEvoWriter::finish() {
  bin_.close();
  if (bin_.fail() && bin_errno_ == 0) bin_errno_ = errno;
  check(!bin_.fail(), "{}: write failed ({})", path_.string(), io_error_text(bin_errno_));
  std::vector<int64_t> meta;
  meta.reserve(2 * offsets_.size());
  for (size_t i = 0; i < offsets_.size(); ++i) {
    meta.push_back(offsets_[i]);
    meta.push_back(lengths_[i]);
  }
  write_npy_int_matrix(path_.string() + ".meta", meta, static_cast<int64_t>(offsets_.size()), 2);
}

}  // namespace longtron::data
