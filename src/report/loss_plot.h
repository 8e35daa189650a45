// The loss picture: a PNG line chart of the training and validation loss against the step, drawn
// on a small raster (report/raster.h) with a 5×7 bitmap font, so that no plotting or font
// dependency is needed.
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "report/raster.h"

namespace longtron::report {

/// (step, loss) points of one curve, in step order.
using LossPoints = std::vector<std::pair<double, double>>;

/// Curve colours of the loss picture (tests look for them).
inline constexpr raster::Rgb kTrainLossColor{31, 119, 180};
inline constexpr raster::Rgb kValidLossColor{214, 39, 40};

/// Writes an 800×480 PNG line chart (white background, grid, axes with ticks and tick labels, axis
/// titles, legend, `title` on top): the train loss per step and the valid loss at its steps (with
/// markers), loss on the y axis. Points with a non-finite loss are skipped; either series may be
/// empty. Atomic. Throws Error naming the file when it cannot be written.
void write_loss_plot(const std::filesystem::path& path, const LossPoints& train,
                     const LossPoints& valid, const std::string& title = "loss");

}  // namespace longtron::report
