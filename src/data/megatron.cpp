// Megatron MMap indexed dataset. Layout of X.idx (Megatron-LM indexed_dataset.py):
//   "MMIDIDX\0\0" (9 B) | u64 version = 1 | u8 dtype | u64 sequence count S | u64 doc_idx count D
//   | int32 sizes[S] | int64 byte pointers[S] | int64 doc_idx[D]   (D = documents + 1)
#include "data/megatron.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/io_error.h"
#include "data/mapped_file.h"

namespace longtron::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

bool valid_dtype(uint8_t code) { return code >= 1 && code <= 8; }

// Converts a real-valued token to an int32 id; sets *ok = false unless it is an integer in range
// (checked before the cast, which would be undefined behaviour otherwise).
int32_t real_token(double real, bool* ok) {
  if (!(std::isfinite(real) && real > -2147483649.0 && real < 2147483648.0 &&
        std::trunc(real) == real)) {
    *ok = false;
    return 0;
  }
  return static_cast<int32_t>(real);
}

// Reads the token stored with `dtype` at `p` as an int32; sets *ok = false if it is not one.
int32_t token_at(const uint8_t* p, MegatronDtype dtype, bool* ok) {
  switch (dtype) {
    case MegatronDtype::kUint8: return load<uint8_t>(p);
    case MegatronDtype::kInt8: return load<int8_t>(p);
    case MegatronDtype::kInt16: return load<int16_t>(p);
    case MegatronDtype::kUint16: return load<uint16_t>(p);
    case MegatronDtype::kInt32: return load<int32_t>(p);
    case MegatronDtype::kInt64: {
      const auto value = load<int64_t>(p);
      if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
        *ok = false;
      return static_cast<int32_t>(value);
    }
    case MegatronDtype::kFloat32: return real_token(load<float>(p), ok);
    case MegatronDtype::kFloat64: return real_token(load<double>(p), ok);
  }
  *ok = false;
  return 0;
}

class MegatronSource final : public DocumentSource {
 public:
  explicit MegatronSource(const std::filesystem::path& prefix)
      : idx_path_(prefix.string() + ".idx"), idx_(idx_path_), bin_(prefix.string() + ".bin") {
    parse_index();
  }

  size_t num_documents() const override { return doc_tokens_.size() - 1; }
  size_t document_length(size_t i) const override {
    return static_cast<size_t>(doc_tokens_[i + 1] - doc_tokens_[i]);
  }
  const std::filesystem::path& path() const override { return bin_.path(); }

  void read_tokens(size_t i, size_t begin, size_t count, int32_t* out) const override {
    check(i < num_documents() && begin + count <= document_length(i),
          "{}: read of tokens [{}, {}) of document {} is out of range", bin_.path().string(), begin,
          begin + count, i);
    const size_t elem = megatron_dtype_size(dtype_);
    size_t skip = begin;
    for (int64_t s = doc_idx(i); s < doc_idx(i + 1) && count > 0; ++s) {
      const auto size = static_cast<size_t>(sizes(s));
      if (skip >= size) {
        skip -= size;
        continue;
      }
      const size_t take = std::min(count, size - skip);
      const int64_t offset = pointers(s) + static_cast<int64_t>(skip * elem);
      const uint8_t* p = bin_.data() + offset;
      bool ok = true;
      for (size_t j = 0; j < take; ++j) {
        out[j] = token_at(p + j * elem, dtype_, &ok);
        if (!ok)
          fail("{}: byte offset {}: token is not an integer id within int32", bin_.path().string(),
               offset + static_cast<int64_t>(j * elem));
      }
      out += take;
      count -= take;
      skip = 0;
    }
  }

 private:
  int32_t sizes(int64_t s) const { return load<int32_t>(sizes_ + 4 * s); }
  int64_t pointers(int64_t s) const { return load<int64_t>(pointers_ + 8 * s); }
  int64_t doc_idx(size_t i) const { return load<int64_t>(doc_idx_ + 8 * i); }

  void parse_index() {
    const std::string file = idx_path_.string();
    const uint8_t* p = idx_.data();
    const size_t n = idx_.size();
    check(n >= kHeaderBytes, "{}: truncated header: {} bytes, expected at least {}", file, n,
          kHeaderBytes);
    check(std::memcmp(p, kMagic, 9) == 0,
          "{}: byte offset 0: wrong magic, expected \"MMIDIDX\\0\\0\" (Megatron MMap index)", file);
    const auto version = load<uint64_t>(p + 9);
    check(version == 1, "{}: byte offset 9: version {}, expected 1", file, version);
    const uint8_t code = p[17];
    check(valid_dtype(code), "{}: byte offset 17: unknown dtype code {}, expected 1..8", file, code);
    dtype_ = static_cast<MegatronDtype>(code);
    const auto num_seq = load<uint64_t>(p + 18);
    const auto num_doc_idx = load<uint64_t>(p + 26);
    check(num_doc_idx >= 1, "{}: byte offset 26: document index count is 0, expected >= 1", file);
    check_index_size(num_seq, num_doc_idx);
    num_seq_ = static_cast<int64_t>(num_seq);
    sizes_ = p + kHeaderBytes;
    pointers_ = sizes_ + 4 * num_seq;
    doc_idx_ = pointers_ + 8 * num_seq;
    check_sequences();
    check_documents(num_doc_idx);
  }

