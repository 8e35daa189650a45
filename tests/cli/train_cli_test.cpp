// `longtron train / eval / export / generate` end to end on a tiny prepared corpus: HF round trip
// (export, eval and --init-from the export give identical losses), per-document eval, generation
// from a checkpoint alone, and config errors that name the key (non-zero exit).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::english_document;
using longtron::testing::jsonl_of;
using longtron::testing::Prepared;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::tiny_model_toml;
using longtron::testing::write_file;

namespace {

/// The valid_loss rows of a metrics file, in order.
std::vector<double> valid_losses(const fs::path& metrics) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("valid_loss")) out.push_back(j["valid_loss"].get<double>());
  }
  return out;
}

TEST(TrainCli, ExportEvalInitFromAndGenerate) {
  Prepared p;
  auto r = run_longtron("train" + p.config());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(p.dir / "ckpt" / "step_6" / "tokenizer.model"));
  const auto trained = valid_losses(p.dir / "metrics.jsonl");
  ASSERT_EQ(trained.size(), 2u);  // step 0 and the end

  r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " +
                   (p.dir / "hf").string());
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.model"})
    EXPECT_TRUE(fs::exists(p.dir / "hf" / f)) << f;

  // An --output under a regular file: a clear error, not a filesystem exception.
  write_file(p.dir / "a_file", "x");
  r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " +
                   (p.dir / "a_file" / "hf").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "export: cannot create the folder") &&
              contains(r.output, "Not a directory")) << r.output;

  // eval of the checkpoint and of the export: identical; per-document sums add up to the loss.
  const std::string data = " --data " + (p.dir / "data" / "valid").string() + " --json";
  r = run_longtron("eval --checkpoint " + (p.dir / "ckpt").string() + data);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto a = nlohmann::json::parse(r.output);
  r = run_longtron("eval --checkpoint " + (p.dir / "hf").string() + data + " --seq-len 64 --micro-bsz 2");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto b = nlohmann::json::parse(r.output);
  EXPECT_EQ(a["loss"].get<double>(), b["loss"].get<double>());
  ASSERT_EQ(a["documents"].size(), 4u);
  double sum = 0;
  int64_t tokens = 0;
  for (const auto& d : a["documents"]) {
    sum += d["loss_sum"].get<double>();
    tokens += d["tokens"].get<int64_t>();
    // Each document's mean loss and stored length come with its sums.
    ASSERT_GT(d["tokens"].get<int64_t>(), 0) << d;
    EXPECT_NEAR(d["loss"].get<double>(), d["loss_sum"].get<double>() / d["tokens"].get<double>(),
                1e-12) << d;
    EXPECT_GE(d["length"].get<int64_t>(), d["tokens"].get<int64_t>()) << d;
  }
  EXPECT_NEAR(sum / static_cast<double>(tokens), a["loss"].get<double>(), 1e-9);
  // The training run's final valid_loss is the same number (same packing of the same set).
  EXPECT_NEAR(a["loss"].get<double>(), trained.back(), 1e-6);

  // A hand-edited state.json whose packing flags are not booleans: eval falls back to the
  // defaults (the same packing here) instead of aborting on a JSON type error.
  fs::copy(p.dir / "ckpt", p.dir / "ckpt_edited", fs::copy_options::recursive);
  const fs::path state = p.dir / "ckpt_edited" / "step_6" / "state.json";
  auto edited = nlohmann::json::parse(read_file(state));
  ASSERT_TRUE(edited["config"].contains("data")) << edited.dump();
  edited["config"]["data"]["pack_sample_into_one"] = "no";
  edited["config"]["data"]["split_documents"] = 1;
  write_file(state, edited.dump());
  r = run_longtron("eval --checkpoint " + (p.dir / "ckpt_edited").string() + data);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["loss"].get<double>(), a["loss"].get<double>());

  // Data whose every target is masked (negative ids) has no loss: an error, not "loss 0".
  write_file(p.dir / "masked.bin", "{\"tokens\": [-5, -6, -7]}\n{\"tokens\": [9]}\n");
  r = run_longtron("eval --checkpoint " + (p.dir / "ckpt").string() + " --data " +
                   (p.dir / "masked.bin").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "masked.bin: no token has a label (2 documents")) << r.output;

  // --init-from the export: the step-0 valid loss (before any update) is the exported model's.
  r = run_longtron("train" + p.config() + " --init-from " + (p.dir / "hf").string() +
                   " --set train.total_steps=1 --set train.checkpoint_dir=\"" +
                   (p.dir / "ckpt2").string() + "\" --set train.metrics_file=\"" +
                   (p.dir / "m2.jsonl").string() + "\"");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_DOUBLE_EQ(valid_losses(p.dir / "m2.jsonl").front(), trained.back());

  // A TOML shape key that disagrees with config.json names both values.
  r = run_longtron("train" + p.config() + " --init-from " + (p.dir / "hf").string() +
                   " --set model.num_layers=3");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "num_layers") && contains(r.output, "3") && contains(r.output, "2"))
      << r.output;

  // generate works from the checkpoint folder alone (tokenizer.model travels with it).
  fs::remove_all(p.dir / "data");
  r = run_longtron("generate --checkpoint " + (p.dir / "ckpt" / "step_6").string() +
                   " --prompt \"the state of\" --max-new-tokens 8");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the state of")) << r.output;
  r = run_longtron("generate --checkpoint " + (p.dir / "hf").string() +
                   " --prompt \"the\" --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 3");
  ASSERT_EQ(r.status, 0) << r.output;
}

