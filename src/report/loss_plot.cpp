// The loss picture (see loss_plot.h).
#include "report/loss_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"

namespace longtron::report {
namespace fs = std::filesystem;
using raster::Image;
using raster::Rgb;

namespace {

constexpr int kWidth = 800, kHeight = 480;               // picture size (px)
constexpr int kRight = 24, kTop = 44, kBottom = 64;      // plot-area margins (px); left one varies
constexpr int kScale = 2;                                 // font pixel size: 10×14 px glyphs
constexpr Rgb kBlack{0, 0, 0}, kGrid{225, 225, 225}, kBorder{150, 150, 150}, kWhite{255, 255, 255};

using Points = LossPoints;

/// Data ranges and the mapping from (step, loss) to pixel coordinates.
struct Frame {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  std::vector<double> xticks, yticks;
  int left = 0;  ///< left margin: room for the y-axis title and the widest y tick label
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (kWidth - left - kRight - 1); }
  double py(double y) const { return kHeight - kBottom - (y - y0) / (y1 - y0) * (kHeight - kTop - kBottom - 1); }
};

/// "Nice" tick positions (1, 2, 5 × 10^k, at least `min_step` apart) in [lo, hi], about `count`.
std::vector<double> nice_ticks(double lo, double hi, int count, double min_step) {
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  step = std::max(step, min_step);
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step); k * step <= hi + step * 1e-9; k += 1)
    ticks.push_back(std::fabs(k) < 0.5 ? 0.0 : k * step);  // k·step, not a running sum: no drift
  return ticks;
}

std::string tick_label(double v) { return fmt::format("{:.6g}", v); }

Frame frame_of(const Points& train, const Points& valid) {
  Frame f;
  bool any = false;
  for (const Points* pts : {&train, &valid})
    for (const auto& [x, y] : *pts) {
      if (!any) f.x0 = f.x1 = x, f.y0 = f.y1 = y, any = true;
      f.x0 = std::min(f.x0, x), f.x1 = std::max(f.x1, x);
      f.y0 = std::min(f.y0, y), f.y1 = std::max(f.y1, y);
    }
  if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
  if (f.y1 <= f.y0) f.y0 -= 0.5, f.y1 += 0.5;
  const double pad = 0.05 * (f.y1 - f.y0);  // keeps curves off the axes
  f.y0 -= pad, f.y1 += pad;
  f.xticks = nice_ticks(f.x0, f.x1, 8, 1.0);  // steps are integers
  f.yticks = nice_ticks(f.y0, f.y1, 8, 0.0);
  int label_width = 0;
  for (double t : f.yticks) label_width = std::max(label_width, raster::text_width(tick_label(t), kScale));
  f.left = 8 + raster::text_height(kScale) + 12 + label_width + 9;  // title, gap, labels, tick marks
  return f;
}

/// Grid lines, axes, tick marks, tick labels and the axis titles.
void draw_axes(Image& img, const Frame& f) {
  const int bottom = kHeight - kBottom, right = kWidth - kRight - 1;
  const int left = f.left;
  const auto& xt = f.xticks;
  const auto& yt = f.yticks;
  for (double t : xt) img.line(f.px(t), kTop, f.px(t), bottom, kGrid);
  for (double t : yt) img.line(left, f.py(t), right, f.py(t), kGrid);
  img.line(left, bottom, right, bottom, kBlack);
  img.line(left, kTop, left, bottom, kBlack);
  for (double t : xt) {
    const int x = int(std::lround(f.px(t)));
    img.line(x, bottom, x, bottom + 5, kBlack);
    const std::string s = tick_label(t);
    const int w = raster::text_width(s, kScale);  // centred under the tick, but kept in the picture
    raster::draw_text(img, s, std::min(x - w / 2, kWidth - 2 - w), bottom + 10, kScale, kBlack);
  }
  for (double t : yt) {
    const int y = int(std::lround(f.py(t)));
    img.line(left - 5, y, left, y, kBlack);
    const std::string s = tick_label(t);
    raster::draw_text(img, s, left - 9 - raster::text_width(s, kScale), y - raster::text_height(kScale) / 2,
                      kScale, kBlack);
  }
  const std::string xlabel = "step", ylabel = "loss (nats/token)";
  raster::draw_text(img, xlabel, (left + right - raster::text_width(xlabel, kScale)) / 2,
                    kHeight - raster::text_height(kScale) - 10, kScale, kBlack);
  raster::draw_text_up(img, ylabel, 8, (kTop + bottom + raster::text_width(ylabel, kScale)) / 2, kScale,
                       kBlack);
}