  // The arrays after the header fill the rest of the .idx exactly: 12 bytes per sequence (an int32
  // size and an int64 pointer) and 8 per document index entry. A count that disagrees with the
  // file's size is refused rather than trusted (too small would silently drop documents).
  void check_index_size(uint64_t num_seq, uint64_t num_doc_idx) const {
    const uint64_t room = idx_.size() - kHeaderBytes;
    uint64_t seq_bytes = 0, doc_bytes = 0, need = 0;
    const bool overflow = __builtin_mul_overflow(num_seq, uint64_t{12}, &seq_bytes) ||
                          __builtin_mul_overflow(num_doc_idx, uint64_t{8}, &doc_bytes) ||
                          __builtin_add_overflow(seq_bytes, doc_bytes, &need);
    if (!overflow && need == room) return;
    const std::string need_text =
        overflow ? "more than 2^64" : std::to_string(need);
    const std::string total_text =
        overflow ? "more than 2^64" : std::to_string(need + kHeaderBytes);
    fail("{}: {}: the header's sequence count {} (byte offset 18: a 4-byte size and an 8-byte "
         "pointer per sequence) and document index count {} (byte offset 26: documents + 1 entries "
         "of 8 bytes) need {} bytes after the header at byte offset {}, the file has {} ({} bytes "
         "in all; the file has {} bytes)",
         idx_path_.string(), overflow || need > room ? "truncated" : "size disagrees with the header",
         num_seq, num_doc_idx, need_text, kHeaderBytes, room, total_text, idx_.size());
  }

  // Each sequence starts where the previous one ends (pointers are the running sum of the sizes,
  // hence aligned to the dtype) and the last one ends where the .bin ends. All arithmetic is
  // unsigned and checked against the .bin size before it could overflow.
  void check_sequences() const {
    const uint64_t elem = megatron_dtype_size(dtype_);
    const uint64_t bin_size = bin_.size();
    const std::string& file = idx_path_.string();
    uint64_t expected = 0;  // end of the previous sequence, <= bin_size
    for (int64_t s = 0; s < num_seq_; ++s) {
      const int32_t size = sizes(s);
      const int64_t ptr = pointers(s);
      const uint64_t ptr_offset = kHeaderBytes + 4 * uint64_t(num_seq_) + 8 * uint64_t(s);
      check(size >= 0, "{}: byte offset {}: negative size {} of sequence {}", file,
            kHeaderBytes + 4 * s, size, s);
      check(ptr >= 0, "{}: byte offset {}: sequence {} has a negative pointer ({})", file,
            ptr_offset, s, ptr);
      check(uint64_t(ptr) % elem == 0, "{}: byte offset {}: sequence {} has pointer {}, not a "
            "multiple of {} (the size of its dtype)", file, ptr_offset, s, ptr, elem);
      if (uint64_t(ptr) != expected)
        fail("{}: byte offset {}: sequence {} has pointer {}, expected {} ({}: pointers are the "
             "running sum of the sizes)", file, ptr_offset, s, ptr, expected,
             s == 0 ? std::string("the start of the .bin") : fmt::format("where sequence {} ends", s - 1));
      const uint64_t end = expected + uint64_t(size) * elem;  // < 2^63 + 2^34: no overflow
      check(end <= bin_size, "{}: sequence {} (pointer at byte offset {}) spans bytes [{}, {}) but "
            "{} has {} bytes", file, s, ptr_offset, expected, end, bin_.path().string(), bin_size);
      expected = end;
    }
    check(expected == bin_size, "{}: {} has {} bytes but the sequences of {} cover {} (trailing "
          "bytes, or an index of another file?)", bin_.path().string(), bin_.path().string(),
          bin_size, file, expected);
  }

  // doc_idx runs from 0 to the sequence count, non-decreasing (a document is the sequences
  // doc_idx[i] .. doc_idx[i+1]-1; equal neighbours make an empty document).
  void check_documents(uint64_t num_doc_idx) {
    const size_t base = kHeaderBytes + 12 * static_cast<size_t>(num_seq_);
    const std::string& file = idx_path_.string();
    doc_tokens_.assign(num_doc_idx, 0);
    int64_t previous = 0;
    for (size_t i = 0; i < num_doc_idx; ++i) {
      const int64_t d = doc_idx(i);
      if (i == 0)
        check(d == 0, "{}: byte offset {}: document index entry 0 is {}, expected 0", file, base, d);
      check(d >= previous && d <= num_seq_,
            "{}: byte offset {}: document index entry {} is {}, expected a non-decreasing value in "
            "[{}, {}]",
            file, base + 8 * i, i, d, previous, num_seq_);
      if (i + 1 == num_doc_idx)
        check(d == num_seq_, "{}: byte offset {}: document index entry {} is {}, expected {} (the "
              "sequence count: every sequence belongs to a document)", file, base + 8 * i, i, d,
              num_seq_);
      if (i > 0) {
        int64_t tokens = doc_tokens_[i - 1];
        for (int64_t s = previous; s < d; ++s) tokens += sizes(s);
        doc_tokens_[i] = tokens;
      }
      previous = d;
    }
  }

