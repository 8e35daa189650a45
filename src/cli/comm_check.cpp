// `longtron comm-check` (hidden): a smoke test of the communicator under mpirun — an all-reduce, an
// all-gather and a split checked against their direct results — and the failure path: with
// --throw-rank R that rank throws while the others wait in a collective, and the job must end
// within seconds with that rank's error (comm::run_on_world); --exit-rank R makes a rank exit
// without finalising MPI instead. Used by tests/cli/comm_abort_test.cpp.
#include <fmt/core.h>

#include <cstdlib>
#include <vector>

#include "cli/registry.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace longtron::cli {
namespace {

struct CommCheckOptions {
  int throw_rank = -1;
  int exit_rank = -1;
};

int run_comm_check(comm::Communicator& world, const CommCheckOptions& opt) {
  const int rank = world.rank(), size = world.size();
  if (rank == opt.throw_rank) fail("comm-check: rank {} throws as asked by --throw-rank", rank);
  if (rank == opt.exit_rank) std::_Exit(3);
  int64_t sum = rank + 1;
  world.all_reduce(&sum, 1);  // the other ranks wait here when one fails
  check(sum == int64_t(size) * (size + 1) / 2, "comm-check: all_reduce gave {}", sum);
  std::vector<int32_t> ranks(static_cast<size_t>(size));
  int32_t me = rank;
  world.all_gather(ranks.data(), &me, 1);
  for (int r = 0; r < size; ++r)
    check(ranks[size_t(r)] == r, "comm-check: all_gather slot {} holds {}", r, ranks[size_t(r)]);
  comm::CommPtr half = world.split(rank % 2, rank);
  int64_t count = 1;
  half->all_reduce(&count, 1);
  check(count == half->size(), "comm-check: split group all_reduce gave {}", count);
  world.barrier();
  if (rank == 0)
    fmt::print("comm-check: {} rank(s) ok, {} payload bytes sent by rank 0\n", size,
               world.stats().total_bytes() + half->stats().total_bytes());
  return 0;
}

Subcommand comm_check_command(help_order::kHidden, [](CLI::App& app) {
  auto opt = std::make_shared<CommCheckOptions>();
  CLI::App* sub = app.add_subcommand("comm-check", "Check the communicator (run under mpirun)");
  sub->group("");  // hidden: a diagnostic, not part of the user-facing interface
  sub->add_option("--throw-rank", opt->throw_rank, "Rank that throws an Error");
  sub->add_option("--exit-rank", opt->exit_rank, "Rank that exits without finalising MPI");
  return [opt] {
    return comm::run_on_world([&](const comm::CommPtr& world) { return run_comm_check(*world, *opt); });
  };
});

}  // namespace
}  // namespace longtron::cli
