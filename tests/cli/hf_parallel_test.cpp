// A Mistral model with a sliding window shorter than its documents, trained from --init-from under
// `mpirun -np 2` in the layouts whose attention differs (Megatron TP, ISP's Ulysses, 2D-TP's
// Ulysses over y, 2D-Attention's context parallelism in each balance), gives the one-process
// losses (docs/model.md); so does a Qwen3 folder (per-head q/k norms, head_dim 16 over hidden 32)
// read into each rank's shards.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
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

TEST(HfParallel, MistralWindowMatchesOneProcessInEveryAttentionLayout) {
  TempDir dir;
  std::mt19937 gen(5);
  std::vector<std::string> docs;
  for (int d = 0; d < 16; ++d) docs.push_back(english_document(gen, 12 + d * 3));
  prepare_corpus(dir, jsonl_of(docs), "0");
  const std::string data = "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
                           "\"\nseq_len = 64\nmicro_bsz = 2\nmicro_num = 2\n";
  // A Mistral model: one step from scratch, its checkpoint as the Hugging Face folder.
  write_file(dir / "init.toml", tiny_model_toml(8) + "type = \"mistral\"\n" + data +
                                    "[train]\ntotal_steps = 1\nnum_threads = 1\ncheckpoint_dir = \"" +
                                    (dir / "init").string() + "\"\n");
  auto r = run_longtron("train --config " + (dir / "init.toml").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path hf = dir / "init" / "step_1";
  json cfg = json::parse(read_file(hf / "config.json"));
  ASSERT_EQ(cfg["model_type"], "mistral");
  ASSERT_TRUE(cfg["sliding_window"].is_null());
  const fs::path windowed = dir / "windowed";
  fs::create_directories(windowed);
  fs::copy_file(hf / "model.safetensors", windowed / "model.safetensors");
  cfg["sliding_window"] = 16;  // documents are up to 64 tokens
  write_file(windowed / "config.json", cfg.dump(2));

  write_file(dir / "ft.toml", data + "[optimizer]\nlr = 1e-2\n[lr_scheduler]\nmin_lr = 1e-2\n"
                                     "[train]\ntotal_steps = 3\nnum_threads = 1\n");
  auto args = [&](const fs::path& from, const std::string& run, const std::string& extra) {
    return "train --config " + (dir / "ft.toml").string() + " --init-from " + from.string() +
           " --set train.metrics_file=\"" + (dir / run / "metrics.jsonl").string() + "\" " + extra;
  };
  r = run_longtron(args(windowed, "one", ""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto ref = losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(ref.size(), 3u);
  r = run_longtron(args(hf, "full", ""));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_GT(max_rel_error_same_steps(losses(dir / "full" / "metrics.jsonl"), ref), 1e-3)
      << "the window changes nothing: the test would not see it ignored";

  const std::string cp2 =
      "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"isp\" --set "
      "parallel.sequence_2D.enable=true --set parallel.sequence_2D.context_size=2 "
      "--set parallel.sequence_2D.balance=";
  const std::pair<std::string, std::string> layouts[] = {
      {"mtp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"mtp\""},
      {"isp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"isp\""},
      {"2d", "--set parallel.tensor_2d.x=1 --set parallel.tensor_2d.y=2"},
      {"cp2-contiguous", cp2 + "\"contiguous\""},
      {"cp2-zigzag", cp2 + "\"zigzag\""},
      {"cp2-document", cp2 + "\"document\""}};
  for (const auto& [name, extra] : layouts) {
    r = mpirun_longtron(2, args(windowed, name, extra));
    ASSERT_EQ(r.status, 0) << name << "\n" << r.output;
    const double e = max_rel_error_same_steps(losses(dir / name / "metrics.jsonl"), ref);
    EXPECT_LT(e, 1e-4) << name;
    std::printf("[hf-parallel] mistral window 16, %s np2: max rel loss err vs one process %.2e\n",
                name.c_str(), e);
  }
}

TEST(HfParallel, Qwen3FolderMatchesOneProcessInEveryTensorLayout) {
  TempDir dir;
  std::mt19937 gen(7);
  std::vector<std::string> docs;
  for (int d = 0; d < 16; ++d) docs.push_back(english_document(gen, 12 + d * 3));
  prepare_corpus(dir, jsonl_of(docs), "0");
  const std::string data = "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
                           "\"\nseq_len = 64\nmicro_bsz = 2\nmicro_num = 2\n";
  write_file(dir / "init.toml",
             tiny_model_toml(8) + "type = \"qwen3\"\nhead_dim = 16\n" + data +
                 "[train]\ntotal_steps = 1\nnum_threads = 1\ncheckpoint_dir = \"" +
                 (dir / "init").string() + "\"\n");
  auto r = run_longtron("train --config " + (dir / "init.toml").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path hf = dir / "init" / "step_1";
  ASSERT_EQ(json::parse(read_file(hf / "config.json"))["model_type"], "qwen3");
  write_file(dir / "ft.toml", data + "[optimizer]\nlr = 1e-2\n[lr_scheduler]\nmin_lr = 1e-2\n"
                                     "[train]\ntotal_steps = 3\nnum_threads = 1\n");
  auto args = [&](const std::string& run, const std::string& extra) {
    return "train --config " + (dir / "ft.toml").string() + " --init-from " + hf.string() +
           " --set train.metrics_file=\"" + (dir / run / "metrics.jsonl").string() + "\" " + extra;
  };
  r = run_longtron(args("one", ""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto ref = losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(ref.size(), 3u);
  const std::pair<std::string, std::string> layouts[] = {
      {"msp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"msp\""},
      {"isp", "--set parallel.tensor.size=2 --set parallel.tensor.mode=\"isp\""},
      {"2d", "--set parallel.tensor_2d.x=2 --set parallel.tensor_2d.y=1"}};
  for (const auto& [name, extra] : layouts) {
    r = mpirun_longtron(2, args(name, extra));
    ASSERT_EQ(r.status, 0) << name << "\n" << r.output;
    const double e = max_rel_error_same_steps(losses(dir / name / "metrics.jsonl"), ref);
    EXPECT_LT(e, 1e-4) << name;
    std::printf("[hf-parallel] qwen3, %s np2: max rel loss err vs one process %.2e\n",
                name.c_str(), e);
  }
}

}  // namespace
