// `longtron inspect` end to end on the worked example of docs/data.md (any dataset format via
// open_dataset).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace longtron::testing {
namespace {

using nlohmann::json;
using V = std::vector<int32_t>;

const char* kExamplePacked =
    "{\"tokens\": [2323, 442, 252, 341]}\n"
    "{\"tokens\": [233, 3442, 322, 31, 2514, 49731, 51]}\n"
    "{\"tokens\": [4326, 427, 465, 22, 314, 9725, 346, 1343]}\n"
    "{\"tokens\": [24, 2562, 5, 25, 356]}\n";

const char* kExampleUnpacked =
    "{\"tokens\": [2323, 442, 252, 341]}\n"
    "{\"tokens\": [233, 3442, 322, 31, 2514, 49731, 51]}\n"
    "{\"tokens\": [4326, 427, 465, 22, 314, 9725, 346, 1343]}\n"
    "{\"tokens\": [24, 2562, 5, 25, 356, 3145, 246, 25, 1451, 67, 73, 541, 265]}\n"
    "{\"tokens\": [4524, 2465, 562, 67, 26, 265, 21, 256, 145, 1345]}\n"
    "{\"tokens\": [34, 14]}\n";

json inspect(const TempDir& dir, const std::string& flags) {
  auto r = run_longtron("inspect --data " + (dir / "d.bin").string() + " " + flags + " --json");
  EXPECT_EQ(r.status, 0) << r.output;
  return json::parse(r.output);
}

TEST(Inspect, ExamplePackedBatchAsJsonAndText) {
  TempDir dir;
  write_file(dir / "d.bin", kExamplePacked);
  json j = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 2");
  const auto& mbs = j["steps"][0]["micro_batches"];
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(mbs[0]["cu_seqlens"].get<V>(), (V{0, 4, 11, 16}));
  EXPECT_EQ(mbs[0]["max_seqlen"], 7);
  EXPECT_EQ(mbs[1]["input_ids"].get<V>(),
            (V{9725, 346, 1343, 24, 2562, 5, 25, 356, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(mbs[1]["indexes"].get<V>(), (V{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}));
  auto text = run_longtron("inspect --data " + (dir / "d.bin").string() +
                           " --seq-len 8 --micro-bsz 2 --micro-num 2");
  ASSERT_EQ(text.status, 0);
  EXPECT_NE(text.output.find("batch_data[0]['cu_seqlens']:\ntensor([[0, 4, 11, 16],\n"
                             "        [0, 3, 8, 16]])"),
            std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("data['max_seqlen']:\n7\n"), std::string::npos);
}

TEST(Inspect, ExampleIspSplitAndShuffle) {
  TempDir dir;
  write_file(dir / "d.bin", kExamplePacked);
  json j = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 1 --sp-size 2 --sp-rank 1");
  const auto& mb = j["steps"][0]["micro_batches"][0];
  EXPECT_EQ(mb["input_ids"].get<V>(), (V{2514, 49731, 51, 4326, 427, 465, 22, 314}));
  EXPECT_EQ(mb["indexes"].get<V>(), (V{4, 5, 6, 0, 1, 2, 3, 4}));
  EXPECT_EQ(mb["labels"].get<V>(), (V{49731, 51, -100, 427, 465, 22, 314, 9725}));
  EXPECT_EQ(mb["cu_seqlens"].get<V>(), (V{0, 4, 11, 16}));
  // --shuffle: seed 1024 orders the documents d0, d2, d1, d3 (one row with --pack-tail drop).
  json s = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 1 --shuffle --pack-tail drop");
  EXPECT_EQ(s["steps"][0]["micro_batches"][0]["cu_seqlens"].get<V>(), (V{0, 4, 12, 16}));
}

TEST(Inspect, ExampleUnpackedWithSplit) {
  TempDir dir;
  write_file(dir / "d.bin", kExampleUnpacked);
  json j = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 3 --unpacked");
  const auto& mbs = j["steps"][0]["micro_batches"];
  ASSERT_EQ(mbs.size(), 3u);
  EXPECT_EQ(mbs[2]["cu_seqlens"].get<V>(), (V{0, 8, 10, 16}));
  EXPECT_EQ(mbs[0]["unpacked"]["input_ids"].get<std::vector<V>>(),
            (std::vector<V>{{2323, 442, 252, 341, 0, 0, 0, 0}, {233, 3442, 322, 31, 2514, 49731, 51, 0}}));
  json r1 = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 1 --unpacked --sp-size 2 --sp-rank 1");
  const auto& u = r1["steps"][0]["micro_batches"][0]["unpacked"];
  EXPECT_EQ(u["input_ids"].get<std::vector<V>>(), (std::vector<V>{{0, 0, 0, 0}, {2514, 49731, 51, 0}}));
  EXPECT_EQ(u["labels"].get<std::vector<V>>(),
            (std::vector<V>{{-100, -100, -100, -100}, {49731, 51, -100, -100}}));
}

TEST(Inspect, ContextRanksOfEveryBalance) {
  TempDir dir;
  write_file(dir / "d.bin", kExamplePacked);
  // Row 0 is {0, 4, 11, 16}; zigzag C = 2 cuts it in 4 chunks of 4: rank 0 chunks 0 and 3.
  json z = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 2");
  const auto& ranks = z["steps"][0]["micro_batches"][0]["cp_ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0]["positions"].get<V>(), (V{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(ranks[1]["positions"].get<V>(), (V{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(ranks[0]["attention_work"], 1 + 2 + 3 + 4 + 2 + 3 + 4 + 5);
  EXPECT_EQ(ranks[1]["attention_work"], 1 + 2 + 3 + 4 + 5 + 6 + 7 + 1);
  EXPECT_NEAR(z["steps"][0]["micro_batches"][0]["cp_imbalance"].get<double>(), 29.0 / 26.5, 1e-12);
  json c = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 2 --cp-balance contiguous");
  EXPECT_EQ(c["steps"][0]["micro_batches"][0]["cp_ranks"][1]["positions"].get<V>(),
            (V{8, 9, 10, 11, 12, 13, 14, 15}));
  // C = 3 pads the row to 18 (its own segment); every balance holds 6 positions per rank.
  for (const char* b : {"contiguous", "zigzag", "document"}) {
    json d = inspect(dir, std::string("--seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 3 "
                                      "--cp-balance ") + b);
    int64_t total = 0;
    for (const auto& r : d["steps"][0]["micro_batches"][0]["cp_ranks"]) {
      EXPECT_EQ(r["positions"].size(), 6u) << b;
      total += r["attention_work"].get<int64_t>();
    }
    EXPECT_EQ(total, 10 + 28 + 15 + 3) << b;  // Σ l(l+1)/2 over 4, 7, 5 and the pad of 2
  }
  auto text = run_longtron("inspect --data " + (dir / "d.bin").string() +
                           " --seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 2");
  EXPECT_NE(text.output.find("context ranks (zigzag of size 2): attention work [24, 29], "
                             "max / mean 1.0943"),
            std::string::npos)
      << text.output;
}

// With a --config whose model has a sliding window in every layer (Mistral), a query's work is at
// most the window's keys, in the context ranks' work and in the rows' balance cost.
TEST(Inspect, ContextWorkAndCostCountOnlyTheWindowsPairs) {
  TempDir dir;
  write_file(dir / "d.bin", kExamplePacked);
  write_file(dir / "m.toml", "[model]\ntype = \"mistral\"\nvocab_size = 60000\nhidden_size = 32\n"
                             "num_layers = 2\nnum_attention_heads = 4\nnum_kv_attention_heads = 4\n"
                             "sliding_window = 3\n"
                             "[data]\nbalance_cost = [0.0, 1.0]\n");
  json z = inspect(dir, "--seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 2 --dp-size 1 --config " +
                            (dir / "m.toml").string());
  const auto& mb = z["steps"][0]["dp_ranks"][0]["micro_batches"][0];
  // Row {0, 4, 11, 16}, zigzag as above, each query's keys capped at 3.
  EXPECT_EQ(mb["cp_ranks"][0]["attention_work"], 1 + 2 + 3 + 3 + 2 + 3 + 3 + 3);
  EXPECT_EQ(mb["cp_ranks"][1]["attention_work"], 1 + 2 + 3 + 3 + 3 + 3 + 3 + 1);
  EXPECT_NEAR(mb["cp_imbalance"].get<double>(), 20.0 / 19.5, 1e-12);
  // Cost per pair 1: visible pairs of 4, 7, 5 under window 3 = 9 + 18 + 12 (causal: 10 + 28 + 15).
  EXPECT_DOUBLE_EQ(z["steps"][0]["dp_ranks"][0]["cost"].get<double>(), 9 + 18 + 12);
}

TEST(Inspect, BadInputIsAClearError) {
  TempDir dir;
  write_file(dir / "d.bin", kExamplePacked);
  write_file(dir / "empty.bin", "");
  const std::string data = " --data " + (dir / "d.bin").string();
  auto expect_error = [](const CommandResult& r, const std::string& words) {
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find(words), std::string::npos) << r.output;
  };
  expect_error(run_longtron("inspect" + data + " --seq-len 0 --micro-bsz 2 --micro-num 1"),
               "seq_len");
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz -1 --micro-num 1"),
               "micro_bsz");
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz 2 --micro-num 1 --sp-size 3"),
               "pad_for_sequence_parallel");
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz 2 --micro-num 1 --sp-size 2 --sp-rank 2"),
               "rank 2");
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 0"),
               "--cp-size must be >= 1");
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 2 --cp-balance ring"),
               "--cp-balance must be \"contiguous\", \"zigzag\" or \"document\"");
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz 2 --micro-num 1 --cp-balance document"),
               "--cp-balance needs --cp-size");  // would be ignored, silently
  expect_error(run_longtron("inspect" + data + " --seq-len 8 --micro-bsz 2 --micro-num 1 --cp-size 17"),
               "--cp-size 17 exceeds the row's 16 tokens");
  // seq_len x micro_bsz beyond 2^63: refused by its own rule, not multiplied into a wrapped row.
  expect_error(run_longtron("inspect" + data + " --seq-len 4000000000 --micro-bsz 4000000000 "
                            "--micro-num 1 --cp-size 2"),
               "exceeds 2^31-1");
  auto r = run_longtron("inspect --data " + (dir / "empty.bin").string() +
                        " --seq-len 8 --micro-bsz 2 --micro-num 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace longtron::testing
