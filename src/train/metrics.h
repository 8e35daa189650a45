// Training metrics (docs/training.md): console rows, one JSON object per line in metrics_file, a live
// progress line on a terminal, and at the end a PNG picture of the train and valid loss curves
// written next to the metrics file as `<stem>.png`.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "report/loss_plot.h"

namespace longtron::train {

/// A training row (docs/training.md). grad_norm is before clipping; tokens are the non-pad tokens
/// of the step over all ranks; tgs = tokens / world size / step_time_s; mfu as docs/training.md
/// defines it.
struct TrainRow {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;
  double tgs = 0;
  double mfu = 0;
  double step_time_s = 0;
  bool skipped = false;  ///< the update was skipped (non-finite loss or gradient norm); not written
  bool update_nonfinite = false;  ///< skipped because the update would make weights non-finite
  std::string dtype = "float32";  ///< precision of the step's GEMMs ("float32" or "bfloat16")
  /// Modelled cost of the slowest dp rank ÷ the mean (data.balance; 1.0 = perfect balance).
  double imbalance = 1.0;
  /// 2D-Attention only (0 = not context parallel, not written): Σ over the step's rows of the
  /// slowest context rank's attention work ÷ Σ of the mean (parallel.sequence_2D.balance).
  double cp_imbalance = 0;
  /// Bytes rank 0 sent in the step's collectives, in MB (1e6 bytes), counted as a ring algorithm
  /// sends them (comm::CommStats::sent); 0 = one process (not written).
  double sent_mb = 0;
  /// Preference training (docs/preference.md; written only when `preference`): means over the
  /// step's pairs of the rewards, their accuracy and margin, and the sequences' log-probs.
  bool preference = false;
  double rewards_chosen = 0, rewards_rejected = 0, reward_accuracy = 0, reward_margin = 0;
  double logps_chosen = 0, logps_rejected = 0;
};

/// A validation row: token-weighted loss over the valid set.
struct ValidRow {
  int64_t step = 0;
  double valid_loss = 0;
  /// Preference training (written only when `preference`): the held-out pairs' reward accuracy
  /// and margin (valid_loss is then their mean pair loss).
  bool preference = false;
  double valid_reward_accuracy = 0, valid_reward_margin = 0;
};

struct MetricsOptions {
  int64_t total_steps = 0;    ///< for the progress line and always logging the last step
  int64_t log_every = 1;      ///< rows written (console and file) when step % log_every == 0 or last
  bool console = true;        ///< print rows on stdout
  bool progress = true;       ///< live line on stderr when stderr is a terminal
  int64_t resume_step = -1;   ///< ≥ 0: keep the file's rows with step ≤ resume_step, drop the rest
                              ///< (a resumed run continues the same file); < 0: start a new file
};

/// Writes the rows. Only rank 0 should construct one. Throws Error naming the file when it cannot
/// be created/read.
class MetricsWriter {
 public:
  /// `metrics_file` empty: console only and no picture.
  MetricsWriter(const std::filesystem::path& metrics_file, const MetricsOptions& options);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  /// Call once per step: updates the progress line; writes the row when due (log_every). Every
  /// row write is checked: a failed one throws Error naming the file, step and errno text.
  void train(const TrainRow& row);
  /// Always written.
  void valid(const ValidRow& row);
  /// Ends the progress line and writes the loss picture (if there is a metrics file). Idempotent.
  void finish();
  /// `<dir>/<stem>.png` of the metrics file (empty path when console only).
  std::filesystem::path plot_path() const;

  const std::vector<TrainRow>& train_rows() const { return train_rows_; }
  const std::vector<ValidRow>& valid_rows() const { return valid_rows_; }

 private:
  /// Writes a row; throws Error naming the file, `step` and the cause when the write fails.
  void emit(int64_t step, const std::string& console_line, const std::string& json_line);
  void clear_progress();

  std::filesystem::path path_;
  MetricsOptions options_;
  std::FILE* file_ = nullptr;
  bool tty_ = false;
  bool progress_shown_ = false;
  bool finished_ = false;
  bool failed_ = false;  ///< a row write failed (no picture is written then)
  std::vector<TrainRow> train_rows_;  ///< every step given (the picture uses all of them)
  std::vector<ValidRow> valid_rows_;
  std::chrono::steady_clock::time_point start_;
};

/// JSON line of a row (keys exactly as docs/training.md lists them; NaN/inf become null).
std::string to_json_line(const TrainRow& row);
std::string to_json_line(const ValidRow& row);

/// Reads a metrics file back (rows with "loss" are training rows, with "valid_loss" validation).
/// Throws Error naming file and line on a malformed line.
void read_metrics(const std::filesystem::path& path, std::vector<TrainRow>& train,
                  std::vector<ValidRow>& valid);

/// Curve colours of the loss picture (report/loss_plot.h; tests look for them).
using report::kTrainLossColor;
using report::kValidLossColor;

/// The loss picture of these rows (report::write_loss_plot: train loss per step, valid loss at its
/// steps, non-finite values skipped). Atomic. Throws Error naming the file when it cannot be
/// written.
void write_loss_plot(const std::filesystem::path& path, const std::vector<TrainRow>& train,
                     const std::vector<ValidRow>& valid, const std::string& title = "loss");

}  // namespace longtron::train
