// Megatron .idx files that a tester corrupted and that were read wrongly or reported wrongly: a
// document count one short (the last document silently dropped), trailing bytes, a misaligned
// pointer, truncations reported as "need 0 bytes", and a pointer near 2^63 printed as a negative
// end offset.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "core/error.h"
#include "data/megatron.h"
#include "expect_error.h"
#include "test_util.h"

namespace ld = longtron::data;
using longtron::testing::expect_error;
using longtron::testing::read_file;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

constexpr size_t kHeader = 34;  // magic 9 + version 8 + dtype 1 + counts 8 + 8

// Five one-sequence documents of 3, 1, 4, 1, 5 uint16 tokens: x.idx and x.bin in `dir`.
void write_five(const TempDir& dir) {
  ld::MegatronWriter writer(dir / "x", ld::MegatronDtype::kUint16);
  int32_t t = 0;
  for (int len : {3, 1, 4, 1, 5}) {
    std::vector<int32_t> doc;
    for (int i = 0; i < len; ++i) doc.push_back(++t);
    writer.add_document(doc.data(), doc.size());
  }
  writer.finish();
}

template <typename T>
void put(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const longtron::Error& e) {
    return e.what();
  }
  return "";
}

constexpr size_t kPointers = kHeader + 4 * 5;  // pointers of the five sequences
constexpr size_t kDocIdx = kPointers + 8 * 5;  // doc_idx[0..5]

}  // namespace

TEST(MegatronIndex, ValidFileReadsAllFiveDocuments) {
  TempDir dir;
  write_five(dir);
  const auto source = ld::open_megatron(dir / "x");
  ASSERT_EQ(source->num_documents(), 5u);
  EXPECT_EQ(source->document_length(4), 5u);
}

// Header count 5 where 6 entries (documents + 1) are needed: read 4 documents, dropped the last.
TEST(MegatronIndex, DocumentCountThatDisagreesIsRefusedSayingWhatItMeans) {
  TempDir dir;
  write_five(dir);
  std::string idx = read_file(dir / "x.idx");
  put<uint64_t>(idx, 26, 5);
  write_file(dir / "x.idx", idx);
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {"x.idx", "byte offset 26", "document index count 5", "documents + 1", "8 bytes"});
  put<uint64_t>(idx, 18, 4);  // sequence count one short as well
  put<uint64_t>(idx, 26, 6);
  write_file(dir / "x.idx", idx);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {"x.idx", "sequence count 4"});
}

TEST(MegatronIndex, TrailingBytesAreRefused) {
  TempDir dir;
  write_five(dir);
  const std::string idx = read_file(dir / "x.idx");
  write_file(dir / "x.idx", idx + std::string(8, '\0'));
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {"x.idx", std::to_string(idx.size() + 8) + " bytes", std::to_string(idx.size())});
  write_file(dir / "x.idx", idx);
  const std::string bin = read_file(dir / "x.bin");
  write_file(dir / "x.bin", bin + "zz");
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {"x.bin", std::to_string(bin.size() + 2) + " bytes", std::to_string(bin.size())});
}

// A uint16 pointer moved to an odd byte was accepted.
TEST(MegatronIndex, PointersMustBeAlignedAndFollowTheSizes) {
  TempDir dir;
  write_five(dir);
  const std::string idx = read_file(dir / "x.idx");
  std::string bad = idx;
  put<int64_t>(bad, kPointers + 8 * 2, 9);  // sequence 2 starts at byte 8 (3 + 1 tokens)
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {"x.idx", "sequence 2", "pointer 9", "multiple of 2"});
  bad = idx;
  put<int64_t>(bad, kPointers + 8 * 2, 6);  // aligned but overlapping sequence 1
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {"x.idx", "sequence 2", "pointer 6", "expected 8"});
  bad = idx;
  put<int32_t>(bad, kHeader + 4 * 1, 2);  // size of sequence 1 grows: sequence 2 then overlaps
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {"x.idx", "sequence 2", "expected 10"});
}

// Truncations printed "need 0 bytes after the header ... the file has 42".
TEST(MegatronIndex, TruncationSaysHowManyBytesAreNeeded) {
  TempDir dir;
  write_five(dir);
  const std::string idx = read_file(dir / "x.idx");
  const size_t need = 5 * 12 + 6 * 8;  // sizes + pointers, doc_idx
  for (size_t keep : {kHeader, kHeader + 42, kHeader + 70, idx.size() - 1}) {
    write_file(dir / "x.idx", idx.substr(0, keep));
    const std::string message = error_of([&] { ld::open_megatron(dir / "x"); });
    EXPECT_NE(message.find("need " + std::to_string(need) + " bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("has " + std::to_string(keep - kHeader)), std::string::npos) << message;
  }
  // Counts so large that the byte count overflows 64 bits are named without wrapping around.
  std::string bad = idx;
  put<uint64_t>(bad, 18, std::numeric_limits<uint64_t>::max() / 4);
  write_file(dir / "x.idx", bad);
  const std::string message = error_of([&] { ld::open_megatron(dir / "x"); });
  EXPECT_NE(message.find("sequence count " + std::to_string(std::numeric_limits<uint64_t>::max() / 4)),
            std::string::npos) << message;
  EXPECT_EQ(message.find("need 0"), std::string::npos) << message;
}

// A pointer near 2^63 printed a negative end offset (signed overflow).
TEST(MegatronIndex, HugePointersPrintNoNegativeOffsets) {
  TempDir dir;
  write_five(dir);
  const std::string idx = read_file(dir / "x.idx");
  std::string bad = idx;
  put<int64_t>(bad, kPointers + 8 * 4, std::numeric_limits<int64_t>::max() - 1);
  write_file(dir / "x.idx", bad);
  std::string message = error_of([&] { ld::open_megatron(dir / "x"); });
  EXPECT_NE(message.find("sequence 4"), std::string::npos) << message;
  EXPECT_NE(message.find("pointer 9223372036854775806"), std::string::npos) << message;
  // Look only past the file name: the temporary folder's name carries the process id.
  const std::string after_path = message.substr(message.find("x.idx"));
  EXPECT_EQ(after_path.find("-9"), std::string::npos) << message;
  for (int64_t ptr : {std::numeric_limits<int64_t>::min(), int64_t{-2}}) {
    put<int64_t>(bad, kPointers + 8 * 4, ptr);
    write_file(dir / "x.idx", bad);
    message = error_of([&] { ld::open_megatron(dir / "x"); });
    EXPECT_NE(message.find("sequence 4 has a negative pointer"), std::string::npos) << message;
  }
}

TEST(MegatronIndex, DocumentIndexRunsFromZeroToTheSequenceCount) {
  TempDir dir;
  write_five(dir);
  const std::string idx = read_file(dir / "x.idx");
  std::string bad = idx;
  put<int64_t>(bad, kDocIdx, 1);  // first document starts at sequence 1: sequence 0 unused
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {"x.idx", "byte offset " + std::to_string(kDocIdx), "entry 0 is 1", "expected 0"});
  bad = idx;
  put<int64_t>(bad, kDocIdx + 8 * 5, 4);  // last document ends before the last sequence
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {"x.idx", "entry 5 is 4", "expected 5"});
  bad = idx;
  put<int64_t>(bad, kDocIdx + 8 * 3, 1);  // decreasing
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {"x.idx", "entry 3 is 1", "non-decreasing"});
  bad = idx;
  put<int32_t>(bad, kHeader, -1);  // negative size
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {"x.idx", "negative size -1 of sequence 0"});
}
