// Crash-safe outputs: write under a temporary name beside the target, rename at the end, so a
// failure never leaves a partial file or folder behind.
#pragma once
#include <filesystem>
#include <functional>

namespace longtron {

/// Calls write(tmp) with a temporary path next to `target`, then renames tmp to target (replacing
/// it). If write throws, tmp is removed and the exception propagates. Works for files and folders.
void write_atomically(const std::filesystem::path& target,
                      const std::function<void(const std::filesystem::path& tmp)>& write);

}  // namespace longtron
