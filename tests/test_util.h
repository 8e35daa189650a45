// Helpers shared by the tests: temporary folders and running the longtron binary.
#pragma once
#include <filesystem>
#include <string>

namespace longtron::testing {

/// A fresh temporary folder, removed when the object goes out of scope.
class TempDir {
 public:
  TempDir();
  /// A fresh folder under `base` (e.g. a memory-backed /dev/shm for tests that write many files).
  explicit TempDir(const std::filesystem::path& base);
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Result of running a command: exit status and combined stdout+stderr.
struct CommandResult {
  int status;
  std::string output;
};

/// Runs `longtron <args>` (the binary built with the tests) through the shell.
CommandResult run_longtron(const std::string& args);

/// Runs a shell command, capturing stdout and stderr.
CommandResult run_command(const std::string& command);

/// Writes `content` to `path`.
void write_file(const std::filesystem::path& path, const std::string& content);

/// Reads a whole file.
std::string read_file(const std::filesystem::path& path);

}  // namespace longtron::testing
