#include "train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"
#include "core/json_read.h"

namespace longtron::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double as_double(const json& j) { return j.is_number() ? j.get<double>() : std::nan(""); }
}  // namespace

std::string to_json_line(const TrainRow& r) {
  json j = {{"step", r.step},       {"loss", number(r.loss)}, {"grad_norm", number(r.grad_norm)},
            {"lr", number(r.lr)},   {"tokens", r.tokens},     {"tgs", number(r.tgs)},
            {"mfu", number(r.mfu)}, {"step_time_s", number(r.step_time_s)},
            {"dtype", r.dtype},     {"imbalance", number(r.imbalance)}};
  if (r.cp_imbalance > 0) j["cp_imbalance"] = number(r.cp_imbalance);
  if (r.sent_mb > 0) j["sent_mb"] = number(r.sent_mb);
  if (r.preference) {
    j["rewards_chosen"] = number(r.rewards_chosen);
    j["rewards_rejected"] = number(r.rewards_rejected);
    j["reward_accuracy"] = number(r.reward_accuracy);
    j["reward_margin"] = number(r.reward_margin);
    j["logps_chosen"] = number(r.logps_chosen);
    j["logps_rejected"] = number(r.logps_rejected);
  }
  return j.dump();
}

std::string to_json_line(const ValidRow& r) {
  json j{{"step", r.step}, {"valid_loss", number(r.valid_loss)}};
  if (r.preference) {
    j["valid_reward_accuracy"] = number(r.valid_reward_accuracy);
    j["valid_reward_margin"] = number(r.valid_reward_margin);
  }
  return j.dump();
}

void read_metrics(const fs::path& path, std::vector<TrainRow>& train, std::vector<ValidRow>& valid) {
  std::ifstream in(path);
  check(in.good(), "{}: cannot open metrics file", path.string());
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const json j = parse_json(line, fmt::format("{}:{}", path.string(), n));
    check(j.is_object() && j.contains("step") && j["step"].is_number_integer(),
          "{}:{}: row without an integer 'step'", path.string(), n);
    if (j.contains("valid_loss")) {
      valid.push_back({j["step"].get<int64_t>(), as_double(j["valid_loss"])});
    } else if (j.contains("loss")) {
      TrainRow r;
      r.step = j["step"].get<int64_t>();
      r.loss = as_double(j["loss"]);
      r.grad_norm = as_double(j.value("grad_norm", json()));
      r.lr = as_double(j.value("lr", json()));
      r.tokens = j.value("tokens", int64_t(0));
      r.tgs = as_double(j.value("tgs", json()));
      r.mfu = as_double(j.value("mfu", json()));
      r.step_time_s = as_double(j.value("step_time_s", json()));
      r.dtype = j.value("dtype", std::string("float32"));
      r.imbalance = as_double(j.value("imbalance", json(1.0)));
      r.cp_imbalance = as_double(j.value("cp_imbalance", json(0.0)));
      r.sent_mb = as_double(j.value("sent_mb", json(0.0)));
      r.preference = j.contains("reward_accuracy");
      if (r.preference) {
        r.rewards_chosen = as_double(j.value("rewards_chosen", json()));
        r.rewards_rejected = as_double(j.value("rewards_rejected", json()));
        r.reward_accuracy = as_double(j["reward_accuracy"]);
        r.reward_margin = as_double(j.value("reward_margin", json()));
        r.logps_chosen = as_double(j.value("logps_chosen", json()));
        r.logps_rejected = as_double(j.value("logps_rejected", json()));
      }
      train.push_back(r);
    } else {
      fail("{}:{}: row has neither 'loss' nor 'valid_loss'", path.string(), n);
    }
  }
}

MetricsWriter::MetricsWriter(const fs::path& metrics_file, const MetricsOptions& options)
    : path_(metrics_file), options_(options), start_(std::chrono::steady_clock::now()) {
  tty_ = options.progress && isatty(STDERR_FILENO);
  if (path_.empty()) return;
  if (!path_.parent_path().empty()) {
    std::error_code ec;
    fs::create_directories(path_.parent_path(), ec);
    check(!ec, "train.metrics_file = {}: cannot create its folder {} ({})", path_.string(),
          path_.parent_path().string(), ec.message());
  }
  if (options.resume_step >= 0 && fs::exists(path_)) {
    std::vector<TrainRow> t;
    std::vector<ValidRow> v;
    read_metrics(path_, t, v);
    for (const auto& r : t)
      if (r.step <= options.resume_step) train_rows_.push_back(r);
    for (const auto& r : v)
      if (r.step <= options.resume_step) valid_rows_.push_back(r);
    // Rewrite the kept rows (atomically), then continue appending.
    write_atomically(path_, [&](const fs::path& tmp) {
      std::ofstream out(tmp);
      size_t vi = 0;
      for (const auto& r : train_rows_) {
        while (vi < valid_rows_.size() && valid_rows_[vi].step < r.step)
          out << to_json_line(valid_rows_[vi++]) << "\n";
        out << to_json_line(r) << "\n";
      }
      while (vi < valid_rows_.size()) out << to_json_line(valid_rows_[vi++]) << "\n";
      out.close();
      check(out.good(), "train.metrics_file = {}: write failed ({})", path_.string(), io_error_text());
    });
  }
  file_ = std::fopen(path_.c_str(), options.resume_step >= 0 ? "a" : "w");
  check(file_ != nullptr, "train.metrics_file = {}: cannot create ({})", path_.string(),
        io_error_text());
}

