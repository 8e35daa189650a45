// `mpirun longtron train` with parallel.sequence_2D (2D-Attention: head parallel × context
// parallel under isp, docs/isp.md): losses, gradient norms and the validation loss equal one
// process's;
// impossible sequence_2D settings stop the job before any work, naming the rule.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using longtron::testing::mpirun_longtron;
using longtron::testing::Prepared;
using longtron::testing::read_file;
using longtron::testing::run_longtron;

namespace {

struct Row {
  double loss = 0, grad_norm = 0, valid_loss = 0, cp_imbalance = 0;
};

/// step → (loss, grad_norm) of the training rows of a metrics file.
std::map<int64_t, Row> rows_of(const fs::path& metrics) {
  std::map<int64_t, Row> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const int64_t step = j["step"].get<int64_t>();
    if (j.contains("loss") && j.contains("grad_norm")) {
      out[step].loss = j["loss"].get<double>();
      out[step].grad_norm = j["grad_norm"].get<double>();
    }
    if (j.contains("cp_imbalance")) out[step].cp_imbalance = j["cp_imbalance"].get<double>();
    if (j.contains("valid_loss")) out[step].valid_loss = j["valid_loss"].get<double>();
  }
  return out;
}

// A constant learning rate (min_lr = lr), so that a run stopped at step 2 and resumed follows the
// 3-step run's schedule.
std::string args(const Prepared& p, const std::string& run, const std::string& extra,
                 int steps = 3) {
  return "train --config " + (p.dir / "tiny.toml").string() + " --set train.metrics_file=\"" +
         (p.dir / run / "metrics.jsonl").string() + "\" --set train.checkpoint_dir=\"" +
         (p.dir / run / "ckpt").string() + "\" --set train.total_steps=" + std::to_string(steps) +
         " --set train.valid_every=3 --set lr_scheduler.min_lr=1e-2 " + extra;
}

void expect_same(const std::map<int64_t, Row>& got, const std::map<int64_t, Row>& ref,
                 const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double e_loss = 0, e_norm = 0, e_valid = 0;
  for (const auto& [step, r] : ref) {
    if (r.valid_loss != 0)
      e_valid = std::max(e_valid, std::abs(got.at(step).valid_loss - r.valid_loss) / r.valid_loss);
    if (r.loss == 0) continue;  // a validation-only row (step 0)
    EXPECT_EQ(r.cp_imbalance, 0.0) << "one process writes no cp_imbalance";
    EXPECT_GE(got.at(step).cp_imbalance, 1.0) << what << " step " << step;
    EXPECT_LT(got.at(step).cp_imbalance, 3.0) << what << " step " << step;
    e_loss = std::max(e_loss, std::abs(got.at(step).loss - r.loss) / std::abs(r.loss));
    e_norm = std::max(e_norm, std::abs(got.at(step).grad_norm - r.grad_norm) / std::abs(r.grad_norm));
  }
  std::printf("[cp-cli] %-30s max rel err vs one process: loss %.2e, grad norm %.2e, valid loss "
              "%.2e\n",
              what.c_str(), e_loss, e_norm, e_valid);
  EXPECT_LT(e_valid, 1e-5) << what;
  EXPECT_LT(e_loss, 1e-5) << what;
  EXPECT_LT(e_norm, 1e-5) << what;
}

const std::string k2D = " --set parallel.tensor.mode=\"isp\" --set parallel.sequence_2D.enable=true";

TEST(CpCli, TrainsLikeOneProcessUnderMpirun) {
  Prepared p;
  auto r = run_longtron(args(p, "one", ""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto ref = rows_of(p.dir / "one" / "metrics.jsonl");
  ASSERT_GE(ref.size(), 3u);
  ASSERT_GT(ref.rbegin()->second.valid_loss, 0.0) << "no validation row";
  r = mpirun_longtron(2, args(p, "cp2", "--set parallel.tensor.size=2" + k2D +
                                            " --set parallel.sequence_2D.context_size=2"));
  ASSERT_EQ(r.status, 0) << r.output;
  expect_same(rows_of(p.dir / "cp2" / "metrics.jsonl"), ref, "cp2 zigzag");
  r = mpirun_longtron(4, args(p, "hp2cp2", "--set parallel.tensor.size=4 --set parallel.weight.size=4" +
                                               k2D + " --set parallel.sequence_2D.head_size=2"
                                               " --set parallel.sequence_2D.context_size=2"
                                               " --set parallel.sequence_2D.balance=\"document\""));
  ASSERT_EQ(r.status, 0) << r.output;
  expect_same(rows_of(p.dir / "hp2cp2" / "metrics.jsonl"), ref, "hp2 x cp2 document W4");

  // Resume between layouts: 2 steps under hp1 x cp2 (contiguous), step 3 in one process.
  r = mpirun_longtron(2, args(p, "cp2ckpt", "--set parallel.tensor.size=2" + k2D +
                                                " --set parallel.sequence_2D.context_size=2"
                                                " --set parallel.sequence_2D.balance=\"contiguous\"",
                              2));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron(args(p, "resumed", "--resume " + (p.dir / "cp2ckpt" / "ckpt").string()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto resumed = rows_of(p.dir / "resumed" / "metrics.jsonl");
  ASSERT_TRUE(resumed.count(3)) << r.output;
  EXPECT_FALSE(resumed.count(1) && resumed.at(1).loss != 0) << "trained from scratch, not resumed";
  const double e = std::abs(resumed.at(3).loss - ref.at(3).loss) / ref.at(3).loss;
  std::printf("[cp-cli] cp2 checkpoint resumed in one process: step-3 loss rel err %.2e\n", e);
  EXPECT_LT(e, 1e-5);
}

TEST(CpCli, ImpossibleSettingsStopTheJobFirst) {
  Prepared p;
  auto refused = [&](const std::string& extra, const std::string& words) {
    auto r = run_longtron(args(p, "bad", extra));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find(words), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(p.dir / "bad" / "metrics.jsonl")) << "work started before the error";
  };
  refused("--set parallel.tensor.size=2" + k2D + " --set parallel.sequence_2D.context_size=4",
          "head_size (1) x context_size (4) must equal parallel.tensor.size (2)");
  refused("--set parallel.sequence_2D.enable=true --set parallel.sequence_2D.context_size=1",
          "2D-Attention needs parallel.tensor.mode = \"isp\"");
  refused("--set parallel.tensor.size=4" + k2D +
              " --set parallel.sequence_2D.head_size=2 --set parallel.sequence_2D.context_size=2"
              " --set parallel.sequence_2D.device_placement_strategy.interleaved=true",
          "interleaved = true needs head_first = false when head_size (2) > 1");
  refused("--set parallel.tensor.size=4" + k2D +
              " --set parallel.sequence_2D.context_size=4 --set parallel.sequence_2D.window_size=3",
          "window_size (3) must divide context_size (4)");
  refused("--set parallel.sequence_2D.balance=\"ring\"", "is not one of contiguous | zigzag | document");
  // One process cannot hold the tensor group of 2 (the layout check names the size).
  refused("--set parallel.tensor.size=2" + k2D + " --set parallel.sequence_2D.context_size=2",
          "parallel.tensor.size");
}

}  // namespace
