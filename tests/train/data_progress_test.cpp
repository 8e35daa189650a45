// Progress of the start-up's passes over a dataset (checking token ids, building the row index):
// the data layer reports through data::ProgressHook, train::DataProgress prints it.
#include "train/data_progress.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "data/megatron.h"
#include "data/open.h"
#include "data/validate.h"
#include "packing/loader.h"
#include "packing/pack.h"
#include "test_util.h"

namespace longtron::train {
namespace {
namespace fs = std::filesystem;
using longtron::testing::TempDir;

// Two Megatron files of `docs` documents each (lengths 1..37, ids 1..99) in `dir`.
void write_dataset(const fs::path& dir, int docs) {
  for (int f = 0; f < 2; ++f) {
    data::MegatronWriter w(dir / ("part_" + std::to_string(f)), data::MegatronDtype::kUint16);
    std::vector<int32_t> tokens;
    for (int d = 0; d < docs; ++d) {
      tokens.resize(1 + (d * 7 + f) % 37);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 1 + int32_t((d + i * 13) % 99);
      w.add_document(tokens.data(), tokens.size());
    }
    w.finish();
  }
}

data::PackConfig pack_config() {
  data::PackConfig c;
  c.seq_len = 16;
  c.micro_bsz = 2;
  return c;
}

// Records what a pass reports.
struct Recorder final : data::ProgressHook {
  std::vector<std::string> begun;
  std::vector<int64_t> totals, updates;  // updates of the latest pass
  int ended = 0;
  void begin(const std::string& what, int64_t total, const std::string& unit) override {
    begun.push_back(what + " in " + unit);
    totals.push_back(total);
    updates.clear();
  }
  void update(int64_t done) override { updates.push_back(done); }
  void end() override { ++ended; }
};

// Each pass begins with the dataset's size in its unit, counts up to it and ends; the rows built
// with a hook are the rows built without one.
TEST(DataProgress, PassesReportTheirSizeAndCountUpToIt) {
  TempDir dir;
  write_dataset(dir.path(), 40000);  // > kProgressStepDocuments per file: updates inside a file
  const data::Dataset dataset = data::open_dataset(dir.path());
  Recorder r;
  data::validate_dataset(dataset, 100, &r);
  EXPECT_EQ(r.updates.back(), data::count_tokens(dataset));
  EXPECT_GT(r.updates.size(), 1u);  // every 2^20 tokens
  EXPECT_TRUE(std::is_sorted(r.updates.begin(), r.updates.end()));
  data::DatasetRows with(dataset, pack_config(), 0, true, 7, &r);
  ASSERT_EQ(r.begun, (std::vector<std::string>{"checking token ids in tokens",
                                                "building the row index in documents"}));
  EXPECT_EQ(r.totals[0], data::count_tokens(dataset));
  EXPECT_EQ(r.totals[1], 80000);
  EXPECT_EQ(r.ended, 2);
  EXPECT_EQ(r.updates.back(), 80000);
  EXPECT_TRUE(std::is_sorted(r.updates.begin(), r.updates.end()));
  EXPECT_GT(r.updates.size(), 4u);  // inside the files too, every 2^14 documents
  const data::DatasetRows without(dataset, pack_config(), 0, true, 7);
  ASSERT_EQ(with.num_rows(), without.num_rows());
  for (int64_t k = 0; k < with.num_rows(); k += 97) {
    const data::MicroBatch a = with.row(k), b = without.row(k);
    EXPECT_EQ(a.input_ids, b.input_ids);
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_EQ(a.cu_seqlens, b.cu_seqlens);
  }
}

// data.balance = "documents": the balanced packer's windows report, counting up without going back.
TEST(DataProgress, BalancedPackingCountsUpToTheDocuments) {
  TempDir dir;
  write_dataset(dir.path(), 40000);
  const data::Dataset dataset = data::open_dataset(dir.path());
  data::PackConfig config = pack_config();
  config.balance_window_rows = 8;
  Recorder r;
  const data::DatasetRows with(dataset, config, 0, true, 7, &r);
  ASSERT_EQ(r.totals, (std::vector<int64_t>{80000}));
  EXPECT_EQ(r.ended, 1);
  EXPECT_GT(r.updates.size(), 4u);  // inside the files too, every 2^14 documents
  EXPECT_TRUE(std::is_sorted(r.updates.begin(), r.updates.end()));
  EXPECT_EQ(r.updates.back(), 80000);
  const data::DatasetRows without(dataset, config, 0, true, 7);
  ASSERT_EQ(with.num_rows(), without.num_rows());
  for (int64_t k = 0; k < with.num_rows(); k += 89) {
    const data::MicroBatch a = with.row(k), b = without.row(k);
    EXPECT_EQ(a.input_ids, b.input_ids);
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_EQ(a.cu_seqlens, b.cu_seqlens);
  }
}

// Off a terminal (stderr captured), a dataset above the thresholds gets the start and end line of
// each pass and nothing else; below them, or on another rank, nothing.
TEST(DataProgress, OffATerminalStartAndEndLinesAboveTheThresholdsOnly) {
  TempDir dir;
  write_dataset(dir.path(), 3000);
  data::Dataset dataset = data::open_dataset(dir.path());
  const int64_t tokens = data::count_tokens(dataset);
  data::DataConfig config;
  config.pack = pack_config();

  ::testing::internal::CaptureStderr();
  {
    DataProgress shown("data.train_folder = x", true, /*min_tokens=*/tokens,
                       /*min_documents=*/6000);
    data::validate_dataset(dataset, 100, &shown);
    data::BatchLoader loader(std::move(dataset), config, 1, &shown);
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  EXPECT_EQ(out.rfind(fmt::format("data.train_folder = x: checking token ids: {} tokens\n", tokens),
                      0), 0u) << out;
  EXPECT_NE(out.find("data.train_folder = x: checking token ids: done in "), std::string::npos);
  EXPECT_NE(out.find("data.train_folder = x: building the row index: 6000 documents\n"),
            std::string::npos) << out;
  EXPECT_NE(out.find("data.train_folder = x: building the row index: done in "), std::string::npos);

  dataset = data::open_dataset(dir.path());
  ::testing::internal::CaptureStderr();
  {
    DataProgress small("small", true, tokens + 1, 6001);
    data::validate_dataset(dataset, 100, &small);
    const data::DatasetRows rows(dataset, pack_config(), 0, true, 7, &small);
    DataProgress other_rank("rank 1", false, 0, 0);
    data::validate_dataset(dataset, 100, &other_rank);
    const data::DatasetRows rows1(dataset, pack_config(), 0, true, 7, &other_rank);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace longtron::train
