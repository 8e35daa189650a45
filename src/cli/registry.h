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

/// Places of the subcommands in `longtron --help` (Subcommand's `order`): the order a user meets
/// them in, from data to model; gaps leave room for new commands between two.
namespace help_order {
inline constexpr int kPrepare = 10;
inline constexpr int kCheckData = 15;
inline constexpr int kInspect = 20;
inline constexpr int kTrain = 30;
inline constexpr int kEval = 40;
inline constexpr int kGenerate = 45;
inline constexpr int kExport = 50;
inline constexpr int kConfig = 60;
inline constexpr int kVersion = 100;
inline constexpr int kHidden = 900;  ///< diagnostics outside the listing (group "")
}  // namespace help_order

/// Registers a subcommand; `order` (one of help_order) sorts the help listing.
struct Subcommand {
  Subcommand(int order, Registrar registrar);
};

/// All registered subcommands, sorted by order.
std::vector<std::pair<int, Registrar>>& registered_subcommands();

}  // namespace longtron::cli