void draw_curve(Image& img, const Frame& f, const Points& pts, Rgb c, bool markers) {
  for (size_t i = 1; i < pts.size(); ++i)
    img.line(f.px(pts[i - 1].first), f.py(pts[i - 1].second), f.px(pts[i].first), f.py(pts[i].second), c, 2);
  if (markers || pts.size() == 1)  // a lone point has no line: give it a marker to be seen
    for (const auto& [x, y] : pts) img.disc(f.px(x), f.py(y), 3.5, c);
}

/// Number of curve-coloured pixels in x in [x0, x1), y in [y0, y1).
int curve_pixels(const Image& img, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = std::max(y0, 0); y < std::min(y1, img.height()); ++y)
    for (int x = std::max(x0, 0); x < std::min(x1, img.width()); ++x) {
      const Rgb c = img.at(x, y);
      n += c == kTrainLossColor || c == kValidLossColor;
    }
  return n;
}

/// A boxed legend, one entry per non-empty series, in the corner of the plot area that hides the
/// fewest curve pixels (top right on a tie, where a falling loss curve usually leaves room).
void draw_legend(Image& img, int left, bool train, bool valid) {
  const int rows = int(train) + int(valid);
  if (rows == 0) return;
  const int w = 40 + raster::text_width("valid loss", kScale) + 12, h = 10 + 22 * rows;
  const int xs[] = {kWidth - kRight - 12 - w, left + 12}, ys[] = {kTop + 10, kHeight - kBottom - 10 - h};
  int x = xs[0], y = ys[0], best = -1;
  for (int yc : ys)
    for (int xc : xs)
      if (const int n = curve_pixels(img, xc, yc, xc + w + 1, yc + h + 1); best < 0 || n < best)
        best = n, x = xc, y = yc;
  img.fill_rect(x, y, x + w, y + h, kWhite);
  img.frame_rect(x, y, x + w, y + h, kBorder);
  int row_y = y + 16;
  auto entry = [&](const char* name, Rgb c, bool marker) {
    img.line(x + 8, row_y, x + 32, row_y, c, 2);
    if (marker) img.disc(x + 20, row_y, 3.5, c);
    raster::draw_text(img, name, x + 40, row_y - raster::text_height(kScale) / 2, kScale, kBlack);
    row_y += 22;
  };
  if (train) entry("train loss", kTrainLossColor, false);
  if (valid) entry("valid loss", kValidLossColor, true);
}

}  // namespace

void write_loss_plot(const fs::path& path, const LossPoints& train, const LossPoints& valid,
                     const std::string& title) {
  Points tp, vp;
  for (const auto& p : train)
    if (std::isfinite(p.second)) tp.push_back(p);
  for (const auto& p : valid)
    if (std::isfinite(p.second)) vp.push_back(p);
  const Frame f = frame_of(tp, vp);

  Image img(kWidth, kHeight, kWhite);
  raster::draw_text(img, title, (kWidth - raster::text_width(title, kScale)) / 2, 14, kScale, kBlack);
  draw_axes(img, f);
  draw_curve(img, f, tp, kTrainLossColor, false);
  draw_curve(img, f, vp, kValidLossColor, true);
  draw_legend(img, f.left, !tp.empty(), !vp.empty());

  const std::string png = raster::encode_png(img);
  write_atomically(path, [&](const fs::path& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    out.write(png.data(), std::streamsize(png.size()));
    out.close();
    check(out.good(), "{}: write failed ({})", path.string(), io_error_text());
  });
}

}  // namespace longtron::report
