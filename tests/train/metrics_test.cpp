// Metrics rows exactly as docs/training.md lists them, resume trimming, and the loss picture (PNG).
#include "train/metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

/// A decoded 8-bit RGB PNG as written by write_loss_plot (checks the format on the way).
struct Decoded {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  size_t count(longtron::report::raster::Rgb c) const {
    size_t n = 0;
    for (size_t i = 0; i + 2 < rgb.size(); i += 3) n += rgb[i] == c.r && rgb[i + 1] == c.g && rgb[i + 2] == c.b;
    return n;
  }
};
uint32_t be32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | uint8_t(s[at + i]);
  return v;
}
/// Walks the chunks (verifying each CRC), inflates the IDAT data with zlib and undoes filter 0.
Decoded decode_png(const std::string& png) {
  Decoded d;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  bool ended = false;
  for (size_t at = 8; at + 12 <= png.size() && !ended;) {
    const uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    EXPECT_LE(at + 12 + len, png.size());
    const auto* bytes = reinterpret_cast<const Bytef*>(png.data() + at + 4);
    EXPECT_EQ(crc32(0L, bytes, len + 4), be32(png, at + 8 + len)) << type;
    if (type == "IHDR") {
      d.width = be32(png, at + 8), d.height = be32(png, at + 12);
      EXPECT_EQ(png.substr(at + 16, 5), std::string("\x08\x02\0\0\0", 5));  // 8-bit RGB
    }
    if (type == "IDAT") idat += png.substr(at + 8, len);
    ended = type == "IEND";
    at += 12 + len;
  }
  EXPECT_TRUE(ended);
  const size_t row = size_t(d.width) * 3 + 1;
  std::vector<uint8_t> raw(row * d.height + 1);  // one spare byte: longer data would show up
  uLongf raw_size = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()), Z_OK);
  EXPECT_EQ(raw_size, row * d.height);  // exactly `height` scanlines
  for (size_t y = 0; y < d.height && (y + 1) * row <= raw_size; ++y) {
    EXPECT_EQ(raw[y * row], 0) << "filter type of scanline " << y;
    d.rgb.insert(d.rgb.end(), raw.begin() + long(y * row + 1), raw.begin() + long((y + 1) * row));
  }
  return d;
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
    EXPECT_EQ(m.plot_path(), dir / "run" / "metrics.png");
  }
  const auto rows = lines(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 5u);  // valid 0, steps 2, 4, 5 (last), valid 5
  EXPECT_EQ(rows[0], (nlohmann::json{{"step", 0}, {"valid_loss", 6.0}}));
  EXPECT_EQ(rows[1]["step"], 2);
  EXPECT_EQ(rows[3]["step"], 5);
  std::vector<std::string> keys;
  for (const auto& [k, v] : rows[1].items()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"dtype", "grad_norm", "imbalance", "loss", "lr", "mfu",
                                            "step", "step_time_s", "tgs", "tokens"}));
  EXPECT_EQ(rows[1]["dtype"], "float32");
  EXPECT_EQ(rows[1]["tokens"], 2048);
  EXPECT_DOUBLE_EQ(rows[1]["loss"].get<double>(), 4.0);
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "metrics.png"));
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
  EXPECT_EQ(t[0].dtype, "float32");
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

