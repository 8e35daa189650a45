// Round trips and bad inputs of the tokenized readers: Megatron .idx/.bin (every dtype code,
// multi-sequence documents) and InternEvo .bin/.bin.meta ((N,2), (N,3), int32, missing meta).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"
#include "data/internevo.h"
#include "data/megatron.h"
#include "data/npy.h"
#include "data/open.h"
#include "data/validate.h"
#include "expect_error.h"
#include "test_util.h"

namespace ld = longtron::data;
using longtron::Error;
using longtron::testing::read_file;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

std::vector<int32_t> read_doc(const ld::DocumentSource& source, size_t i) {
  std::vector<int32_t> out(source.document_length(i));
  source.read_tokens(i, 0, out.size(), out.data());
  return out;
}

std::vector<std::vector<int32_t>> random_docs(int n, int max_len, int32_t lo, int32_t hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::vector<int32_t>> docs(n);
  for (auto& d : docs) {
    d.resize(1 + gen() % max_len);
    const auto span = static_cast<uint64_t>(int64_t{hi} - lo);  // hi - lo may not fit an int32
    for (auto& t : d) t = static_cast<int32_t>(lo + static_cast<int64_t>(gen() % span));
  }
  return docs;
}

// Expects `f` to throw Error whose message contains every one of `parts`.
using longtron::testing::expect_error;

void write_megatron(const std::filesystem::path& prefix, const std::vector<std::vector<int32_t>>& docs,
                    ld::MegatronDtype dtype) {
  ld::MegatronWriter writer(prefix, dtype);
  for (const auto& d : docs) writer.add_document(d.data(), d.size());
  writer.finish();
}

void write_internevo(const std::filesystem::path& bin, const std::vector<std::vector<int32_t>>& docs) {
  ld::InternEvoWriter writer(bin);
  for (const auto& d : docs) writer.add_document(d.data(), d.size());
  writer.finish();
}

}  // namespace

TEST(Megatron, RoundTripEveryDtype) {
  struct Case { ld::MegatronDtype dtype; int32_t lo, hi; };
  const Case cases[] = {{ld::MegatronDtype::kUint8, 0, 255},      {ld::MegatronDtype::kInt8, -128, 127},
                        {ld::MegatronDtype::kInt16, -32768, 32767}, {ld::MegatronDtype::kInt32, -2000000000, 2000000000},
                        {ld::MegatronDtype::kInt64, -2000000000, 2000000000},
                        {ld::MegatronDtype::kFloat64, -100000, 100000}, {ld::MegatronDtype::kFloat32, -100000, 100000},
                        {ld::MegatronDtype::kUint16, 0, 65535}};
  for (const auto& c : cases) {
    TempDir dir;
    const auto docs = random_docs(7, 40, c.lo, c.hi, static_cast<unsigned>(c.dtype));
    write_megatron(dir / "x", docs, c.dtype);
    const auto source = ld::open_megatron(dir / "x");
    EXPECT_EQ(std::filesystem::file_size(dir / "x.bin"),
              [&] { size_t n = 0; for (auto& d : docs) n += d.size(); return n; }() * ld::megatron_dtype_size(c.dtype));
    ASSERT_EQ(source->num_documents(), docs.size());
    for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(read_doc(*source, i), docs[i]) << int(c.dtype);
    // A sub-range read.
    std::vector<int32_t> part(2);
    if (docs[1].size() >= 3) {
      source->read_tokens(1, 1, 2, part.data());
      EXPECT_EQ(part, (std::vector<int32_t>{docs[1][1], docs[1][2]}));
    }
  }
}

