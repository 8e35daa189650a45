// The shared option groups (options.h). This file registers no subcommand.
#include "cli/options.h"

namespace longtron::cli {

CLI::Option* add_checkpoint_option(CLI::App& sub, std::string& checkpoint, const std::string& help) {
  return sub.add_option("--checkpoint", checkpoint, help)->required();
}

void add_compute_options(CLI::App& sub, ComputeOptions& o) {
  sub.add_option("--threads", o.threads, "Compute threads (default: all cores)");
  sub.add_option("--dtype", o.dtype,
                 "GEMM precision: float32, bfloat16 or auto (default: the run's model.dtype; "
                 "float32 for a Hugging Face folder)");
}

}  // namespace longtron::cli
