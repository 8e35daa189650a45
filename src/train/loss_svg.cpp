// The loss picture of metrics.h: a hand-written SVG line chart (no plotting dependency).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "train/metrics.h"

namespace longtron::train {
namespace fs = std::filesystem;

namespace {

/// "Nice" tick positions (1, 2, 5 × 10^k) covering [lo, hi] with about `count` ticks.
std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

/// XML-escapes text (the title comes from a file name).
std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

std::string label(double v) {
  std::ostringstream s;
  s << std::setprecision(4) << v;
  return s.str();
}

}  // namespace

void write_loss_svg(const fs::path& path, const std::vector<TrainRow>& train,
                    const std::vector<ValidRow>& valid, const std::string& title) {
  constexpr double W = 800, H = 480, L = 70, R = 20, T = 40, B = 55;  // size and margins (px)
  std::vector<std::pair<double, double>> tp, vp;
  for (const auto& r : train)
    if (std::isfinite(r.loss)) tp.emplace_back(double(r.step), r.loss);
  for (const auto& r : valid)
    if (std::isfinite(r.valid_loss)) vp.emplace_back(double(r.step), r.valid_loss);
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool any = false;
  for (const auto* pts : {&tp, &vp})
    for (const auto& [x, y] : *pts) {
      if (!any) x0 = x1 = x, y0 = y1 = y, any = true;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };

  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << escape(title)
    << "</text>\n";
  // Axes, grid and ticks.
  s << "<g stroke=\"#ccc\" stroke-width=\"1\">\n";
  const auto xt = nice_ticks(x0, x1, 10), yt = nice_ticks(y0, y1, 8);
  for (double t : xt)
    if (t >= x0 && t <= x1)
      s << "<line x1=\"" << px(t) << "\" y1=\"" << T << "\" x2=\"" << px(t) << "\" y2=\"" << H - B << "\"/>\n";
  for (double t : yt)
    if (t >= y0 && t <= y1)
      s << "<line x1=\"" << L << "\" y1=\"" << py(t) << "\" x2=\"" << W - R << "\" y2=\"" << py(t) << "\"/>\n";
  s << "</g>\n<g stroke=\"black\" stroke-width=\"1.2\">\n"
    << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\"/>\n"
    << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\"/>\n</g>\n";
  for (double t : xt)
    if (t >= x0 && t <= x1)
      s << "<text x=\"" << px(t) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">" << label(t)
        << "</text>\n";
  for (double t : yt)
    if (t >= y0 && t <= y1)
      s << "<text x=\"" << L - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << label(t)
        << "</text>\n";
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 12 << "\" text-anchor=\"middle\">step</text>\n"
    << "<text x=\"18\" y=\"" << (T + H - B) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
    << (T + H - B) / 2 << ")\">loss (nats/token)</text>\n";
  // Curves.
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* color) {
    if (pts.empty()) return;
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : pts) s << px(x) << "," << py(y) << " ";
    s << "\"/>\n";
  };
  polyline(tp, "#1f77b4");
  polyline(vp, "#d62728");
  for (const auto& [x, y] : vp)
    s << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3\" fill=\"#d62728\"/>\n";
  // Legend.
  const double lx = W - R - 150, ly = T + 10;
  s << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"140\" height=\"44\" fill=\"white\" "
       "stroke=\"#999\"/>\n"
    << "<line x1=\"" << lx + 10 << "\" y1=\"" << ly + 15 << "\" x2=\"" << lx + 35 << "\" y2=\"" << ly + 15
    << "\" stroke=\"#1f77b4\" stroke-width=\"2\"/><text x=\"" << lx + 42 << "\" y=\"" << ly + 19
    << "\">train loss</text>\n"
    << "<line x1=\"" << lx + 10 << "\" y1=\"" << ly + 33 << "\" x2=\"" << lx + 35 << "\" y2=\"" << ly + 33
    << "\" stroke=\"#d62728\" stroke-width=\"2\"/><circle cx=\"" << lx + 22.5 << "\" cy=\"" << ly + 33
    << "\" r=\"3\" fill=\"#d62728\"/><text x=\"" << lx + 42 << "\" y=\"" << ly + 37
    << "\">valid loss</text>\n</svg>\n";

  const std::string text = s.str();
  write_atomically(path, [&](const fs::path& tmp) {
    std::ofstream out(tmp);
    out << text;
    out.close();
    check(out.good(), "{}: write failed", path.string());
  });
}

}  // namespace longtron::train
