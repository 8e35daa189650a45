// `longtron config`: the training-config keys from their one table (train/config_keys.h):
// `--defaults` prints the full default TOML with a comment per key, `--markdown` the page
// docs/configuration.md; `--families-markdown` the page docs/families.md from the family table
// (model/families.h).
#include <fmt/core.h>

#include <memory>

#include "cli/registry.h"
#include "core/error.h"
#include "model/families.h"
#include "train/config_keys.h"

namespace longtron::cli {
namespace {

struct ConfigCliOptions {
  bool defaults = false;
  bool markdown = false;
  bool families = false;
};

Subcommand config_command(help_order::kConfig, [](CLI::App& app) {
  auto o = std::make_shared<ConfigCliOptions>();
  auto* sub = app.add_subcommand("config", "Print every config key: the default TOML or the docs page");
  auto* d = sub->add_flag("--defaults", o->defaults,
                          "The full default config as TOML, a comment per key (required keys commented out)");
  auto* m = sub->add_flag("--markdown", o->markdown,
                          "docs/configuration.md: every key, its type, default and meaning")
                ->excludes(d);
  sub->add_flag("--families-markdown", o->families,
                "docs/families.md: every model family, its config.json keys, tensor names and LoRA targets")
      ->excludes(d)
      ->excludes(m);
  return [o] {
    check(o->defaults || o->markdown || o->families,
          "config: give --defaults (TOML), --markdown or --families-markdown (the docs pages)");
    if (o->families) {
      fmt::print("{}", model::families_markdown());
      return 0;
    }
    fmt::print("{}", o->markdown ? train::config_markdown() : train::default_config_toml());
    return 0;
  };
});

}  // namespace
}  // namespace longtron::cli
