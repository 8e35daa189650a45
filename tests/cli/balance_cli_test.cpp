// data.balance end to end: `inspect --dp-size` shows every rank's micro-batches and cost; under
// `mpirun -np 2` "rows" gives the losses of "none" (the same rows per step, re-assigned), and
// "documents" gives the same losses in dp 2 as one process with micro_num × 2; metrics rows carry
// `imbalance`; a "documents" run resumes exactly; refused settings name their keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <sstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using longtron::testing::mpirun_longtron;
using longtron::testing::english_document;
using longtron::testing::jsonl_of;
using longtron::testing::prepare_corpus;
using longtron::testing::read_file;
using longtron::testing::run_command;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::tiny_model_toml;
using longtron::testing::write_file;
using nlohmann::json;

namespace {

/// Documents of very different lengths (so rows differ in attention work), a tiny model on them
/// (P = 2 × 64, micro_num 2, 4 steps).
struct Prepared {
  TempDir dir;
  Prepared() {
    std::mt19937 gen(8);
    std::vector<std::string> docs;
    for (int d = 0; d < 40; ++d) docs.push_back(english_document(gen, d % 5 == 0 ? 14 : 1 + d % 3));
    prepare_corpus(dir, jsonl_of(docs), "0");
    write_file(dir / "tiny.toml",
               tiny_model_toml(8) + "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
                   "\"\nseq_len = 64\nmicro_bsz = 2\nmicro_num = 2\n"
                   "[optimizer]\nlr = 1e-2\n[lr_scheduler]\nmin_lr = 1e-2\n"
                   "[train]\ntotal_steps = 4\nnum_threads = 1\n");
  }
  std::string args(const std::string& run, const std::string& extra = "") const {
    return "train --config " + (dir / "tiny.toml").string() + " --set train.metrics_file=\"" +
           (dir / run / "metrics.jsonl").string() + "\" --set train.checkpoint_dir=\"" +
           (dir / run / "ckpt").string() + "\" " + extra;
  }
  std::string data() const { return (dir / "data" / "train").string(); }
};

/// step → training row of a metrics file.
std::map<int64_t, json> train_rows(const fs::path& metrics) {
  std::map<int64_t, json> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j;
  }
  return out;
}

double max_rel(const std::map<int64_t, json>& a, const std::map<int64_t, json>& b, const char* key) {
  double e = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [step, row] : a) {
    if (!b.count(step)) continue;
    const double x = row[key].get<double>(), y = b.at(step)[key].get<double>();
    e = std::max(e, std::abs(x - y) / std::max(std::abs(y), 1e-30));
  }
  return e;
}

TEST(BalanceCli, InspectShowsEveryRankAndItsCost) {
  Prepared p;
  const std::string base = "inspect --data " + p.data() + " --seq-len 64 --micro-bsz 2 --micro-num 2 "
                           "--steps 2 --json --balance-cost 1,0.5";
  for (const char* mode : {"none", "rows", "documents"}) {
    auto r = run_longtron(base + " --dp-size 2 --balance " + mode);
    ASSERT_EQ(r.status, 0) << r.output;
    const json j = json::parse(r.output);
    ASSERT_EQ(j["steps"].size(), 2u);
    for (const auto& step : j["steps"]) {
      ASSERT_EQ(step["dp_ranks"].size(), 2u);
      double top = 0, sum = 0;
      for (const auto& rank : step["dp_ranks"]) {
        ASSERT_EQ(rank["micro_batches"].size(), 2u);
        double cost = 0;  // recomputed from the printed cu_seqlens
        for (const auto& mb : rank["micro_batches"]) {
          const auto cu = mb["cu_seqlens"].get<std::vector<int32_t>>();
          for (size_t s = 1; s < cu.size(); ++s) {
            const double l = cu[s] - cu[s - 1];
            cost += 1.0 * l + 0.5 * l * (l + 1) / 2;
          }
        }
        EXPECT_NEAR(rank["cost"].get<double>(), cost, 1e-9 * cost) << mode;
        top = std::max(top, cost);
        sum += cost;
      }
      EXPECT_NEAR(step["imbalance"].get<double>(), top / (sum / 2), 1e-12) << mode;
    }
  }
  // Without --dp-size: today's layout.
  auto r = run_longtron(base);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(json::parse(r.output)["steps"][0].contains("micro_batches"));
  // Refusals name what is wrong.
  r = run_longtron(base + " --dp-size 2 --balance documents --unpacked");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.use_packed_dataset"), std::string::npos) << r.output;
  r = run_longtron(base + " --dp-size 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--dp-size must be > 0, got 0"), std::string::npos) << r.output;
  r = run_longtron(base + " --dp-size 2 --balance bogus");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--balance"), std::string::npos) << r.output;
  r = run_longtron(base + " --balance rows");  // no data-parallel layout to balance: said, not ignored
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--balance needs --dp-size"), std::string::npos) << r.output;
}