// Under more than one rank the row carries the bytes rank 0 sent in the step (sent_mb); a
// one-process row (0) has no such key.
TEST(Metrics, SentMegabytesOnlyWhenSomethingWasSent) {
  tr::TrainRow r = row(1, 3.0);
  EXPECT_FALSE(nlohmann::json::parse(tr::to_json_line(r)).contains("sent_mb"));
  r.sent_mb = 62.93;
  TempDir dir;
  longtron::testing::write_file(dir / "m.jsonl", tr::to_json_line(r) + "\n");
  std::vector<tr::TrainRow> t;
  std::vector<tr::ValidRow> v;
  tr::read_metrics(dir / "m.jsonl", t, v);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_DOUBLE_EQ(t[0].sent_mb, 62.93);
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

TEST(LossPlot, IsAValidPngWithBothCurves) {
  TempDir dir;
  std::vector<tr::TrainRow> train;
  for (int s = 1; s <= 200; ++s) train.push_back(row(s, 2.0 + 7.0 * std::exp(-s / 40.0)));
  const std::vector<tr::ValidRow> valid{{0, 9.1}, {50, 4.2}, {100, 2.9}, {200, 2.3}};
  tr::write_loss_plot(dir / "p.png", train, valid, "run");
  const Decoded d = decode_png(read_file(dir / "p.png"));
  EXPECT_EQ(d.width, 800u);
  EXPECT_EQ(d.height, 480u);
  ASSERT_EQ(d.rgb.size(), 800u * 480u * 3u);
  EXPECT_GT(d.count({255, 255, 255}), d.rgb.size() / 3 / 2);  // white background
  EXPECT_GT(d.count({0, 0, 0}), 1000u);                          // axes and text
  EXPECT_GT(d.count(tr::kTrainLossColor), 600u);  // a 2 px line across ~700 px
  EXPECT_GT(d.count(tr::kValidLossColor), 200u);  // line, 4 markers, legend
}

TEST(LossPlot, EmptyValidSeriesDrawsNoValidColour) {
  TempDir dir;
  std::vector<tr::TrainRow> train;
  for (int s = 1; s <= 50; ++s) train.push_back(row(s, 5.0 - s * 0.05));
  tr::write_loss_plot(dir / "p.png", train, {}, "run");
  const Decoded d = decode_png(read_file(dir / "p.png"));
  EXPECT_GT(d.count(tr::kTrainLossColor), 600u);
  EXPECT_EQ(d.count(tr::kValidLossColor), 0u);  // not even a legend entry
  tr::write_loss_plot(dir / "none.png", {}, {}, "run");  // nothing at all: axes only
  EXPECT_EQ(decode_png(read_file(dir / "none.png")).count(tr::kTrainLossColor), 0u);
}

TEST(LossPlot, NonFiniteValuesAreSkipped) {
  // With the non-finite rows skipped the picture equals that of the finite rows alone; a NaN that
  // reached the axis range or a line would change it (or blank the curves).
  TempDir dir;
  std::vector<tr::TrainRow> finite, with_nan;
  for (int s = 1; s <= 100; ++s) {
    finite.push_back(row(s, 3.0 + std::sin(s * 0.1)));
    with_nan.push_back(finite.back());
    if (s == 40) with_nan.push_back(row(s, std::nan("")));
    if (s == 60) with_nan.push_back(row(s, INFINITY));
  }
  const std::vector<tr::ValidRow> valid{{0, 4.0}, {50, 3.5}, {100, 3.2}};
  std::vector<tr::ValidRow> valid_nan = valid;
  valid_nan.insert(valid_nan.begin() + 1, tr::ValidRow{25, std::nan("")});
  tr::write_loss_plot(dir / "a.png", finite, valid, "run");
  tr::write_loss_plot(dir / "b.png", with_nan, valid_nan, "run");
  const Decoded a = decode_png(read_file(dir / "a.png")), b = decode_png(read_file(dir / "b.png"));
  EXPECT_GT(b.count(tr::kTrainLossColor), 600u);
  EXPECT_TRUE(a.rgb == b.rgb);
  // Only NaN in the valid series: drawn like an empty one.
  tr::write_loss_plot(dir / "c.png", finite, {{10, std::nan("")}}, "run");
  EXPECT_EQ(decode_png(read_file(dir / "c.png")).count(tr::kValidLossColor), 0u);
}

TEST(LossPlot, UnwritablePathThrowsNamingIt) {
  TempDir dir;
  longtron::testing::write_file(dir / "file", "x");
  try {
    tr::write_loss_plot(dir / "file" / "p.png", {row(1, 2.0)}, {});
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("p.png"), std::string::npos) << e.what();
  }
}
