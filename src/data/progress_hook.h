// How a long pass over a dataset (checking every token id, building the row index) tells its
// caller how far it got. The data layer only counts; the caller decides whether and how to show it
// (train/data_progress.h prints progress lines on rank 0 for large datasets).
#pragma once
#include <cstdint>
#include <string>

namespace longtron::data {

/// Receives the progress of one pass at a time: begin, any number of updates, end. A pass that
/// throws ends without end(). Implementations must be cheap to update (called every few thousand
/// documents at most).
class ProgressHook {
 public:
  virtual ~ProgressHook() = default;
  /// A pass over `total` units of `unit` ("tokens", "documents") begins; `what` names the work
  /// ("checking token ids"; the caller adds which dataset).
  virtual void begin(const std::string& what, int64_t total, const std::string& unit) = 0;
  /// `done` of the pass's total units are finished (non-decreasing).
  virtual void update(int64_t done) = 0;
  /// The pass finished.
  virtual void end() = 0;
};

/// The data passes call ProgressHook::update about every this many tokens or documents.
inline constexpr int64_t kProgressStepTokens = int64_t{1} << 20;
inline constexpr int64_t kProgressStepDocuments = int64_t{1} << 14;

}  // namespace longtron::data