TEST(Megatron, DocumentsOfSeveralSequences) {
  TempDir dir;
  ld::MegatronWriter writer(dir / "m", ld::MegatronDtype::kInt32);
  const std::vector<int64_t> a{1, 2, 3}, b{4, 5}, c{6}, d{7, 8, 9, 10};
  writer.add_sequence(a.data(), a.size());
  writer.add_sequence(b.data(), b.size());
  writer.end_document();
  writer.add_sequence(c.data(), c.size());
  writer.end_document();
  writer.add_sequence(d.data(), d.size());
  writer.add_sequence(c.data(), c.size());
  writer.add_sequence(a.data(), a.size());
  writer.end_document();
  writer.finish();
  const auto source = ld::open_megatron(dir / "m");
  ASSERT_EQ(source->num_documents(), 3u);
  EXPECT_EQ(read_doc(*source, 0), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(read_doc(*source, 1), (std::vector<int32_t>{6}));
  EXPECT_EQ(read_doc(*source, 2), (std::vector<int32_t>{7, 8, 9, 10, 6, 1, 2, 3}));
  std::vector<int32_t> part(4);
  source->read_tokens(2, 3, 4, part.data());  // crosses two sequence boundaries
  EXPECT_EQ(part, (std::vector<int32_t>{10, 6, 1, 2}));
}

TEST(Megatron, NonIntegerOrOutOfRangeTokensAreErrors) {
  TempDir dir;
  {
    ld::MegatronWriter writer(dir / "i", ld::MegatronDtype::kInt64);
    const std::vector<int64_t> tokens{1, int64_t{1} << 40};
    writer.add_sequence(tokens.data(), tokens.size());
    writer.end_document();
    writer.finish();
  }
  const auto wide = ld::open_megatron(dir / "i");
  expect_error([&] { read_doc(*wide, 0); }, {(dir / "i.bin").string(), "byte offset 8", "int32"});
  // A float32 .bin with 2.5 in it: write integers, then patch the bytes.
  {
    ld::MegatronWriter writer(dir / "f", ld::MegatronDtype::kFloat32);
    const std::vector<int64_t> tokens{4, 5, 6};
    writer.add_sequence(tokens.data(), tokens.size());
    writer.end_document();
    writer.finish();
  }
  std::string bin = read_file(dir / "f.bin");
  const float half = 2.5f;
  std::memcpy(bin.data() + 4, &half, 4);
  write_file(dir / "f.bin", bin);
  const auto real = ld::open_megatron(dir / "f");
  expect_error([&] { read_doc(*real, 0); }, {(dir / "f.bin").string(), "byte offset 4"});
}

TEST(Megatron, PrepareDtypeFollowsVocabulary) {
  EXPECT_EQ(ld::megatron_dtype_for_vocab(8192), ld::MegatronDtype::kUint16);
  EXPECT_EQ(ld::megatron_dtype_for_vocab(65499), ld::MegatronDtype::kUint16);
  EXPECT_EQ(ld::megatron_dtype_for_vocab(65500), ld::MegatronDtype::kInt32);
  EXPECT_EQ(ld::megatron_dtype_for_vocab(92544), ld::MegatronDtype::kInt32);
}

// A Megatron .bin opened without its .idx is named as such (not as a bad JSON line).
TEST(Megatron, BinWithoutIndexNamesTheMissingIdx) {
  TempDir dir;
  write_megatron(dir / "x", random_docs(3, 20, 0, 100, 5), ld::MegatronDtype::kUint16);
  std::filesystem::remove(dir / "x.idx");
  expect_error([&] { ld::open_dataset(dir / "x.bin"); }, {(dir / "x.bin").string(), "x.idx is missing"});
}

TEST(Megatron, BadIndexErrorsNameFileAndOffset) {
  TempDir dir;
  write_megatron(dir / "x", random_docs(5, 20, 0, 100, 3), ld::MegatronDtype::kUint16);
  const std::string idx = read_file(dir / "x.idx");
  const auto idx_path = (dir / "x.idx").string();

  write_file(dir / "x.idx", idx.substr(0, idx.size() - 5));  // truncated doc_idx
  expect_error([&] { ld::open_megatron(dir / "x"); }, {idx_path, "truncated", "byte offset 34"});
  write_file(dir / "x.idx", idx.substr(0, 20));  // truncated header
  expect_error([&] { ld::open_megatron(dir / "x"); }, {idx_path, "truncated header"});

  std::string bad = idx;
  bad[0] = 'X';
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {idx_path, "byte offset 0", "magic"});

  bad = idx;
  bad[9] = 2;
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {idx_path, "byte offset 9", "version"});

  bad = idx;
  bad[17] = 9;
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); }, {idx_path, "byte offset 17", "dtype"});

  // .bin shorter than the pointers say.
  write_file(dir / "x.idx", idx);
  const std::string bin = read_file(dir / "x.bin");
  write_file(dir / "x.bin", bin.substr(0, bin.size() - 2));
  expect_error([&] { ld::open_megatron(dir / "x"); }, {idx_path, "sequence 4", (dir / "x.bin").string()});

  // doc_idx pointing past the sequences.
  write_file(dir / "x.bin", bin);
  bad = idx;
  const int64_t too_far = 99;
  std::memcpy(bad.data() + bad.size() - 8, &too_far, 8);
  write_file(dir / "x.idx", bad);
  expect_error([&] { ld::open_megatron(dir / "x"); },
               {idx_path, "byte offset " + std::to_string(idx.size() - 8), "document index entry 5"});
}

