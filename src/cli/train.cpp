// `longtron train`: the main job (SPEC §4, §5). Single process by default; under mpirun the ranks
// form the process grid of the config's parallel.* layout (SPEC §3).
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/registry.h"
#include "comm/communicator.h"
#include "train/config.h"
#include "train/trainer.h"

namespace longtron::cli {
namespace {

struct TrainCliOptions {
  std::string config = "configs/demo.toml";
  std::vector<std::string> overrides;
  std::string resume, init_from, dump_grads;
};

int run_train(const TrainCliOptions& o) {
  int argc = 0;
  char** argv = nullptr;
  comm::CommPtr world = comm::init(argc, argv);
  const int status = comm::abort_on_error([&] {
    train::TrainOptions options;
    options.resume = o.resume;
    options.init_from = o.init_from;
    options.dump_grads = o.dump_grads;
    train::ConfigNeeds needs;
    needs.model_shape = o.resume.empty() && o.init_from.empty();
    train::TrainConfig config = train::load_config(o.config, o.overrides, needs);
    train::resolve_model_config(config, options);
    const train::TrainSummary s = train::run_training(config, options, world);
    if (world->rank() == 0) {
      std::string valid;
      if (!s.valid.empty())
        valid = fmt::format("; valid_loss {:.4f} (step {}) -> {:.4f} (step {})", s.valid.front().second,
                            s.valid.front().first, s.valid.back().second, s.valid.back().first);
      fmt::print("train: steps {}..{} in {:.1f} s{}{}\n", s.start_step + 1, s.end_step, s.seconds,
                 valid, s.last_checkpoint.empty() ? "" : "; checkpoint " + s.last_checkpoint.string());
    }
    return 0;
  });
  world.reset();
  comm::finalize();
  return status;
}

Subcommand train_command(30, [](CLI::App& app) {
  auto o = std::make_shared<TrainCliOptions>();
  auto* sub = app.add_subcommand("train", "Train an InternLM2 model (SPEC 4)");
  sub->add_option("--config", o->config, "TOML config (default configs/demo.toml)");
  sub->add_option("--set", o->overrides, "Override: section.key=value (repeatable)")
      ->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--resume", o->resume, "Continue from a checkpoint root (latest) or step folder");
  sub->add_option("--init-from", o->init_from, "Start from a Hugging Face folder");
  sub->add_option("--dump-grads", o->dump_grads,
                  "Write the first step's gradients (before clipping) as safetensors to DIR");
  return [o] { return run_train(*o); };
});

}  // namespace
}  // namespace longtron::cli