TEST(TrainCli, ConfigErrorsNameTheKey) {
  TempDir dir;
  write_file(dir / "c.toml", "[model]\nvocab_size = 64\nhidden_size = 32\nnum_layers = 1\n"
                             "num_attention_heads = 4\nnum_kv_attention_heads = 2\n"
                             "[data]\ntrain_folder = \"x\"\nseq_len = 32\nmicro_bsz = 1\n"
                             "[train]\ntotal_steps = 1\n");
  const std::string config = " --config " + (dir / "c.toml").string();
  auto r = run_longtron("train" + config + " --set data.seq_lenn=3");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "data.seq_lenn")) << r.output;
  r = run_longtron("train" + config + " --set optimizer.lr=fast");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "optimizer.lr")) << r.output;
  r = run_longtron("train" + config + " --set train.loss_reduction=sum");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "train.loss_reduction")) << r.output;
  // A bad --set is blamed on the --set, not on the file that does not hold the key.
  for (const std::string set : {"foo.bar=1", "parallel.tensor.mode=xyz"}) {
    r = run_longtron("train" + config + " --set " + set);
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(contains(r.output, "error: --set " + set + ": ")) << r.output;
    EXPECT_FALSE(contains(r.output, "c.toml")) << r.output;
  }
  // A 20-digit integer is out of range, in a --set or in the file.
  r = run_longtron("train" + config + " --set data.seq_len=12345678901234567890");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "integer out of range")) << r.output;
  std::string big = read_file(dir / "c.toml");
  big.replace(big.find("seq_len = 32"), 12, "seq_len = 12345678901234567890");
  write_file(dir / "big.toml", big);
  r = run_longtron("train --config " + (dir / "big.toml").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "big.toml:9") && contains(r.output, "out of range") &&
              !contains(r.output, "string")) << r.output;
  // A missing dataset names its path.
  r = run_longtron("train" + config);
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "x")) << r.output;
}

// A dataset tokenized with a larger vocabulary than the model's is refused before anything is
// written, naming the data key and dataset.json; eval names the file and document of a bad id.
TEST(TrainCli, VocabMismatchNamesTheDataset) {
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set model.vocab_size=300");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "data.train_folder") && contains(r.output, "dataset.json") &&
              contains(r.output, "model.vocab_size is 300"))
      << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(p.dir / "ckpt"));

  r = run_longtron("train" + p.config() + " --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  write_file(p.dir / "big_ids.bin", "{\"tokens\": [1, 5, 2]}\n{\"tokens\": [1, 450, 2]}\n");
  r = run_longtron("eval --checkpoint " + (p.dir / "ckpt").string() + " --data " +
                   (p.dir / "big_ids.bin").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "big_ids.bin: document 1, token 1: id 450")) << r.output;
}

}  // namespace
