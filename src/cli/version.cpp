// `longtron version`: prints the version and the libraries it was built with.
#include <fmt/core.h>

#include "cli/registry.h"

namespace longtron::cli {
namespace {
Subcommand version_command(help_order::kVersion, [](CLI::App& app) {
  app.add_subcommand("version", "Print the version of longtron");
  return [] {
    fmt::print("longtron {}\n", kVersion);
    return 0;
  };
});
}  // namespace
}  // namespace longtron::cli
