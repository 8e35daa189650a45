// tie_word_embeddings (Hugging Face: the output head IS model.embed_tokens.weight): a tied Qwen2
// model trained from --init-from under `mpirun -np 2` with data parallel (ZeRO-1 over 2 ranks, and
// without it) and in every tensor-parallel layout (MTP, MSP, FSP, ISP, 2D, 2D-Attention's context
// parallel) gives the one-process losses; its checkpoints and export hold one tensor and say
// tie_word_embeddings = true; init-from → export → init-from gives identical weights
// (docs/model.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cmath>
#include <random>
#include <sstream>

#include "cli_fixture.h"
#include "core/safetensors.h"

namespace fs = std::filesystem;
namespace st = longtron::safetensors;
using longtron::testing::english_document;
using longtron::testing::jsonl_of;
using longtron::testing::losses;
using longtron::testing::max_rel_error_same_steps;
using longtron::testing::mpirun_longtron;
using longtron::testing::prepare_corpus;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::tiny_model_toml;
using longtron::testing::write_file;
using nlohmann::json;

namespace {

/// Copies the Hugging Face folder `from` to `to` with tie_word_embeddings = true and without
/// lm_head.weight (the layout of a tied Hugging Face checkpoint).
void write_tied(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  json cfg = json::parse(read_file(from / "config.json"));
  cfg["tie_word_embeddings"] = true;
  write_file(to / "config.json", cfg.dump(2));
  const st::Reader in(from);
  std::vector<std::vector<float>> data;
  std::vector<st::WriteTensor> out;
  const auto names = in.names();
  data.reserve(names.size());
  for (const auto& n : names) {
    if (n == "lm_head.weight") continue;
    data.push_back(in.file_of(n).read_floats(n));
    out.push_back({n, in.info(n).shape, st::DType::F32, data.back().data(), nullptr});
  }
  st::write_file(to / "model.safetensors", out);
}

TEST(TiedCli, EveryLayoutMatchesOneProcess) {
  TempDir dir;
  std::mt19937 gen(5);
  std::vector<std::string> docs;
  for (int d = 0; d < 16; ++d) docs.push_back(english_document(gen, 12 + d * 3));
  prepare_corpus(dir, jsonl_of(docs), "0");
  const std::string data = "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
                           "\"\nseq_len = 64\nmicro_bsz = 2\nmicro_num = 2\n";
  write_file(dir / "init.toml", tiny_model_toml(8) + "type = \"qwen2\"\nqkv_bias = true\n" + data +
                                    "[train]\ntotal_steps = 1\nnum_threads = 1\ncheckpoint_dir = \"" +
                                    (dir / "init").string() + "\"\n");
  auto r = run_longtron("train --config " + (dir / "init.toml").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path tied = dir / "tied";
  write_tied(dir / "init" / "step_1", tied);

  write_file(dir / "ft.toml", data + "[optimizer]\nlr = 1e-2\nweight_decay = 0.1\n"
                                     "[lr_scheduler]\nmin_lr = 1e-2\n[train]\ntotal_steps = 3\n"
                                     "num_threads = 1\n");
  auto args = [&](const std::string& run, const std::string& extra) {
    return "train --config " + (dir / "ft.toml").string() + " --init-from " + tied.string() +
           " --set train.metrics_file=\"" + (dir / run / "metrics.jsonl").string() +
           "\" --set train.checkpoint_dir=\"" + (dir / run / "ckpt").string() + "\" " + extra;
  };
  r = run_longtron(args("one", ""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto ref = losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(ref.size(), 3u);

  // The checkpoint: one tensor, the flag written back, the optimizer state once.
  const fs::path step = dir / "one" / "ckpt" / "step_3";
  EXPECT_EQ(json::parse(read_file(step / "config.json"))["tie_word_embeddings"], true);
  const st::Reader saved(step);
  EXPECT_FALSE(saved.contains("lm_head.weight"));
  EXPECT_TRUE(saved.contains("model.embed_tokens.weight"));
  EXPECT_EQ(saved.names().size(), st::Reader(tied).names().size());

  // init-from → export → init-from: the same weights, bit for bit.
  r = run_longtron("export --checkpoint " + step.string() + " --output " + (dir / "exp").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(dir / "exp" / "config.json"))["tie_word_embeddings"], true);
  const st::Reader exported(dir / "exp");
  auto names = saved.names(), names_back = exported.names();
  std::sort(names.begin(), names.end());
  std::sort(names_back.begin(), names_back.end());
  ASSERT_EQ(names, names_back);
  for (const auto& n : names)
    EXPECT_EQ(saved.file_of(n).read_floats(n), exported.file_of(n).read_floats(n)) << n;
  r = run_longtron("export --checkpoint " + (dir / "exp").string() + " --output " +
                   (dir / "exp2").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const st::Reader again(dir / "exp2");
  for (const auto& n : names)
    EXPECT_EQ(exported.file_of(n).read_floats(n), again.file_of(n).read_floats(n)) << n;

  // Data parallel 2 with one row each (the union is the one process's two rows per step), with
  // ZeRO-1 over both ranks (the default) and without.
  const std::pair<const char*, const char*> dp[] = {
      {"zero1", "--set data.micro_num=1"},
      {"dp", "--set data.micro_num=1 --set parallel.zero1.size=1"}};
  for (const auto& [name, extra] : dp) {
    r = mpirun_longtron(2, args(name, extra));
    ASSERT_EQ(r.status, 0) << name << "\n" << r.output;
    const double e = max_rel_error_same_steps(losses(dir / name / "metrics.jsonl"), ref);
    EXPECT_LT(e, 1e-4) << name;
    std::printf("[tied] qwen2 tied, %s np 2: max rel loss err vs one process %.2e\n", name, e);
  }

  // The ZeRO-1 checkpoint of step 3 (one tensor's moments, sharded over 2 ranks) resumed in one
  // process for steps 4–5: the losses of 5 steps in one process.
  r = run_longtron(args("one5", "--set train.total_steps=5"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto ref5 = losses(dir / "one5" / "metrics.jsonl");
  ASSERT_EQ(ref5.size(), 5u);
  r = run_longtron("train --config " + (dir / "ft.toml").string() + " --resume " +
                   (dir / "zero1" / "ckpt" / "step_3").string() +
                   " --set train.total_steps=5 --set train.metrics_file=\"" +
                   (dir / "resumed" / "metrics.jsonl").string() + "\"");
  ASSERT_EQ(r.status, 0) << r.output;
  auto resumed = losses(dir / "resumed" / "metrics.jsonl");
  ASSERT_EQ(resumed.size(), 2u);
  double e = 0;
  for (const auto& [s, loss] : resumed) e = std::max(e, std::abs(loss - ref5.at(s)) / ref5.at(s));
  EXPECT_LT(e, 1e-4);
  std::printf("[tied] zero1 np 2 checkpoint resumed in one process, steps 4-5: max rel loss err "
              "%.2e\n", e);

  // Every tensor-parallel layout: the one table split on vocabulary rows, as the head's shards
  // (Megatron's vocab-parallel embedding), gives the one-process losses.
  const std::string cp2 =
      "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"isp\" --set "
      "parallel.sequence_2D.enable=true --set parallel.sequence_2D.context_size=2 "
      "--set parallel.sequence_2D.balance=";
  const std::pair<std::string, std::string> tensor[] = {
      {"mtp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"mtp\""},
      {"msp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"msp\""},
      {"fsp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"fsp\""},
      {"isp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"isp\" "
              "--set parallel.weight.size=2"},
      {"2d-x2y1", "--set parallel.tensor_2d.x=2 --set parallel.tensor_2d.y=1"},
      {"2d-x1y2", "--set parallel.tensor_2d.x=1 --set parallel.tensor_2d.y=2"},
      {"cp2-zigzag", cp2 + "\"zigzag\""},
      {"cp2-document", cp2 + "\"document\""}};
  for (const auto& [name, extra] : tensor) {
    r = mpirun_longtron(2, args(name, extra));
    ASSERT_EQ(r.status, 0) << name << "\n" << r.output;
    const double e = max_rel_error_same_steps(losses(dir / name / "metrics.jsonl"), ref);
    EXPECT_LT(e, 1e-4) << name;
    std::printf("[tied] qwen2 tied, %s np 2: max rel loss err vs one process %.2e\n",
                name.c_str(), e);
    // The checkpoint of the layout holds the one tensor, gathered from its vocabulary shards.
    const st::Reader layout_saved(dir / name / "ckpt" / "step_3");
    EXPECT_FALSE(layout_saved.contains("lm_head.weight")) << name;
    const std::string table = "model.embed_tokens.weight";
    const auto got = layout_saved.file_of(table).read_floats(table);
    const auto want = saved.file_of(table).read_floats(table);
    ASSERT_EQ(got.size(), want.size()) << name;
    double diff = 0, scale = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      diff = std::max(diff, double(std::abs(got[k] - want[k])));
      scale = std::max(scale, double(std::abs(want[k])));
    }
    EXPECT_LT(diff, 1e-4 * scale) << name;
  }

  // A tied config with lm_head.weight still in the file is refused, naming both.
  fs::create_directories(dir / "both");
  fs::copy_file(tied / "config.json", dir / "both" / "config.json");
  fs::copy_file(dir / "init" / "step_1" / "model.safetensors", dir / "both" / "model.safetensors");
  r = run_longtron("train --config " + (dir / "ft.toml").string() + " --init-from " +
                   (dir / "both").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("lm_head.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tie_word_embeddings"), std::string::npos) << r.output;
}

// From scratch: model.tie_word_embeddings = true gives a checkpoint with one tensor and the flag in
// config.json; a TOML key that contradicts the --init-from config.json is refused.
TEST(TiedCli, FromScratchAndContradictionWithConfigJson) {
  TempDir dir;
  std::mt19937 gen(7);
  std::vector<std::string> docs;
  for (int d = 0; d < 8; ++d) docs.push_back(english_document(gen, 20 + d * 3));
  prepare_corpus(dir, jsonl_of(docs), "0");
  const std::string data = "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
                           "\"\nseq_len = 64\nmicro_bsz = 1\n";
  write_file(dir / "t.toml", tiny_model_toml(8) + "tie_word_embeddings = true\n" + data +
                                 "[train]\ntotal_steps = 1\nnum_threads = 1\ncheckpoint_dir = \"" +
                                 (dir / "ckpt").string() + "\"\n");
  auto r = run_longtron("train --config " + (dir / "t.toml").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path step = dir / "ckpt" / "step_1";
  EXPECT_EQ(json::parse(read_file(step / "config.json"))["tie_word_embeddings"], true);
  const st::Reader saved(step);
  EXPECT_FALSE(saved.contains("output.weight"));
  EXPECT_TRUE(saved.contains("model.tok_embeddings.weight"));

  write_file(dir / "u.toml", "[model]\ntie_word_embeddings = false\n" + data +
                                 "[train]\ntotal_steps = 1\nnum_threads = 1\n");
  r = run_longtron("train --config " + (dir / "u.toml").string() + " --init-from " + step.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("model.tie_word_embeddings"), std::string::npos) << r.output;
}

}  // namespace
