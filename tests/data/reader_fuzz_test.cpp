// Fuzz tests of the tokenized-data readers: Megatron .idx/.bin, InternEvo .bin/.bin.meta and .npy.
// Valid files get seeded random mutations (fuzz_util.h); each case must end in a clean longtron
// error naming the file or in a read that equals what an independent, straightforward decoding of
// the mutated bytes gives (so a change the format cannot detect is read as written, and one it can
// detect is refused) — never a crash, a hang, another exception type, or silently other content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "core/error.h"
#include "data/internevo.h"
#include "data/megatron.h"
#include "data/npy.h"
#include "fuzz_util.h"
#include "test_util.h"

namespace ld = longtron::data;
using longtron::Error;
using longtron::testing::expect_clean_error;
using longtron::testing::FuzzTally;
using longtron::testing::Mutation;
using longtron::testing::Mutator;
using longtron::testing::read_file;
using longtron::testing::TempDir;
using longtron::testing::write_file;
using Docs = std::vector<std::vector<int32_t>>;

namespace {

constexpr int kCases = 2400;

template <typename T>
T load(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

Docs random_docs(Mutator& rng, int32_t lo, int32_t hi) {
  Docs docs(1 + rng.below(6));
  for (auto& d : docs) {
    d.resize(rng.below(9));  // empty documents included
    for (auto& t : d) t = int32_t(lo + int64_t(rng.below(size_t(int64_t(hi) - lo + 1))));
  }
  return docs;
}

// Every document read whole, plus a random slice of each one checked against the whole.
Docs read_all(const ld::DocumentSource& source, Mutator& rng) {
  Docs docs(source.num_documents());
  for (size_t i = 0; i < docs.size(); ++i) {
    docs[i].resize(source.document_length(i));
    source.read_tokens(i, 0, docs[i].size(), docs[i].data());
    const size_t begin = rng.below(docs[i].size() + 1);
    const size_t count = rng.below(docs[i].size() - begin + 1);
    std::vector<int32_t> part(count);
    source.read_tokens(i, begin, count, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), docs[i].begin() + ptrdiff_t(begin)));
  }
  return docs;
}

// ---- Megatron ------------------------------------------------------------------------------

