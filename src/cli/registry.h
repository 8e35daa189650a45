// Subcommand registry: each src/cli/<name>.cpp defines a static Subcommand that adds its options to
// the CLI11 app and returns the function to run. main.cpp knows none of them by name.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace longtron::cli {

/// The version `longtron version` and `longtron --version` print.
inline constexpr const char* kVersion = "0.1.0";

/// Adds a subcommand to `app` and returns the action run when it is chosen (exit status).
using Registrar = std::function<std::function<int()>(CLI::App& app)>;

/// Registers a subcommand; `order` sorts the help listing.
struct Subcommand {
  Subcommand(int order, Registrar registrar);
};

/// All registered subcommands, sorted by order.
std::vector<std::pair<int, Registrar>>& registered_subcommands();

}  // namespace longtron::cli