MetricsWriter::~MetricsWriter() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() was the caller's chance to see errors
  }
  if (file_) std::fclose(file_);
}

void MetricsWriter::clear_progress() {
  if (progress_shown_) {
    std::fputs("\r\033[K", stderr);
    progress_shown_ = false;
  }
}

void MetricsWriter::emit(int64_t step, const std::string& console_line, const std::string& json_line) {
  if (file_) {
    // Flushed per row (a crash keeps every row written so far) and checked: a full disk ends the
    // run at this step instead of training on with no record.
    errno = 0;
    const bool ok = std::fputs((json_line + "\n").c_str(), file_) >= 0 && std::fflush(file_) == 0;
    if (!ok) {
      const int err = errno;
      failed_ = true;
      fail("train.metrics_file = {}: write failed at step {} ({}); the run stops here",
           path_.string(), step, io_error_text(err));
    }
  }
  if (options_.console) {
    clear_progress();
    std::fputs((console_line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
}

void MetricsWriter::train(const TrainRow& r) {
  train_rows_.push_back(r);
  const bool last = options_.total_steps > 0 && r.step >= options_.total_steps;
  if (r.step % std::max<int64_t>(options_.log_every, 1) == 0 || last) {
    emit(r.step, fmt::format("step {}/{}  loss {:.4f}  grad_norm {:.3f}  lr {:.3e}  tokens {}  tgs {:.1f}  "
                     "mfu {:.3f}  step_time_s {:.3f}  imbalance {:.3f}  {}{}", r.step,
                     options_.total_steps, r.loss, r.grad_norm, r.lr, r.tokens, r.tgs, r.mfu,
                     r.step_time_s, r.imbalance, r.dtype,
                     r.sent_mb > 0 ? fmt::format("  sent_mb {:.1f}", r.sent_mb) : "") +
             (r.preference
                  ? fmt::format("  rewards_chosen {:.4f}  rewards_rejected {:.4f}  "
                                "reward_accuracy {:.3f}  reward_margin {:.4f}  logps_chosen {:.3f}"
                                "  logps_rejected {:.3f}", r.rewards_chosen, r.rewards_rejected,
                                r.reward_accuracy, r.reward_margin, r.logps_chosen,
                                r.logps_rejected)
                  : std::string()),
         to_json_line(r));
  }
  if (tty_) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int64_t first = train_rows_.front().step - 1;
    const int64_t done = r.step - first;
    const double eta = done > 0 ? elapsed / double(done) * double(options_.total_steps - r.step) : 0;
    const double pct = options_.total_steps > 0 ? 100.0 * double(r.step) / double(options_.total_steps) : 0;
    std::fprintf(stderr, "\r\033[K[%5.1f%%] step %lld/%lld  loss %.4f  %.0f tok/s  eta %.0fs", pct,
                 static_cast<long long>(r.step), static_cast<long long>(options_.total_steps), r.loss,
                 r.step_time_s > 0 ? double(r.tokens) / r.step_time_s : 0.0, eta);
    std::fflush(stderr);
    progress_shown_ = true;
  }
}

void MetricsWriter::valid(const ValidRow& r) {
  valid_rows_.push_back(r);
  emit(r.step,
       fmt::format("step {}/{}  valid_loss {:.4f}", r.step, options_.total_steps, r.valid_loss) +
           (r.preference ? fmt::format("  valid_reward_accuracy {:.3f}  valid_reward_margin {:.4f}",
                                       r.valid_reward_accuracy, r.valid_reward_margin)
                         : std::string()),
       to_json_line(r));
}

void MetricsWriter::finish() {
  if (finished_) return;
  finished_ = true;
  clear_progress();
  if (failed_) return;  // the write error already ended the run; no picture of a partial record
  if (file_) std::fflush(file_);
  if (!path_.empty()) write_loss_plot(plot_path(), train_rows_, valid_rows_, path_.stem().string());
}

fs::path MetricsWriter::plot_path() const {
  if (path_.empty()) return {};
  return path_.parent_path() / (path_.stem().string() + ".png");
}

void write_loss_plot(const fs::path& path, const std::vector<TrainRow>& train,
                     const std::vector<ValidRow>& valid, const std::string& title) {
  report::LossPoints tp, vp;
  for (const TrainRow& r : train) tp.emplace_back(double(r.step), r.loss);
  for (const ValidRow& r : valid) vp.emplace_back(double(r.step), r.valid_loss);
  report::write_loss_plot(path, tp, vp, title);
}

}  // namespace longtron::train
