// The worked examples of docs/data.md value for value (InternEvo's data-flow walkthrough).
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "core/error.h"
#include "data/megatron.h"
#include "data/memory_source.h"
#include "data/open.h"
#include "packing/loader.h"
#include "packing/pack.h"
#include "packing/sequence_split.h"
#include "packing/shuffle.h"
#include "packing/unpack.h"

namespace longtron::data {
namespace {

using V = std::vector<int32_t>;

MemorySource seed_packed_docs() {
  return MemorySource({{2323, 442, 252, 341},
                       {233, 3442, 322, 31, 2514, 49731, 51},
                       {4326, 427, 465, 22, 314, 9725, 346, 1343},
                       {24, 2562, 5, 25, 356}});
}

MemorySource seed_unpacked_docs() {
  return MemorySource({{2323, 442, 252, 341},
                       {233, 3442, 322, 31, 2514, 49731, 51},
                       {4326, 427, 465, 22, 314, 9725, 346, 1343},
                       {24, 2562, 5, 25, 356, 3145, 246, 25, 1451, 67, 73, 541, 265},
                       {4524, 2465, 562, 67, 26, 265, 21, 256, 145, 1345},
                       {34, 14}});
}

PackConfig cfg(int64_t L, int64_t B) {
  PackConfig c;
  c.seq_len = L;
  c.micro_bsz = B;
  return c;
}

std::vector<int64_t> in_order(const DocumentSource& s) { return document_order(s, 0, false, 0); }

TEST(Pack, WorkedExamplePackedTwoRows) {
  auto src = seed_packed_docs();
  auto rows = build_pack(src, in_order(src), cfg(8, 2));
  ASSERT_EQ(rows->num_rows(), 2);
  MicroBatch r0 = rows->row(0), r1 = rows->row(1);
  EXPECT_EQ(r0.input_ids, (V{2323, 442, 252, 341, 233, 3442, 322, 31, 2514, 49731, 51, 4326, 427,
                             465, 22, 314}));
  EXPECT_EQ(r0.labels, (V{442, 252, 341, -100, 3442, 322, 31, 2514, 49731, 51, -100, 427, 465, 22,
                          314, 9725}));
  EXPECT_EQ(r0.cu_seqlens, (V{0, 4, 11, 16}));
  EXPECT_EQ(r0.indexes, (V{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4}));
  EXPECT_EQ(r0.max_seqlen, 7);
  EXPECT_EQ(r1.input_ids, (V{9725, 346, 1343, 24, 2562, 5, 25, 356, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r1.labels, (V{346, 1343, -100, 2562, 5, 25, 356, -100, -100, -100, -100, -100, -100,
                          -100, -100, -100}));
  EXPECT_EQ(r1.cu_seqlens, (V{0, 3, 8, 16}));
  EXPECT_EQ(r1.indexes, (V{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r1.max_seqlen, 8);
}

TEST(Pack, DropTailAndShuffledOrder) {
  auto src = seed_packed_docs();
  PackConfig c = cfg(8, 2);
  c.pack_tail = PackTail::kDrop;
  EXPECT_EQ(build_pack(src, in_order(src), c)->num_rows(), 1);  // 24 // 16
  // NumPy RandomState(1024) (InternEvo's default data seed) orders the four documents d0, d2, d1, d3.
  auto order = document_order(src, 0, true, 1024);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 2, 1, 3}));
  MicroBatch r0 = build_pack(src, order, c)->row(0);
  EXPECT_EQ(r0.input_ids, (V{2323, 442, 252, 341, 4326, 427, 465, 22, 314, 9725, 346, 1343, 233,
                             3442, 322, 31}));
  EXPECT_EQ(r0.labels, (V{442, 252, 341, -100, 427, 465, 22, 314, 9725, 346, 1343, -100, 3442, 322,
                          31, 2514}));
  EXPECT_EQ(r0.cu_seqlens, (V{0, 4, 12, 16}));
  // pack_sample_into_one (InternEvo PackedDatasetWithoutCuSeqlen): labels -100 at the row end too,
  // fixed windows.
  c.pack_sample_into_one = true;
  MicroBatch one = build_pack(src, order, c)->row(0);
  EXPECT_EQ(one.input_ids, r0.input_ids);
  EXPECT_EQ(one.labels, (V{442, 252, 341, -100, 427, 465, 22, 314, 9725, 346, 1343, -100, 3442,
                           322, 31, -100}));
  EXPECT_EQ(one.cu_seqlens, (V{0, 8, 16}));
  EXPECT_EQ(one.indexes, (V{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(one.max_seqlen, 8);
}

TEST(Pack, ShuffleVectors) {
  EXPECT_EQ(numpy_permutation(4, 1024), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(numpy_permutation(10, 1024), (std::vector<int64_t>{2, 3, 7, 0, 6, 8, 5, 4, 9, 1}));
}

TEST(Pack, NineTokenExtensionRowOne) {
  // A 9-token document after the example's four: row 1 cuts it to 8.
  MemorySource src({{2323, 442, 252, 341},
                    {233, 3442, 322, 31, 2514, 49731, 51},
                    {4326, 427, 465, 22, 314, 9725, 346, 1343},
                    {24, 2562, 5, 25, 356},
                    {1, 2, 3, 4, 5, 6, 7, 8, 9}});
  MicroBatch r1 = build_pack(src, in_order(src), cfg(8, 2))->row(1);
  EXPECT_EQ(r1.input_ids, (V{9725, 346, 1343, 24, 2562, 5, 25, 356, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(r1.labels, (V{346, 1343, -100, 2562, 5, 25, 356, -100, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(r1.cu_seqlens, (V{0, 3, 8, 16}));
  EXPECT_EQ(r1.indexes, (V{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Pack, NegativeIdsAndNonPositiveLabels) {
  // docs/data.md: the model reads abs(id); a label whose target id is <= 0 is -100.
  MemorySource src({{-5, -6, 7, 0, 9}});
  MicroBatch r = build_pack(src, in_order(src), cfg(8, 1))->row(0);
  EXPECT_EQ(r.input_ids, (V{5, 6, 7, 0, 9, 0, 0, 0}));
  EXPECT_EQ(r.labels, (V{-100, 7, -100, 9, -100, -100, -100, -100}));
  MicroBatch u = build_unpack(src, in_order(src), cfg(8, 1))->row(0);
  EXPECT_EQ(u.input_ids, r.input_ids);
  EXPECT_EQ(u.labels, r.labels);
}

TEST(Pack, WorkedExampleUnpackedRowsAndUnpackData) {
  auto src = seed_unpacked_docs();
  auto rows = build_unpack(src, in_order(src), cfg(8, 2));
  ASSERT_EQ(rows->num_rows(), 3);
  MicroBatch r0 = rows->row(0), r1 = rows->row(1), r2 = rows->row(2);
  EXPECT_EQ(r0.input_ids,
            (V{2323, 442, 252, 341, 233, 3442, 322, 31, 2514, 49731, 51, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r1.input_ids, (V{4326, 427, 465, 22, 314, 9725, 346, 1343, 24, 2562, 5, 25, 356, 3145,
                             246, 25}));
  EXPECT_EQ(r2.input_ids,
            (V{4524, 2465, 562, 67, 26, 265, 21, 256, 34, 14, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r0.labels, (V{442, 252, 341, -100, 3442, 322, 31, 2514, 49731, 51, -100, -100, -100,
                          -100, -100, -100}));
  EXPECT_EQ(r1.labels, (V{427, 465, 22, 314, 9725, 346, 1343, -100, 2562, 5, 25, 356, 3145, 246,
                          25, -100}));
  EXPECT_EQ(r2.labels, (V{2465, 562, 67, 26, 265, 21, 256, -100, 14, -100, -100, -100, -100, -100,
                          -100, -100}));
  EXPECT_EQ(r0.cu_seqlens, (V{0, 4, 11, 16}));
  EXPECT_EQ(r1.cu_seqlens, (V{0, 8, 16}));
  EXPECT_EQ(r2.cu_seqlens, (V{0, 8, 10, 16}));

  UnpackedBatch u = unpack_data(r0, 2, 8);
  EXPECT_EQ(u.input_ids, (V{2323, 442, 252, 341, 0, 0, 0, 0, 233, 3442, 322, 31, 2514, 49731, 51, 0}));
  EXPECT_EQ(u.labels, (V{442, 252, 341, -100, -100, -100, -100, -100, 3442, 322, 31, 2514, 49731,
                         51, -100, -100}));
  // ISP split, tp size 2, on the L dimension (InternEvo's split_data_sequence_parallel).
  UnpackedBatch s0 = split_for_sequence_parallel(u, 2, 0), s1 = split_for_sequence_parallel(u, 2, 1);
  EXPECT_EQ(s0.input_ids, (V{2323, 442, 252, 341, 233, 3442, 322, 31}));
  EXPECT_EQ(s0.labels, (V{442, 252, 341, -100, 3442, 322, 31, 2514}));
  EXPECT_EQ(s1.input_ids, (V{0, 0, 0, 0, 2514, 49731, 51, 0}));
  EXPECT_EQ(s1.labels, (V{-100, -100, -100, -100, 49731, 51, -100, -100}));
  // A last group with one document: row 1 of unpack_data is all pad.
  MemorySource three({{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10, 11, 12, 13, 14, 15}});
  MicroBatch last = build_unpack(three, in_order(three), cfg(8, 2))->row(1);
  EXPECT_EQ(last.cu_seqlens, (V{0, 8, 16}));
  UnpackedBatch ul = unpack_data(last, 2, 8);
  EXPECT_EQ(ul.input_ids, (V{6, 7, 8, 9, 10, 11, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ul.labels, (V{7, 8, 9, 10, 11, 12, 13, -100, -100, -100, -100, -100, -100, -100, -100, -100}));
}

TEST(Pack, WorkedExampleMicroNumBatchViewAndIspSplit) {
  Dataset ds;
  ds.push_back(std::make_unique<MemorySource>(seed_packed_docs()));
  DataConfig c;
  c.pack = cfg(8, 2);
  c.micro_num = 2;
  c.shuffle = false;
  BatchLoader loader(std::move(ds), c, 1);
  auto batch = loader.step(0, 0);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].cu_seqlens, (V{0, 4, 11, 16}));
  EXPECT_EQ(batch[1].cu_seqlens, (V{0, 3, 8, 16}));
  EXPECT_EQ(batch[0].indexes, (V{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4}));
  EXPECT_EQ(batch[1].indexes, (V{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}));
  MicroBatch m = batch[0];
  packed_data_normalizer(m);
  EXPECT_EQ(m.max_seqlen, 7);
  MicroBatch t0 = split_for_sequence_parallel(m, 2, 0), t1 = split_for_sequence_parallel(m, 2, 1);
  EXPECT_EQ(t0.input_ids, (V{2323, 442, 252, 341, 233, 3442, 322, 31}));
  EXPECT_EQ(t0.indexes, (V{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(t0.labels, (V{442, 252, 341, -100, 3442, 322, 31, 2514}));
  EXPECT_EQ(t1.input_ids, (V{2514, 49731, 51, 4326, 427, 465, 22, 314}));
  EXPECT_EQ(t1.indexes, (V{4, 5, 6, 0, 1, 2, 3, 4}));
  EXPECT_EQ(t1.labels, (V{49731, 51, -100, 427, 465, 22, 314, 9725}));
  EXPECT_EQ(t1.cu_seqlens, (V{0, 4, 11, 16}));
  EXPECT_EQ(t1.max_seqlen, 7);
}

TEST(Pack, SeveralFilesNeverShareARow) {
  Dataset ds;
  ds.push_back(std::make_unique<MemorySource>(MemorySource({{1, 2, 3}}, "a.bin")));
  ds.push_back(std::make_unique<MemorySource>(MemorySource({{4, 5, 6, 7, 8}}, "b.bin")));
  DatasetRows rows(ds, cfg(4, 1), 0, false, 1024);
  ASSERT_EQ(rows.num_rows(), 3);  // [1 2 3 pad] [4 5 6 7] [8 pad pad pad]
  EXPECT_EQ(rows.row(0).input_ids, (V{1, 2, 3, 0}));
  EXPECT_EQ(rows.row(1).input_ids, (V{4, 5, 6, 7}));
  EXPECT_EQ(rows.row(1).labels, (V{5, 6, 7, 8}));
  EXPECT_EQ(rows.row(2).input_ids, (V{8, 0, 0, 0}));
  EXPECT_EQ(rows.row(2).cu_seqlens, (V{0, 1, 4}));
  // min_length drops documents before anything else.
  DatasetRows longer(ds, cfg(4, 1), 4, false, 1024);
  EXPECT_EQ(longer.num_rows(), 2);
  EXPECT_EQ(longer.row(0).input_ids, (V{4, 5, 6, 7}));
}

TEST(Pack, IntoOnePaddedTailKeepsFixedWindows) {
  // 20 tokens, L 8, B 2: row 1 holds the last 4 tokens, then the pad inside the fixed windows.
  MemorySource src({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}});
  PackConfig c = cfg(8, 2);
  c.pack_sample_into_one = true;
  auto rows = build_pack(src, in_order(src), c);
  ASSERT_EQ(rows->num_rows(), 2);
  EXPECT_EQ(rows->row(0).labels.back(), -100);  // row end of a continued document
  MicroBatch r1 = rows->row(1);
  EXPECT_EQ(r1.input_ids, (V{17, 18, 19, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r1.labels, (V{18, 19, 20, -100, -100, -100, -100, -100, -100, -100, -100, -100, -100,
                          -100, -100, -100}));
  EXPECT_EQ(r1.cu_seqlens, (V{0, 8, 16}));
}

TEST(Pack, MegatronFolderGivesTheSameRowsAsMemory) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("longtron_pack_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::vector<int32_t>> a = {{5, 6, 7}, {8, 9, 10, 11, 12}, {13}};
  std::vector<std::vector<int32_t>> b = {{20, 21, 22, 23, 24, 25, 26, 27, 28}};
  for (const auto& [name, docs] : {std::pair{"a", a}, std::pair{"b", b}}) {
    MegatronWriter w(dir / name, MegatronDtype::kUint16);
    for (const auto& d : docs) w.add_document(d.data(), d.size());
    w.finish();
  }
  Dataset mapped = open_dataset(dir);
  Dataset memory;
  memory.push_back(std::make_unique<MemorySource>(a));
  memory.push_back(std::make_unique<MemorySource>(b));
  ASSERT_EQ(mapped.size(), 2u);
  for (bool packed : {true, false}) {
    PackConfig c = cfg(3, 2);
    c.use_packed_dataset = packed;
    DatasetRows x(mapped, c, 0, true, 1024), y(memory, c, 0, true, 1024);
    ASSERT_EQ(x.num_rows(), y.num_rows());
    for (int64_t k = 0; k < x.num_rows(); ++k) {
      EXPECT_EQ(x.row(k).input_ids, y.row(k).input_ids);
      EXPECT_EQ(x.row(k).labels, y.row(k).labels);
      EXPECT_EQ(x.row(k).cu_seqlens, y.row(k).cu_seqlens);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Pack, BadInput) {
  auto src = seed_packed_docs();
  EXPECT_THROW(build_pack(src, in_order(src), cfg(0, 2)), Error);
  EXPECT_THROW(build_unpack(src, in_order(src), cfg(8, -1)), Error);
  try {
    build_pack(src, in_order(src), cfg(8, 0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.micro_bsz"), std::string::npos);
  }
  Dataset empty;
  empty.push_back(std::make_unique<MemorySource>(std::vector<std::vector<int32_t>>{}, "e.bin"));
  EXPECT_THROW(DatasetRows(empty, cfg(8, 2), 0, false, 1), Error);
  Dataset none;
  EXPECT_THROW(DatasetRows(none, cfg(8, 2), 0, false, 1), Error);
  MicroBatch r = build_pack(src, in_order(src), cfg(8, 2))->row(0);
  try {
    split_for_sequence_parallel(r, 3, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pad_for_sequence_parallel"), std::string::npos);
  }
  EXPECT_THROW(split_for_sequence_parallel(r, 2, 2), Error);
  EXPECT_THROW(build_pack(src, in_order(src), cfg(8, 2))->row(2), Error);
  EXPECT_THROW(parse_pack_tail("zero"), Error);
}

}  // namespace
}  // namespace longtron::data
