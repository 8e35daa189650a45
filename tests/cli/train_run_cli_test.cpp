// `longtron train` as a user runs it twice, resumes it, or feeds it a full disk or a diverging
// learning rate: a non-empty checkpoint folder is refused without --resume/--overwrite, leftovers
// of killed saves are removed, the end-of-run summary reports this run's own numbers, non-finite
// steps end the run after train.max_skipped_steps, and a failed metrics write ends it at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::Prepared;
using longtron::testing::read_file;
using longtron::testing::run_command;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

/// The step folder `latest` names in a checkpoint root ("step_6").
std::string latest(const fs::path& root) {
  std::string name = read_file(root / "latest");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

/// A PID that belonged to a process that has exited (a shell that printed its own PID).
std::string dead_pid() {
  const auto r = run_command("sh -c 'echo $$'");
  std::string pid = r.output;
  while (!pid.empty() && pid.back() == '\n') pid.pop_back();
  return pid;
}

}  // namespace

// A second run into the same checkpoint folder is refused (naming the folder and both flags);
// --overwrite replaces the checkpoints; --resume continues them and says from which step; the
// summary names this run's first and last losses, speed, MFU, the metrics file and the picture.
TEST(TrainRunCli, CheckpointFolderNeedsResumeOrOverwrite) {
  Prepared p;
  auto r = run_longtron("train" + p.config());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "steps 1..6")) << r.output;
  EXPECT_TRUE(contains(r.output, "(step 0) -> ")) << r.output;
  EXPECT_TRUE(contains(r.output, "tokens/s") && contains(r.output, "MFU")) << r.output;
  EXPECT_TRUE(contains(r.output, "metrics " + (p.dir / "metrics.jsonl").string())) << r.output;
  EXPECT_TRUE(contains(r.output, "loss picture " + (p.dir / "metrics.png").string())) << r.output;
  EXPECT_TRUE(fs::exists(p.dir / "metrics.png"));

  const std::string ckpt = (p.dir / "ckpt").string();
  r = run_longtron("train" + p.config());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "train.checkpoint_dir = " + ckpt + " is not empty") &&
              contains(r.output, "--resume " + ckpt) && contains(r.output, "--overwrite"))
      << r.output;
  EXPECT_EQ(latest(p.dir / "ckpt"), "step_6");

  // --overwrite: a 4-step run replaces the 6-step one (no stale step_6 beside it).
  write_file(p.dir / "ckpt" / "notes.txt", "mine");
  r = run_longtron("train" + p.config() + " --overwrite --set train.total_steps=4");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(latest(p.dir / "ckpt"), "step_4");
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / "step_6"));
  EXPECT_TRUE(fs::exists(p.dir / "ckpt" / "notes.txt"));  // only checkpoints are removed

  // --resume: "resumed from step 4"; the summary covers steps 5..6 and the one validation it ran.
  r = run_longtron("train" + p.config() + " --resume " + ckpt);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed from step 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "steps 5..6")) << r.output;
  EXPECT_TRUE(contains(r.output, "(step 5) -> ")) << r.output;
  EXPECT_TRUE(contains(r.output, "valid_loss ") && !contains(r.output, "(step 6) -> ")) << r.output;
  EXPECT_EQ(latest(p.dir / "ckpt"), "step_6");

  r = run_longtron("train" + p.config() + " --resume " + ckpt + " --overwrite");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--overwrite and --resume")) << r.output;
}

// `kill -9` during a save leaves step_N.tmp.PID/: the next run removes those of dead processes
// (on resume and on save) and keeps those of live ones.
TEST(TrainRunCli, LeftoversOfKilledSavesAreRemoved) {
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set train.total_steps=2");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path dead = p.dir / "ckpt" / ("step_3.tmp." + dead_pid());
  const fs::path live = p.dir / "ckpt" / ("step_4.tmp." + std::to_string(getpid()));
  for (const fs::path& d : {dead, live}) {
    fs::create_directories(d);
    write_file(d / "model.safetensors", "partial");
  }
  r = run_longtron("train" + p.config() + " --set train.total_steps=3 --resume " +
                   (p.dir / "ckpt").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(dead)) << r.output;
  EXPECT_TRUE(contains(r.output, "removed " + dead.string())) << r.output;
  EXPECT_TRUE(fs::exists(live / "model.safetensors"));
  EXPECT_EQ(latest(p.dir / "ckpt"), "step_3");
}

// A learning rate of 1e30 drives the weights to overflow: each step with a non-finite loss or
// gradient norm is skipped and reported; train.max_skipped_steps in a row end the run (exit 1)
// with the last checkpoint saved before them as the newest.
TEST(TrainRunCli, NonFiniteStepsEndTheRunAfterMaxSkipped) {
  Prepared p;
  const auto r = run_longtron("train" + p.config() +
                              " --set optimizer.lr=1e30 --set train.total_steps=20 "
                              "--set train.save_every=1 --set train.max_skipped_steps=3");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "update skipped (1 in a row; train.max_skipped_steps = 3)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "3 steps in a row had a non-finite loss, gradient norm or update"))
      << r.output;
  // The metrics file says which steps were bad: the first is the one after the last checkpoint.
  std::istringstream in(read_file(p.dir / "metrics.jsonl"));
  int64_t first_bad = 0, last_step = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    last_step = j["step"].get<int64_t>();
    const bool bad = j["loss"].is_null() || j["grad_norm"].is_null();
    if (bad && first_bad == 0) first_bad = last_step;
  }
  ASSERT_GT(first_bad, 1) << "step 1 should still be finite";
  EXPECT_EQ(last_step, first_bad + 2);  // the third skip in a row ends the run
  const std::string good = "step_" + std::to_string(first_bad - 1);
  EXPECT_EQ(latest(p.dir / "ckpt"), good);
  EXPECT_TRUE(contains(r.output, "Last good checkpoint: " + (p.dir / "ckpt" / good).string()))
      << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / ("step_" + std::to_string(first_bad))));
}

// train.metrics_file on a full device: the first row's write fails, the run ends there with the
// cause, and no picture is written.
TEST(TrainRunCli, FailedMetricsWriteEndsTheRun) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const bool had_png = fs::exists("/dev/full.png");
  Prepared p;
  const auto r = run_longtron("train" + p.config() + " --set train.metrics_file=\"/dev/full\"");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "train.metrics_file = /dev/full: write failed at step 0 (No space "
                                 "left on device)")) << r.output;
  EXPECT_FALSE(contains(r.output, "step 1/")) << r.output;  // no training step after it
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / "latest"));
  if (!had_png) {
    EXPECT_FALSE(fs::exists("/dev/full.png"));
  }
}

// `longtron --version`, and `cmake --install` to a prefix puts a working binary in PREFIX/bin.
TEST(TrainRunCli, VersionAndInstall) {
  auto r = run_longtron("--version");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "longtron 0.")) << r.output;
  TempDir prefix;
  r = run_command(std::string(LONGTRON_CMAKE) + " --install " + LONGTRON_BUILD_DIR + " --prefix " +
                  prefix.path().string());
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_command((prefix / "bin" / "longtron").string() + " --version");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "longtron 0.")) << r.output;
}