TEST(InternEvo, RoundTripWithMeta) {
  TempDir dir;
  const auto docs = random_docs(20, 50, -5, 90000, 5);
  write_internevo(dir / "a.bin", docs);
  const auto meta = ld::read_npy_int_matrix(dir / "a.bin.meta");
  EXPECT_EQ(meta.rows, 20);
  EXPECT_EQ(meta.cols, 2);
  const auto source = ld::open_internevo(dir / "a.bin");
  ASSERT_EQ(source->num_documents(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(source->document_length(i), docs[i].size());
    EXPECT_EQ(read_doc(*source, i), docs[i]);
  }
  if (docs[3].size() >= 4) {
    std::vector<int32_t> part(2);
    source->read_tokens(3, 2, 2, part.data());
    EXPECT_EQ(part, (std::vector<int32_t>{docs[3][2], docs[3][3]}));
  }
}

TEST(InternEvo, ThreeColumnInt32MetaAndMissingMeta) {
  TempDir dir;
  const auto docs = random_docs(6, 30, 0, 1000, 6);
  write_internevo(dir / "a.bin", docs);
  const auto two = ld::read_npy_int_matrix(dir / "a.bin.meta");
  std::vector<int64_t> three;
  for (int64_t r = 0; r < two.rows; ++r) {
    three.push_back(two.at(r, 0));
    three.push_back(two.at(r, 1));
    three.push_back(r);
  }
  ld::write_npy_int_matrix(dir / "a.bin.meta", three, two.rows, 3, /*int64=*/false);
  auto source = ld::open_internevo(dir / "a.bin");
  ASSERT_EQ(source->num_documents(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(read_doc(*source, i), docs[i]);

  std::filesystem::remove(dir / "a.bin.meta");
  // Blank lines and lines with extra keys / other spacing are accepted when scanning.
  write_file(dir / "a.bin", read_file(dir / "a.bin") + "\n{ \"id\": 7, \"tokens\" :[1,2 , 3] }\n");
  source = ld::open_internevo(dir / "a.bin");
  ASSERT_EQ(source->num_documents(), docs.size() + 1);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(read_doc(*source, i), docs[i]);
  EXPECT_EQ(read_doc(*source, docs.size()), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(std::filesystem::exists(dir / "a.bin.meta"));  // never written beside the data
}

TEST(InternEvo, BadInputsNameFileAndLine) {
  TempDir dir;
  const auto bin = (dir / "a.bin").string();
  write_file(dir / "a.bin", "{\"tokens\": [1, 2]}\n{\"text\": \"hi\"}\n");
  expect_error([&] { ld::open_internevo(dir / "a.bin"); }, {bin, "line 2", "byte offset 19", "tokens"});
  write_file(dir / "a.bin", "{\"tokens\": [1, 2.5]}\n");
  expect_error([&] { ld::open_internevo(dir / "a.bin"); }, {bin, "line 1"});
  write_file(dir / "a.bin", "{\"tokens\": [1, 2]\n");
  expect_error([&] { ld::open_internevo(dir / "a.bin"); }, {bin, "line 1"});

  // A meta whose length disagrees with its line: reported when the line is read.
  write_file(dir / "a.bin", "{\"tokens\": [1, 2]}\n{\"tokens\": [3, 4, 5]}\n");
  ld::write_npy_int_matrix(dir / "a.bin.meta", {0, 2, 19, 4}, 2, 2);
  const auto source = ld::open_internevo(dir / "a.bin");
  EXPECT_EQ(read_doc(*source, 0), (std::vector<int32_t>{1, 2}));
  expect_error([&] { read_doc(*source, 1); }, {bin, "line 2", "byte offset 19", "3 tokens", "says 4"});

  // Meta offset outside the .bin, wrong shape, not an .npy.
  ld::write_npy_int_matrix(dir / "a.bin.meta", {0, 2, 900, 3}, 2, 2);
  expect_error([&] { ld::open_internevo(dir / "a.bin"); }, {bin + ".meta", "row 1", "900"});
  ld::write_npy_int_matrix(dir / "a.bin.meta", {0, 2, 19, 3}, 1, 4);
  expect_error([&] { ld::open_internevo(dir / "a.bin"); }, {bin + ".meta", "(1, 4)"});
  write_file(dir / "a.bin.meta", "not numpy");
  expect_error([&] { ld::open_internevo(dir / "a.bin"); }, {bin + ".meta", "byte offset 0"});
}

TEST(OpenDataset, FolderInSortedOrderMixedFormats) {
  TempDir dir;
  std::filesystem::create_directories(dir / "sub");
  write_internevo(dir / "b.bin", {{5, 6}});
  write_megatron(dir / "a", {{1, 2}, {3}}, ld::MegatronDtype::kUint16);
  write_megatron(dir / "sub" / "c", {{7, 8, 9}}, ld::MegatronDtype::kInt32);
  write_file(dir / "dataset.json", "{}");
  write_file(dir / "tokenizer.model", "x");
  const auto dataset = ld::open_dataset(dir.path());
  ASSERT_EQ(dataset.size(), 3u);
  EXPECT_EQ(dataset[0]->path(), dir / "a.bin");
  EXPECT_EQ(dataset[1]->path(), dir / "b.bin");
  EXPECT_EQ(dataset[2]->path(), dir / "sub" / "c.bin");
  EXPECT_EQ(read_doc(*dataset[0], 1), (std::vector<int32_t>{3}));
  EXPECT_EQ(read_doc(*dataset[1], 0), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(ld::count_documents(dataset), 4);
  EXPECT_EQ(ld::count_tokens(dataset), 8);
  // Single files: the .idx, the Megatron .bin, the InternEvo .bin.
  EXPECT_EQ(ld::open_dataset(dir / "a.idx").at(0)->num_documents(), 2u);
  EXPECT_EQ(ld::open_dataset(dir / "a.bin").at(0)->num_documents(), 2u);
  EXPECT_EQ(ld::open_dataset(dir / "b.bin").at(0)->num_documents(), 1u);
}

TEST(OpenDataset, EmptyMissingAndUnreadable) {
  TempDir dir;
  write_file(dir / "notes.txt", "hello");
  expect_error([&] { ld::open_dataset(dir.path()); }, {dir.path().string(), "no documents"});
  expect_error([&] { ld::open_dataset(dir / "nope"); }, {"nope", "no such file"});
  expect_error([&] { ld::open_dataset(dir / "notes.txt"); }, {"notes.txt", "not a tokenized"});
  write_file(dir / "a.bin", "{\"tokens\": [1]}\n");
  std::filesystem::permissions(dir / "a.bin", std::filesystem::perms::none);
  if (!std::ifstream(dir / "a.bin").good()) {  // root can read anything: skip there
    expect_error([&] { ld::open_dataset(dir.path()); }, {"a.bin", "cannot open"});
  }
  std::filesystem::permissions(dir / "a.bin", std::filesystem::perms::owner_all);
  std::filesystem::create_directory(dir / "d.bin");  // a folder named like data: not a regular file
  expect_error([&] { ld::open_internevo(dir / "d.bin"); }, {"d.bin", "not a readable regular file"});
}

TEST(ValidateDataset, TokenOutsideVocabularyAndEmptyDocument) {
  TempDir dir;
  write_internevo(dir / "a.bin", {{1, 2, 3}, {4, -99, 5}});
  auto dataset = ld::open_dataset(dir.path());
  EXPECT_NO_THROW(ld::validate_dataset(dataset, 100));
  expect_error([&] { ld::validate_dataset(dataset, 99); },
               {(dir / "a.bin").string(), "document 1", "token 1", "-99", "99 ids"});
  write_internevo(dir / "a.bin", {{1, 2, 3}, {}});
  dataset = ld::open_dataset(dir.path());
  expect_error([&] { ld::validate_dataset(dataset, 100); }, {(dir / "a.bin").string(), "document 1", "empty"});
}
