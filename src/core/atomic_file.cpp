#include "core/atomic_file.h"

#include <unistd.h>

#include <string>

namespace longtron {

void write_atomically(const std::filesystem::path& target,
                      const std::function<void(const std::filesystem::path& tmp)>& write) {
  namespace fs = std::filesystem;
  fs::path tmp = target;
  tmp += ".tmp." + std::to_string(getpid());
  fs::remove_all(tmp);
  try {
    write(tmp);
    if (fs::is_directory(target) && fs::is_directory(tmp)) fs::remove_all(target);
    fs::rename(tmp, target);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace longtron
