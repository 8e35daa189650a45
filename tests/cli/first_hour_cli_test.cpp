// The README's examples as a new user runs them, each twice in a row: the tiny parallel example
// (`configs/tiny.toml`, one process then under mpirun as the README writes it, --overwrite), the
// export and fine-tune pair (`configs/finetune_llama.toml`), a run shortened below its warmup,
// and the start-up line's reason for the dtype. Small data stands in for the demo corpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_fixture.h"
#include "test_util.h"

namespace fs = std::filesystem;
using longtron::testing::CommandResult;
using longtron::testing::contains;
using longtron::testing::mpirun_longtron;
using longtron::testing::Prepared;
using longtron::testing::run_command;
using longtron::testing::run_longtron;

namespace {

const std::string kSource = LONGTRON_SOURCE_DIR;

// `longtron ARGS` run from `dir` (the configs' relative paths land there).
CommandResult longtron_in(const fs::path& dir, const std::string& args) {
  return run_command("cd " + dir.string() + " && " + LONGTRON_BINARY + " " + args);
}

}  // namespace

TEST(FirstHour, TinyExampleRunsTwiceWithOverwrite) {
  Prepared p;
  const std::string data = " --set data.train_folder=" + (p.dir / "data" / "train").string() +
                           " --set data.valid_folder=" + (p.dir / "data" / "valid").string() +
                           " --set model.vocab_size=400 --set train.total_steps=3";
  const std::string config = " --config " + kSource + "/configs/tiny.toml";
  CommandResult r = longtron_in(p.dir.path(), "train" + config + data + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.output;
  // The README's command (two ranks, MSP) again into the same folder.
  r = run_command("cd " + p.dir.path().string() + " && OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 "
                  "--oversubscribe --allow-run-as-root --bind-to none " LONGTRON_BINARY " train" +
                  config + " --set parallel.tensor.size=2 --set parallel.tensor.mode=msp" + data +
                  " --overwrite 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--overwrite: removed the checkpoints")) << r.output;
  EXPECT_TRUE(fs::exists(p.dir / "tiny_out" / "checkpoints" / "step_3" / "model.safetensors"));
  // Without --overwrite the second run says how to go on.
  r = longtron_in(p.dir.path(), "train" + config + data);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--overwrite")) << r.output;
}

TEST(FirstHour, ExportAndFineTuneRunTwiceAndSayWhyTheirDtype) {
  Prepared p;
  // Warmup 5 in a 2-step run: accepted with a notice.
  CommandResult r = run_longtron("train" + p.config() +
                                 " --set lr_scheduler.warmup_steps=5 --set train.total_steps=2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "train: note: lr_scheduler.warmup_steps 5 exceeds "
                                 "train.total_steps 2: the run ends inside the warmup"))
      << r.output;
  // tiny.toml sets no dtype: the start-up line says float32 is the default.
  EXPECT_TRUE(contains(r.output, "dtype float32 (model.dtype not set: float32 is the default"))
      << r.output;
  // The README's export, twice: the second needs --overwrite and says so without it.
  const std::string export_cmd = "export --checkpoint " + (p.dir / "ckpt").string() + " --output " +
                                 (p.dir / "llama").string() + " --format llama";
  for (int run = 0; run < 2; ++run) {
    r = run_longtron(export_cmd + " --overwrite");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  r = run_longtron(export_cmd);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "exists and is not empty (pass --overwrite to replace it)"))
      << r.output;
  EXPECT_TRUE(fs::exists(p.dir / "llama" / "config.json"));
  // --output the checkpoint folder (or a folder above it) with --overwrite would delete the
  // checkpoint: refused, and the checkpoint is still there.
  for (const fs::path& above : {p.dir / "ckpt", p.dir.path()}) {
    r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " + above.string() +
                     " --format llama --overwrite");
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "holds the checkpoint being exported")) << r.output;
    EXPECT_TRUE(fs::exists(p.dir / "ckpt")) << r.output;
    ASSERT_TRUE(fs::exists(p.dir / "llama" / "config.json")) << r.output;
  }
  // The README's fine-tune with configs/finetune_llama.toml (its warmup 5 is longer than this
  // one-step run), twice.
  const std::string finetune =
      "train --config " + kSource + "/configs/finetune_llama.toml --init-from " +
      (p.dir / "llama").string() + " --set data.train_folder=" +
      (p.dir / "data" / "train").string() + " --set data.valid_folder=" +
      (p.dir / "data" / "valid").string() +
      " --set data.seq_len=64 --set data.micro_bsz=2 --set train.total_steps=1"
      " --set train.num_threads=1 --overwrite";
  for (int run = 0; run < 2; ++run) {
    r = longtron_in(p.dir.path(), finetune);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "(auto: this CPU ")) << r.output;  // has / lacks AVX512-BF16
  }
  EXPECT_TRUE(fs::exists(p.dir / "demo" / "finetune" / "step_1" / "model.safetensors"));
}