  std::filesystem::path idx_path_;
  MappedFile idx_;
  MappedFile bin_;
  MegatronDtype dtype_ = MegatronDtype::kInt32;
  int64_t num_seq_ = 0;
  const uint8_t* sizes_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_idx_ = nullptr;
  std::vector<int64_t> doc_tokens_;  // prefix token counts per document, [documents + 1]
};

template <typename T>
void store_as(int64_t value, uint8_t* out) {
  const T cast = static_cast<T>(value);
  std::memcpy(out, &cast, sizeof(T));
}

void store(int64_t value, MegatronDtype dtype, uint8_t* out) {
  switch (dtype) {
    case MegatronDtype::kUint8: store_as<uint8_t>(value, out); break;
    case MegatronDtype::kInt8: store_as<int8_t>(value, out); break;
    case MegatronDtype::kInt16: store_as<int16_t>(value, out); break;
    case MegatronDtype::kUint16: store_as<uint16_t>(value, out); break;
    case MegatronDtype::kInt32: store_as<int32_t>(value, out); break;
    case MegatronDtype::kInt64: store_as<int64_t>(value, out); break;
    case MegatronDtype::kFloat32: store_as<float>(value, out); break;
    case MegatronDtype::kFloat64: store_as<double>(value, out); break;
  }
}

}  // namespace

size_t megatron_dtype_size(MegatronDtype dtype) {
  switch (dtype) {
    case MegatronDtype::kUint8:
    case MegatronDtype::kInt8: return 1;
    case MegatronDtype::kInt16:
    case MegatronDtype::kUint16: return 2;
    case MegatronDtype::kInt32:
    case MegatronDtype::kFloat32: return 4;
    case MegatronDtype::kInt64:
    case MegatronDtype::kFloat64: return 8;
  }
  return 0;
}

MegatronDtype megatron_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? MegatronDtype::kUint16 : MegatronDtype::kInt32;
}

std::unique_ptr<DocumentSource> open_megatron(const std::filesystem::path& prefix) {
  return std::make_unique<MegatronSource>(prefix);
}

MegatronWriter::MegatronWriter(const std::filesystem::path& prefix, MegatronDtype dtype)
    : prefix_(prefix), dtype_(dtype), bin_(prefix.string() + ".bin", std::ios::binary) {
  check(bin_.good(), "{}.bin: cannot open for writing", prefix.string());
}

void MegatronWriter::add_sequence(const int64_t* tokens, size_t count) {
  const size_t elem = megatron_dtype_size(dtype_);
  buffer_.resize(count * elem);
  for (size_t j = 0; j < count; ++j) store(tokens[j], dtype_, buffer_.data() + j * elem);
  bin_.write(reinterpret_cast<const char*>(buffer_.data()), static_cast<std::streamsize>(buffer_.size()));
  if (bin_.fail() && bin_errno_ == 0) bin_errno_ = errno;
  sizes_.push_back(static_cast<int32_t>(count));
  pointers_.push_back(bin_bytes_);
  bin_bytes_ += static_cast<int64_t>(buffer_.size());
}

void MegatronWriter::end_document() { doc_idx_.push_back(static_cast<int64_t>(sizes_.size())); }

void MegatronWriter::add_document(const int32_t* tokens, size_t count) {
  std::vector<int64_t> wide(tokens, tokens + count);
  add_sequence(wide.data(), wide.size());
  end_document();
}

void MegatronWriter::finish() {
  bin_.close();
  if (bin_.fail() && bin_errno_ == 0) bin_errno_ = errno;
  check(!bin_.fail(), "{}.bin: write failed ({})", prefix_.string(), io_error_text(bin_errno_));
  std::ofstream idx(prefix_.string() + ".idx", std::ios::binary);
  check(idx.good(), "{}.idx: cannot open for writing", prefix_.string());
  const uint64_t version = 1, num_seq = sizes_.size(), num_doc_idx = doc_idx_.size();
  const auto code = static_cast<uint8_t>(dtype_);
  idx.write(kMagic, 9);
  idx.write(reinterpret_cast<const char*>(&version), 8);
  idx.write(reinterpret_cast<const char*>(&code), 1);
  idx.write(reinterpret_cast<const char*>(&num_seq), 8);
  idx.write(reinterpret_cast<const char*>(&num_doc_idx), 8);
  idx.write(reinterpret_cast<const char*>(sizes_.data()), static_cast<std::streamsize>(4 * num_seq));
  idx.write(reinterpret_cast<const char*>(pointers_.data()), static_cast<std::streamsize>(8 * num_seq));
  idx.write(reinterpret_cast<const char*>(doc_idx_.data()), static_cast<std::streamsize>(8 * num_doc_idx));
  idx.close();
  check(!idx.fail(), "{}.idx: write failed ({})", prefix_.string(), io_error_text());
}

}  // namespace longtron::data