// The documents of a Megatron pair decoded straight from the format's definition, or nullopt when
// the bytes break it: exact file sizes, pointers the running sum of sizes, doc_idx from 0 to the
// sequence count without decreasing, tokens integers within int32.
std::optional<Docs> megatron_reference(const std::string& idx, const std::string& bin) {
  if (idx.size() < 34 || idx.compare(0, 9, std::string("MMIDIDX\0\0", 9)) != 0) return std::nullopt;
  if (load<uint64_t>(idx, 9) != 1) return std::nullopt;
  const int code = uint8_t(idx[17]);
  static constexpr size_t kSize[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  if (code < 1 || code > 8) return std::nullopt;
  const size_t elem = kSize[code];
  const auto seqs = load<uint64_t>(idx, 18), entries = load<uint64_t>(idx, 26);
  if (entries < 1 || (unsigned __int128)seqs * 12 + (unsigned __int128)entries * 8 != idx.size() - 34)
    return std::nullopt;
  std::vector<std::vector<int32_t>> sequences;
  uint64_t pos = 0;
  for (uint64_t s = 0; s < seqs; ++s) {
    const auto size = load<int32_t>(idx, 34 + 4 * s);
    const auto ptr = load<int64_t>(idx, 34 + 4 * seqs + 8 * s);
    if (size < 0 || ptr < 0 || uint64_t(ptr) != pos || pos + uint64_t(size) * elem > bin.size())
      return std::nullopt;
    std::vector<int32_t> tokens;
    for (int32_t j = 0; j < size; ++j, pos += elem) {
      double v = 0;
      switch (code) {
        case 1: v = load<uint8_t>(bin, pos); break;
        case 2: v = load<int8_t>(bin, pos); break;
        case 3: v = load<int16_t>(bin, pos); break;
        case 4: v = load<int32_t>(bin, pos); break;
        case 5: {
          const auto w = load<int64_t>(bin, pos);
          if (w < INT32_MIN || w > INT32_MAX) return std::nullopt;
          v = double(w);
          break;
        }
        case 6: v = load<double>(bin, pos); break;
        case 7: v = load<float>(bin, pos); break;
        case 8: v = load<uint16_t>(bin, pos); break;
      }
      if (!(v >= INT32_MIN && v <= INT32_MAX && std::trunc(v) == v)) return std::nullopt;
      tokens.push_back(int32_t(v));
    }
    sequences.push_back(tokens);
  }
  if (pos != bin.size()) return std::nullopt;
  Docs docs;
  const size_t base = 34 + 12 * seqs;
  int64_t previous = 0;
  for (uint64_t i = 0; i < entries; ++i) {
    const auto d = load<int64_t>(idx, base + 8 * i);
    if ((i == 0 && d != 0) || d < previous || uint64_t(d) > seqs ||
        (i + 1 == entries && uint64_t(d) != seqs))
      return std::nullopt;
    if (i > 0) {
      docs.emplace_back();
      for (int64_t s = previous; s < d; ++s)
        docs.back().insert(docs.back().end(), sequences[size_t(s)].begin(), sequences[size_t(s)].end());
    }
    previous = d;
  }
  return docs;
}

TEST(ReaderFuzz, Megatron) {
  TempDir dir(longtron::testing::fuzz_temp_base());
  Mutator rng(20261201);
  FuzzTally tally{"megatron idx/bin"};
  static constexpr ld::MegatronDtype kDtypes[] = {
      ld::MegatronDtype::kUint8, ld::MegatronDtype::kInt8,    ld::MegatronDtype::kInt16,
      ld::MegatronDtype::kInt32, ld::MegatronDtype::kInt64,   ld::MegatronDtype::kFloat64,
      ld::MegatronDtype::kFloat32, ld::MegatronDtype::kUint16};
  for (int c = 0; c < kCases; ++c) {
    const auto dtype = kDtypes[rng.below(8)];
    const Docs original = random_docs(rng, 0, 120);
    {
      ld::MegatronWriter writer(dir / "m", dtype);
      for (const auto& d : original) {  // documents of one or two sequences
        const size_t cut = rng.below(d.size() + 1);
        std::vector<int64_t> wide(d.begin(), d.end());
        writer.add_sequence(wide.data(), cut);
        if (rng.below(2)) writer.add_sequence(wide.data() + cut, wide.size() - cut);
        else if (cut < wide.size()) writer.add_sequence(wide.data() + cut, wide.size() - cut);
        writer.end_document();
      }
      writer.finish();
    }
    std::string idx = read_file(dir / "m.idx"), bin = read_file(dir / "m.bin");
    ASSERT_EQ(megatron_reference(idx, bin), original);
    const bool mutate_idx = rng.below(4) != 0;
    const Mutation m = rng.mutate(mutate_idx ? idx : bin);
    (mutate_idx ? idx : bin) = m.bytes;
    write_file(dir / "m.idx", idx);
    write_file(dir / "m.bin", bin);
    const auto expected = megatron_reference(idx, bin);
    try {
      const Docs got = read_all(*ld::open_megatron(dir / "m"), rng);
      ASSERT_TRUE(expected.has_value()) << "accepted a broken file: " << m.kind << " at "
                                        << m.offset << " of the " << (mutate_idx ? "idx" : "bin");
      ASSERT_EQ(got, *expected) << m.kind << " at " << m.offset;
      ++tally.reads;
    } catch (const Error& e) {
      ASSERT_FALSE(expected.has_value()) << "refused a valid file: " << e.what();
      expect_clean_error(e, (dir / "m").string(), m);
      ++tally.errors;
    }
  }
  EXPECT_GE(tally.cases(), 2000);
}

// ---- .npy ----------------------------------------------------------------------------------

// A valid .npy of `values` [rows, cols]: the writer's version 1 file, or a version 2 one built
// here (4-byte header length), with the keys in numpy's order.
std::string npy_bytes(Mutator& rng, const TempDir& dir, const std::vector<int64_t>& values,
                      int64_t rows, int64_t cols, bool int64) {
  ld::write_npy_int_matrix(dir / "a.npy", values, rows, cols, int64);
  std::string bytes = read_file(dir / "a.npy");
  if (rng.below(3) == 0) {  // version 2.0: u32 header length
    const uint16_t len = load<uint16_t>(bytes, 8);
    const uint32_t len32 = len;
    std::string v2 = bytes.substr(0, 6) + std::string("\x02\x00", 2);
    v2.append(reinterpret_cast<const char*>(&len32), 4);
    v2 += bytes.substr(10);
    bytes = v2;
  }
  return bytes;
}

TEST(ReaderFuzz, Npy) {
  TempDir dir(longtron::testing::fuzz_temp_base());
  Mutator rng(7);
  FuzzTally tally{"npy"};
  for (int c = 0; c < kCases; ++c) {
    const int64_t rows = int64_t(rng.below(5)), cols = 2 + int64_t(rng.below(2));
    const bool int64 = rng.below(2);
    std::vector<int64_t> values(size_t(rows * cols));
    for (auto& v : values) v = int64_t(rng.below(1000)) - 500;
    const std::string good = npy_bytes(rng, dir, values, rows, cols, int64);
    const size_t data_start = good.size() - values.size() * (int64 ? 8 : 4);
    const Mutation m = rng.mutate(good, 0, rng.below(3) == 0 ? good.size() : data_start);
    write_file(dir / "a.npy", m.bytes);
    // Undetectable changes are those of data bytes in place; the data then reads as written.
    std::vector<int64_t> expected = values;
    if (m.in_place && m.offset >= data_start)
      for (size_t i = 0; i < expected.size(); ++i)
        expected[i] = int64 ? load<int64_t>(m.bytes, data_start + 8 * i)
                            : load<int32_t>(m.bytes, data_start + 4 * i);
    try {
      const auto got = ld::read_npy_int_matrix(dir / "a.npy");
      // An empty matrix may become another empty shape: still a valid file saying exactly that.
      if (rows * cols != 0 || got.rows * got.cols != 0) {
        ASSERT_EQ(got.rows, rows) << m.kind << " at " << m.offset;
        ASSERT_EQ(got.cols, cols) << m.kind << " at " << m.offset;
      }
      ASSERT_EQ(got.values, expected) << m.kind << " at " << m.offset;
      ++tally.reads;
    } catch (const Error& e) {
      ASSERT_FALSE(m.in_place && m.offset >= data_start) << "refused valid data: " << e.what();
      expect_clean_error(e, (dir / "a.npy").string(), m);
      ++tally.errors;
    }
  }
  EXPECT_GE(tally.cases(), 2000);
}

// ---- InternEvo -----------------------------------------------------------------------------

// One JSON line's tokens as nlohmann-json reads it, or nullopt unless it is an object whose
// "tokens" is an array of integers within int32.
std::optional<std::vector<int32_t>> internevo_line(std::string_view line) {
  // JSON allows no NUL byte (nlohmann's lexer alone would stop at one and accept what precedes it).
  if (line.find('\0') != std::string_view::npos) return std::nullopt;
  const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    return std::nullopt;
  std::vector<int32_t> out;
  for (const auto& t : j["tokens"]) {
    if (t.is_number_unsigned() && t.get<uint64_t>() <= uint64_t(INT32_MAX)) {
      out.push_back(int32_t(t.get<uint64_t>()));
    } else if (t.is_number_integer() && !t.is_number_unsigned() && t.get<int64_t>() >= INT32_MIN &&
               t.get<int64_t>() <= INT32_MAX) {
      out.push_back(int32_t(t.get<int64_t>()));
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::string_view line_at(const std::string& bin, size_t offset) {
  const size_t nl = bin.find('\n', offset);
  return std::string_view(bin).substr(offset, (nl == std::string::npos ? bin.size() : nl) - offset);
}

// The documents of an InternEvo .bin (and .meta when given), decoded from the format's definition.
std::optional<Docs> internevo_reference(const std::string& bin, const ld::NpyIntMatrix* meta) {
  Docs docs;
  if (meta == nullptr) {
    for (size_t offset = 0; offset < bin.size();) {
      const auto line = line_at(bin, offset);
      offset += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      auto tokens = internevo_line(line);
      if (!tokens) return std::nullopt;
      docs.push_back(*tokens);
    }
    return docs;
  }
  if (meta->cols != 2 && meta->cols != 3) return std::nullopt;
  for (int64_t r = 0; r < meta->rows; ++r) {
    const int64_t offset = meta->at(r, 0), length = meta->at(r, 1);
    if (offset < 0 || uint64_t(offset) >= bin.size() || length < 0 ||
        (offset > 0 && bin[size_t(offset) - 1] != '\n'))
      return std::nullopt;
    auto tokens = internevo_line(line_at(bin, size_t(offset)));
    if (!tokens || int64_t(tokens->size()) != length) return std::nullopt;
    docs.push_back(*tokens);
  }
  return docs;
}

TEST(ReaderFuzz, InternEvo) {
  TempDir dir(longtron::testing::fuzz_temp_base());
  Mutator rng(42);
  FuzzTally tally{"internevo bin/meta"};
  const auto bin_path = dir / "i.bin", meta_path = dir / "i.bin.meta";
  for (int c = 0; c < kCases; ++c) {
    const Docs original = random_docs(rng, -3, 100000);
    {
      ld::InternEvoWriter writer(bin_path);
      for (const auto& d : original) writer.add_document(d.data(), d.size());
      writer.finish();
    }
    std::string bin = read_file(bin_path), meta = read_file(meta_path);
    const int where = int(rng.below(4));  // 0, 1: the .bin; 2: the .meta; 3: the .bin, no .meta
    if (where == 2) meta = rng.mutate(meta).bytes;
    const Mutation m = where == 2 ? Mutation{meta, "meta mutation", 0} : rng.mutate(bin);
    if (where != 2) bin = m.bytes;
    write_file(bin_path, bin);
    if (where == 3) std::filesystem::remove(meta_path);
    else write_file(meta_path, meta);
    std::optional<Docs> expected;
    try {
      if (where == 3) {
        expected = internevo_reference(bin, nullptr);
      } else {
        const auto matrix = ld::read_npy_int_matrix(meta_path);  // fuzzed on its own above
        expected = internevo_reference(bin, &matrix);
      }
    } catch (const Error&) {
    }
    try {
      const Docs got = read_all(*ld::open_internevo(bin_path), rng);
      ASSERT_TRUE(expected.has_value()) << "accepted a broken file: " << m.kind << " at " << m.offset;
      ASSERT_EQ(got, *expected) << m.kind << " at " << m.offset;
      ++tally.reads;
    } catch (const Error& e) {
      ASSERT_FALSE(expected.has_value()) << "refused a valid file (" << m.kind << " at " << m.offset
                                         << "): " << e.what();
      expect_clean_error(e, bin_path.string(), m);
      ++tally.errors;
    }
  }
  EXPECT_GE(tally.cases(), 2000);
}

}  // namespace