TEST(BalanceCli, RowsMatchesNoneAndDocumentsMatchesOneProcessUnderMpi) {
  Prepared p;
  auto r = mpirun_longtron(2, p.args("none"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = mpirun_longtron(2, p.args("rows", "--set data.balance=\"rows\""));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto none = train_rows(p.dir / "none" / "metrics.jsonl");
  const auto rows = train_rows(p.dir / "rows" / "metrics.jsonl");
  ASSERT_EQ(none.size(), 4u);
  const double loss_err = max_rel(rows, none, "loss"), norm_err = max_rel(rows, none, "grad_norm");
  EXPECT_LT(loss_err, 1e-6);
  EXPECT_LT(norm_err, 1e-6);
  double worst = 0;
  int improved = 0;  // steps whose rows "rows" did re-assign to better effect
  for (const auto& [step, row] : none) {
    const double a = row["imbalance"].get<double>(), b = rows.at(step)["imbalance"].get<double>();
    EXPECT_GE(a, 1.0);
    EXPECT_LE(b, a + 1e-12);
    improved += b < a - 1e-9;
    worst = std::max(worst, a);
  }
  EXPECT_GT(worst, 1.0);  // the corpus does make ranks differ
  EXPECT_GT(improved, 0);

  // "documents": dp 2 × micro_num 2 against one process × micro_num 4 (the same global batch).
  r = mpirun_longtron(2, p.args("docs2", "--set data.balance=\"documents\" --set data.balance_window=2"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron(p.args("docs1", "--set data.balance=\"documents\" --set data.balance_window=2 "
                                   "--set data.micro_num=4"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto d2 = train_rows(p.dir / "docs2" / "metrics.jsonl");
  const auto d1 = train_rows(p.dir / "docs1" / "metrics.jsonl");
  const double docs_err = max_rel(d2, d1, "loss");
  EXPECT_LT(docs_err, 1e-5);
  std::printf("[balance] rows vs none: loss %.2e, grad_norm %.2e; documents dp2 vs one process: "
              "loss %.2e\n", loss_err, norm_err, docs_err);
}

TEST(BalanceCli, DocumentsResumeExactly) {
  Prepared p;
  const std::string docs = "--set data.balance=\"documents\" --set data.balance_window=3 ";
  auto r = run_longtron(p.args("full", docs));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron(p.args("part", docs + "--set train.total_steps=2"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron(p.args("part", docs + "--resume " + (p.dir / "part" / "ckpt").string()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto full = train_rows(p.dir / "full" / "metrics.jsonl");
  const auto part = train_rows(p.dir / "part" / "metrics.jsonl");
  ASSERT_EQ(part.size(), 4u);
  for (const auto& [step, row] : full)
    EXPECT_DOUBLE_EQ(part.at(step)["loss"].get<double>(), row["loss"].get<double>()) << step;
}

TEST(BalanceCli, RefusedSettingsNameTheirKeys) {
  Prepared p;
  auto r = run_longtron(p.args("x", "--set data.balance=\"documents\" --set data.use_packed_dataset=false"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.use_packed_dataset"), std::string::npos) << r.output;
  r = run_longtron(p.args("x", "--set data.balance=\"documents\" --set data.pack_sample_into_one=true"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.pack_sample_into_one"), std::string::npos) << r.output;
  r = run_longtron(p.args("x", "--set data.balance=\"documents\" --set data.split_documents=false"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.split_documents"), std::string::npos) << r.output;
  r = run_longtron(p.args("x", "--set data.balance=\"tokens\""));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.balance"), std::string::npos) << r.output;
  r = run_longtron(p.args("x", "--set data.balance_cost=[1]"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.balance_cost"), std::string::npos) << r.output;
  r = run_longtron(p.args("x", "--set data.balance_window=0"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("data.balance_window"), std::string::npos) << r.output;
}

}  // namespace
