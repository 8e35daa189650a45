// Option groups that several subcommands share, declared once so that their names, help texts and
// checks stay the same everywhere (`longtron eval --help` and `generate --help` list them alike).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

namespace longtron::cli {

/// --checkpoint (required): the model a command reads. `help` describes what it may name.
CLI::Option* add_checkpoint_option(CLI::App& sub, std::string& checkpoint,
                                   const std::string& help = "Checkpoint root, step folder or HF folder");

/// How a command that loads a model computes with it (eval, generate).
struct ComputeOptions {
  int threads = 0;    ///< --threads; 0: all cores
  std::string dtype;  ///< --dtype; empty: the run's model.dtype (float32 for a Hugging Face folder)
};

/// Adds --threads and --dtype (in that order) bound to `o`.
void add_compute_options(CLI::App& sub, ComputeOptions& o);

}  // namespace longtron::cli
