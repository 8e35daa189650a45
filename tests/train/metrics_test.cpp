// Metrics rows exactly as SPEC §4.3, resume trimming, and the loss SVG.
#include "train/metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "test_util.h"

using longtron::testing::read_file;
using longtron::testing::TempDir;
namespace tr = longtron::train;

namespace {
std::vector<nlohmann::json> lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(p));
  for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}
tr::TrainRow row(int64_t step, double loss) {
  return {step, loss, 0.5, 1e-3, 2048, 1000.0, 0.25, 2.048};
}
}  // namespace

TEST(Metrics, RowsHaveExactlyTheSpecKeys) {
  TempDir dir;
  {
    tr::MetricsWriter m(dir / "run" / "metrics.jsonl", {.total_steps = 5, .log_every = 2, .console = false});
    m.valid({0, 6.0});
    for (int s = 1; s <= 5; ++s) m.train(row(s, 6.0 - s));
    m.valid({5, 1.5});
    m.finish();
    EXPECT_EQ(m.svg_path(), dir / "run" / "metrics.svg");
  }
  const auto rows = lines(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 5u);  // valid 0, steps 2, 4, 5 (last), valid 5
  EXPECT_EQ(rows[0], (nlohmann::json{{"step", 0}, {"valid_loss", 6.0}}));
  EXPECT_EQ(rows[1]["step"], 2);
  EXPECT_EQ(rows[3]["step"], 5);
  std::vector<std::string> keys;
  for (const auto& [k, v] : rows[1].items()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"grad_norm", "loss", "lr", "mfu", "step", "step_time_s",
                                            "tgs", "tokens"}));
  EXPECT_EQ(rows[1]["tokens"], 2048);
  EXPECT_DOUBLE_EQ(rows[1]["loss"].get<double>(), 4.0);
  const std::string svg = read_file(dir / "run" / "metrics.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("train loss"), std::string::npos);
  EXPECT_NE(svg.find("valid loss"), std::string::npos);
  EXPECT_NE(svg.find(">step<"), std::string::npos);
}

TEST(Metrics, NonFiniteBecomesNullAndReadsBack) {
  tr::TrainRow r = row(1, std::nan(""));
  const auto j = nlohmann::json::parse(tr::to_json_line(r));
  EXPECT_TRUE(j["loss"].is_null());
  TempDir dir;
  longtron::testing::write_file(dir / "m.jsonl", tr::to_json_line(r) + "\n" + tr::to_json_line(tr::ValidRow{1, 2.5}) + "\n");
  std::vector<tr::TrainRow> t;
  std::vector<tr::ValidRow> v;
  tr::read_metrics(dir / "m.jsonl", t, v);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(std::isnan(t[0].loss));
  EXPECT_EQ(t[0].tokens, 2048);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_DOUBLE_EQ(v[0].valid_loss, 2.5);
  longtron::testing::write_file(dir / "bad.jsonl", "{\"step\": 1, \"loss\": 2}\nnot json\n");
  try {
    tr::read_metrics(dir / "bad.jsonl", t, v);
    FAIL();
  } catch (const longtron::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
  }
}

TEST(Metrics, ResumeKeepsRowsUpToTheCheckpoint) {
  TempDir dir;
  const auto path = dir / "m.jsonl";
  {
    tr::MetricsWriter m(path, {.total_steps = 6, .console = false});
    m.valid({0, 9.0});
    for (int s = 1; s <= 5; ++s) m.train(row(s, 9.0 - s));  // "crashed" after step 5
  }
  {
    tr::MetricsWriter m(path, {.total_steps = 6, .console = false, .resume_step = 3});
    EXPECT_EQ(m.train_rows().size(), 3u);
    for (int s = 4; s <= 6; ++s) m.train(row(s, 9.0 - s));
    m.valid({6, 2.0});
  }
  const auto rows = lines(path);
  ASSERT_EQ(rows.size(), 8u);
  for (int s = 1; s <= 6; ++s) EXPECT_EQ(rows[size_t(s)]["step"], s);
  EXPECT_EQ(rows[7]["valid_loss"], 2.0);
}
