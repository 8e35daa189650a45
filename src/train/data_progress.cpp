#include "train/data_progress.h"

namespace longtron::train {

DataProgress::DataProgress(std::string label, bool enabled, int64_t min_tokens,
                           int64_t min_documents)
    : label_(std::move(label)), enabled_(enabled), min_tokens_(min_tokens),
      min_documents_(min_documents) {}

void DataProgress::begin(const std::string& what, int64_t total, const std::string& unit) {
  const int64_t min = unit == "tokens" ? min_tokens_ : unit == "documents" ? min_documents_ : 0;
  // A pass that threw before end() leaves its Progress: replaced without an end line.
  progress_ = std::make_unique<Progress>(label_ + ": " + what, total, unit,
                                         enabled_ && total >= min);
}

void DataProgress::update(int64_t done) {
  if (progress_) progress_->update(done);
}

void DataProgress::end() {
  if (progress_) progress_->finish();
  progress_.reset();
}

}  // namespace longtron::train
