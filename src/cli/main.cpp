// longtron: entry point. Parses the command line, runs the chosen subcommand, and turns every
// longtron::Error into one clear line on stderr and exit status 1.
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <new>

#include "cli/registry.h"
#include "core/error.h"
#include "core/phase.h"
#include "ops/threads.h"

namespace longtron::cli {

std::vector<std::pair<int, Registrar>>& registered_subcommands() {
  static std::vector<std::pair<int, Registrar>> all;
  return all;
}

Subcommand::Subcommand(int order, Registrar registrar) {
  registered_subcommands().emplace_back(order, std::move(registrar));
}

}  // namespace longtron::cli

int main(int argc, char** argv) {
  using namespace longtron::cli;
  longtron::ensure_passive_omp_wait(argv);
  CLI::App app{"longtron: train LLMs on packed long-context data with hybrid parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("longtron ") + kVersion, "Print the version and exit");
  auto subs = registered_subcommands();
  std::stable_sort(subs.begin(), subs.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (auto& [order, registrar] : subs) {
    size_t before = app.get_subcommands({}).size();
    auto action = registrar(app);
    actions.emplace_back(app.get_subcommands({}).at(before), std::move(action));
  }
  // CLI11 reports a mistyped command as "A subcommand is required"; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& action : actions) {
      known = known || action.first->get_name() == argv[1];
      if (!action.first->get_group().empty())  // hidden commands (group "") are not advertised
        names += (names.empty() ? "" : ", ") + action.first->get_name();
    }
    if (!known) {
      fmt::print(stderr, "longtron: error: unknown command '{}' (expected one of: {})\n", argv[1], names);
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const longtron::Error& e) {
    fmt::print(stderr, "longtron: error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "longtron: error: {}\n", longtron::out_of_memory_message());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "longtron: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
