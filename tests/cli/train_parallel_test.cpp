// `mpirun -np 2 longtron train` with tensor parallelism: the losses of every step equal
// one process's; a checkpoint saved under one layout resumes under another with the same losses;
// layout errors stop the job before any work, naming the constraint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <chrono>
#include <map>
#include <random>
#include <sstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using longtron::testing::mpirun_longtron;
using longtron::testing::english_document;
using longtron::testing::jsonl_of;
using longtron::testing::losses;
using longtron::testing::max_rel_error;
using longtron::testing::prepare_corpus;
using longtron::testing::read_file;
using longtron::testing::run_command;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::tiny_model_toml;
using longtron::testing::write_file;

namespace {

/// A tiny prepared corpus (vocab 400) and a tiny model config on it (P = 2 × 64, 6 steps).
struct Prepared {
  TempDir dir;
  Prepared() {
    std::mt19937 gen(5);
    std::vector<std::string> docs;
    for (int d = 0; d < 16; ++d) docs.push_back(english_document(gen, 12 + d * 3));
    prepare_corpus(dir, jsonl_of(docs), "0");
    write_file(dir / "tiny.toml",
               tiny_model_toml(8) +
               "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
               "\"\nseq_len = 64\nmicro_bsz = 2\nmicro_num = 2\n"
               "[optimizer]\nlr = 1e-2\n"
               // A constant learning rate: the 3-step run then follows the 6-step run's schedule.
               "[lr_scheduler]\nmin_lr = 1e-2\n[train]\ntotal_steps = 6\nnum_threads = 1\n");
  }
  /// `train` arguments writing metrics (and checkpoints) under dir/<run>.
  std::string args(const std::string& run, const std::string& extra = "") const {
    return "train --config " + (dir / "tiny.toml").string() + " --set train.metrics_file=\"" +
           (dir / run / "metrics.jsonl").string() + "\" --set train.checkpoint_dir=\"" +
           (dir / run / "ckpt").string() + "\" " + extra;
  }
};

TEST(TrainParallel, TensorParallelMatchesOneProcessAndResumesInAnotherLayout) {
  Prepared p;
  auto r = run_longtron(p.args("one"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto ref = losses(p.dir / "one" / "metrics.jsonl");
  ASSERT_EQ(ref.size(), 6u);

  // dp 1 × tp 2 (MSP) for 3 steps: micro_num 2 rows per step, as the one process.
  r = mpirun_longtron(2, p.args("msp", "--set train.total_steps=3 --set parallel.tensor.size=2 "
                              "--set parallel.tensor.mode=\"msp\""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto msp = losses(p.dir / "msp" / "metrics.jsonl");
  EXPECT_EQ(msp.size(), 3u);
  const double e1 = max_rel_error(msp, ref);
  EXPECT_LT(e1, 1e-4);

  // dp 2 with one row each: the sampler's union is the one process's two rows per step.
  r = mpirun_longtron(2, p.args("dp", "--set train.total_steps=3 --set data.micro_num=1"));
  ASSERT_EQ(r.status, 0) << r.output;
  const double e0 = max_rel_error(losses(p.dir / "dp" / "metrics.jsonl"), ref);
  EXPECT_LT(e0, 1e-4);

  // Resume that checkpoint under tp 2 FSP for steps 4–6.
  r = mpirun_longtron(2, p.args("msp", "--resume " + (p.dir / "msp" / "ckpt").string() +
                                  " --set parallel.tensor.size=2 --set parallel.tensor.mode=\"fsp\""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto resumed = losses(p.dir / "msp" / "metrics.jsonl");
  EXPECT_EQ(resumed.size(), 6u);
  const double e2 = max_rel_error(resumed, ref);
  EXPECT_LT(e2, 1e-4);

  // And the tp2 checkpoint of step 3 resumed in one process (HF-named full tensors).
  r = run_longtron(p.args("single", "--resume " + (p.dir / "msp" / "ckpt" / "step_3").string()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto single = losses(p.dir / "single" / "metrics.jsonl");
  EXPECT_EQ(single.size(), 3u);
  const double e3 = max_rel_error(single, ref);
  EXPECT_LT(e3, 1e-4);
  std::printf("[train-parallel] max rel loss err vs one process: tp2 msp %.2e, dp2 %.2e, resumed "
              "tp2 fsp %.2e, resumed one process %.2e\n", e1, e0, e2, e3);
}

// dp2 with ZeRO-1 reduce-scatters the gradients into the optimizer slices; --dump-grads gathers
// the full gradient, so the dump equals the all-reduce run's (ZeRO-1 off) byte for byte (a sum of
// two contributions has one order), and so does the step-1 loss; step 2 may differ in the last
// bits (the norm's double sum runs over the slices in another order). The step line gives the
// bytes sent: at step 2 (no dump) ZeRO-1's reduce-scatter and parameter all-gather send what the
// all-reduce alone sends (S/2 + S/2 = 2·(1/2)·S, ring bytes), and the console shows it.
TEST(TrainParallel, Dp2Zero1DumpsTheSameGradientsAsTheAllReduce) {
  Prepared p;
  std::map<std::string, std::map<int64_t, double>> runs;  // step → loss
  std::map<std::string, double> sent;                       // step 2's sent_mb
  for (const std::string z : {"-1", "1"}) {
    const std::string run = "z" + z;
    auto r = mpirun_longtron(2, p.args(run, "--set train.total_steps=2 --set data.micro_num=1 "
                                            "--set parallel.zero1.size=" + z + " --dump-grads " +
                                            (p.dir / run / "grads").string()));
    ASSERT_EQ(r.status, 0) << r.output;
    runs[z] = losses(p.dir / run / "metrics.jsonl");
    ASSERT_EQ(runs[z].size(), 2u);
    EXPECT_TRUE(longtron::testing::contains(r.output, "sent_mb ")) << r.output;
    std::istringstream in(read_file(p.dir / run / "metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j["step"] == 2) sent[z] = j["sent_mb"].get<double>();
    }
    EXPECT_GT(sent[z], 0.0);
  }
  EXPECT_NEAR(sent["-1"], sent["1"], 1e-3 * sent["1"]);
  EXPECT_EQ(runs["-1"][1], runs["1"][1]);
  EXPECT_NEAR(runs["-1"][2], runs["1"][2], 1e-6 * std::abs(runs["1"][2]));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(p.dir / "z1" / "grads")) {
    const fs::path other = p.dir / "z-1" / "grads" / entry.path().filename();
    ASSERT_TRUE(fs::exists(other)) << other;
    EXPECT_TRUE(read_file(entry.path()) == read_file(other)) << entry.path().filename();
    ++files;
  }
  EXPECT_GT(files, 0u);
}

TEST(TrainParallel, LayoutErrorsStopTheJobFirst) {
  Prepared p;
  // One kv head cannot be split over 2 tensor ranks.
  auto r = mpirun_longtron(2, p.args("kv", "--set parallel.tensor.size=2 --set model.num_kv_attention_heads=1"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("num_kv_attention_heads (1)"), std::string::npos) << r.output;
  // A world of one process cannot hold tensor size 2.
  r = run_longtron(p.args("world", "--set parallel.tensor.size=2"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("parallel.tensor.size"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "world" / "metrics.jsonl")) << "work started before the error";
}

// Rank 0 alone fails (its checkpoint folder cannot be created) while rank 1 goes on into the next
// step's collectives: the job must end within seconds with rank 0's error, not hang.
TEST(TrainParallel, ARankThatThrowsEndsTheJobWithItsError) {
  Prepared p;
  write_file(p.dir / "blocker", "a file where the checkpoint folder should go");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = mpirun_longtron(2, p.args("throw", "--set parallel.tensor.size=2 --set train.save_every=1 "
                                     "--set train.checkpoint_dir=\"" +
                                         (p.dir / "blocker" / "ckpt").string() + "\""));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "timed out (hang): " << r.output;
  EXPECT_NE(r.output.find("rank 0: error:"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 60.0) << r.output;
}

/// The JSON line of `eval --json` in a command's output (the other lines are stderr's).
nlohmann::json eval_json(const std::string& output) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("{\"documents\"", 0) == 0) return nlohmann::json::parse(line);
  ADD_FAILURE() << "no eval --json line in:\n" << output;
  return nlohmann::json::object();
}

// eval goes through the engine like training: under mpirun with tensor parallelism (Megatron and
// ISP, whose ranks each score a slice of every row; 2D-Attention's context parallelism, each
// balance) and with data parallelism, every document's tokens and loss equal one process's.
TEST(TrainParallel, EvalJsonUnderTensorAndDataParallelEqualsOneProcess) {
  Prepared p;
  auto r = run_longtron(p.args("one", "--set train.total_steps=1"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string eval = "eval --json --threads 1 --checkpoint " + (p.dir / "one" / "ckpt").string() +
                           " --data " + (p.dir / "data" / "train").string();
  r = run_longtron(eval);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json ref = eval_json(r.output);
  ASSERT_GT(ref["documents"].size(), 4u);
  for (const std::string layout :
       {"--tensor-size 2", "--tensor-size 2 --tensor-mode isp", "",
        "--tensor-size 2 --tensor-mode isp --context-size 2",
        "--tensor-size 2 --tensor-mode isp --context-size 2 --context-balance contiguous",
        "--tensor-size 2 --tensor-mode isp --context-size 2 --context-balance document"}) {
    r = mpirun_longtron(2, eval + " " + layout);
    ASSERT_EQ(r.status, 0) << layout << "\n" << r.output;
    const nlohmann::json got = eval_json(r.output);
    ASSERT_EQ(got["documents"].size(), ref["documents"].size()) << layout;
    double worst = 0;
    for (size_t i = 0; i < ref["documents"].size(); ++i) {
      const auto &a = got["documents"][i], &b = ref["documents"][i];
      EXPECT_EQ(a["index"], b["index"]) << layout;
      EXPECT_EQ(a["tokens"], b["tokens"]) << layout << " document " << i;
      const double want = b["loss_sum"].get<double>();
      worst = std::max(worst, std::abs(a["loss_sum"].get<double>() - want) / std::max(std::abs(want), 1e-30));
    }
    EXPECT_LT(worst, 1e-5) << layout;
    EXPECT_NEAR(got["loss"].get<double>(), ref["loss"].get<double>(), 1e-5 * ref["loss"].get<double>()) << layout;
    std::printf("[eval] mpirun -np 2 %s: max relative document loss_sum error %.2e\n",
                layout.empty() ? "(dp2)" : layout.c_str(), worst);
  }
}

}  // namespace
