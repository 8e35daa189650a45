// `longtron inspect`: the micro-batches a data config produces (docs/data.md), laid out as
// InternEvo's data pipeline prints them, or one JSON object with --json. Any dataset format
// open_dataset reads.
#include <fmt/core.h>

#include <memory>

#include "cli/registry.h"
#include "core/error.h"
#include "data/open.h"
#include "model/decoder.h"
#include "packing/inspect.h"
#include "packing/sequence_split.h"
#include "train/config.h"
#include "train/data_progress.h"

namespace longtron::cli {
namespace {

struct InspectArgs {
  std::string data;
  int64_t seq_len = 0, micro_bsz = 0, micro_num = 1, steps = 1;
  bool unpacked = false, into_one = false, shuffle = false, json = false, no_split = false;
  std::string pack_tail = "pad";
  int64_t seed = 1024, sp_size = 1, sp_rank = 0, dp_size = 0, cp_size = 1;
  std::string cp_balance = "zigzag";
  std::string balance = "none", config;
  int64_t balance_window = 8;
  std::vector<double> balance_cost;
};

// The balance cost of inspect: --balance-cost, else data.balance_cost or the model's FLOPs of
// --config, else attention work alone (per token 0, per causal pair 1).
data::RowCost inspect_cost(const InspectArgs& a) {
  data::RowCost cost;
  std::vector<double> given = a.balance_cost;
  if (given.empty() && !a.config.empty()) {
    train::ConfigNeeds needs;
    needs.data = false;
    needs.total_steps = false;
    const train::TrainConfig c = train::load_config(a.config, {}, needs);
    given = c.data.balance_cost;
    cost = model::balance_cost(c.model);  // its window stays under a given data.balance_cost
  }
  if (!given.empty()) {
    longtron::check(given.size() == 2, "--balance-cost: expected two numbers A,B, got {}", given.size());
    cost.per_token = given[0];
    cost.per_pair = given[1];
  }
  cost.validate("--balance-cost");
  return cost;
}

Subcommand inspect_command(help_order::kInspect, [](CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* sub = app.add_subcommand("inspect", "Print the micro-batches a data config produces");
  sub->add_option("--data", args->data, "Dataset: folder, .idx/.bin (Megatron) or .bin (InternEvo)")
      ->required();
  sub->add_option("--seq-len", args->seq_len, "SEQ_LEN (data.seq_len)")->required();
  sub->add_option("--micro-bsz", args->micro_bsz, "data.micro_bsz")->required();
  sub->add_option("--micro-num", args->micro_num, "data.micro_num (rows per step)")->required();
  sub->add_option("--steps", args->steps, "Steps to print")->capture_default_str();
  sub->add_flag("--unpacked", args->unpacked, "use_packed_dataset = false (build_unpack)");
  sub->add_flag("--pack-sample-into-one", args->into_one, "pack_sample_into_one = true");
  sub->add_option("--pack-tail", args->pack_tail, "pad | drop")->capture_default_str();
  sub->add_flag("--no-split-documents", args->no_split,
                "data.split_documents = false: a document that does not fit starts the next row");
  sub->add_flag("--shuffle", args->shuffle, "Shuffle documents and rows (off by default)");
  sub->add_option("--seed", args->seed, "Shuffle seed (data.seed)")->capture_default_str();
  sub->add_option("--sp-size", args->sp_size, "Sequence parallel size T")->capture_default_str();
  sub->add_option("--sp-rank", args->sp_rank, "Sequence parallel rank shown")->capture_default_str();
  sub->add_option("--cp-size", args->cp_size,
                  "Context-parallel size C: add each row's token assignment (\"cp_ranks\")")
      ->capture_default_str();
  auto* cp_balance_option = sub->add_option("--cp-balance", args->cp_balance,
                  "parallel.sequence_2D.balance: contiguous | zigzag | document")
      ->capture_default_str();
  auto* dp_option = sub->add_option("--dp-size", args->dp_size,
                  "Show every rank of a data-parallel run of this size, with its modelled cost");
  auto* balance_option = sub->add_option("--balance", args->balance, "data.balance: none | rows | documents")
      ->capture_default_str();
  sub->add_option("--balance-window", args->balance_window,
                  "data.balance_window (steps' worth of rows per \"documents\" window)")
      ->capture_default_str();
  sub->add_option("--balance-cost", args->balance_cost,
                  "A,B: row cost = A x tokens + B x causal pairs (default: --config's model FLOPs, "
                  "else 0,1 = attention work alone)")
      ->delimiter(',')
      ->expected(2);
  sub->add_option("--config", args->config,
                  "A train config whose model.* (or data.balance_cost) gives the balance cost");
  sub->add_flag("--json", args->json, "Print one JSON object");
  return [args, dp_option, cp_balance_option, balance_option] {
    data::InspectOptions o;
    o.data.pack.seq_len = args->seq_len;
    o.data.pack.micro_bsz = args->micro_bsz;
    o.data.pack.use_packed_dataset = !args->unpacked;
    o.data.pack.pack_sample_into_one = args->into_one;
    o.data.pack.pack_tail = data::parse_pack_tail(args->pack_tail);
    o.data.pack.split_documents = !args->no_split;
    o.data.micro_num = args->micro_num;
    o.data.shuffle = args->shuffle;
    longtron::check(args->seed >= 0 && args->seed <= 0xffffffffLL, "--seed must be in [0, 2^32), got {}",
          args->seed);
    o.data.seed = static_cast<uint32_t>(args->seed);
    o.steps = args->steps;
    o.sp_size = args->sp_size;
    o.sp_rank = args->sp_rank;
    // 0 is "not given" inside (one rank's layout), but --dp-size 0 is a mistake.
    longtron::check(dp_option->count() == 0 || args->dp_size > 0, "--dp-size must be > 0, got {}",
                    args->dp_size);
    o.dp_size = args->dp_size;
    longtron::check(args->cp_size >= 1, "--cp-size must be >= 1, got {}", args->cp_size);
    // Options that only shape a layout that was not asked for would change nothing, silently.
    longtron::check(cp_balance_option->count() == 0 || args->cp_size > 1,
                    "--cp-balance needs --cp-size C > 1 (the context-parallel size to balance over)");
    longtron::check(balance_option->count() == 0 || args->dp_size > 0,
                    "--balance needs --dp-size D (the data-parallel size to balance over)");
    // A rank holds at least one position of the (padded) row; more ranks than positions would
    // only allocate rows of padding (and a huge C runs out of memory).
    // A row too long for 64 bits is refused below (PackConfig::validate), not multiplied here.
    int64_t row = 0;
    const bool row_fits = !__builtin_mul_overflow(args->seq_len, args->micro_bsz, &row);
    longtron::check(args->seq_len <= 0 || args->micro_bsz <= 0 || !row_fits || args->cp_size <= row,
                    "--cp-size {} exceeds the row's {} tokens (seq_len x micro_bsz)", args->cp_size,
                    row);
    o.cp_size = args->cp_size;
    o.cp_balance = data::parse_context_balance(args->cp_balance, "--cp-balance");
    o.data.balance.mode = data::parse_balance_mode(args->balance, "--balance");
    o.data.balance.window = args->balance_window;
    longtron::check(args->balance_window >= 1, "--balance-window must be >= 1, got {}",
                    args->balance_window);
    o.data.balance.cost = inspect_cost(*args);
    // The context ranks' work counts the window when it applies to every layer (Mistral).
    if (o.data.balance.cost.windowed == 1.0) o.cp_window = o.data.balance.cost.window;
    o.data.pack.validate();  // bad sizes fail before the dataset is read
    data::check_sequence_parallel(o.sp_size, o.sp_rank);
    train::DataProgress progress("--data " + args->data, true);
    const auto batches = data::inspect_json(data::open_dataset(args->data), o, &progress);
    if (args->json)
      fmt::print("{}\n", batches.dump());
    else
      fmt::print("{}", data::inspect_text(batches, o));
    return 0;
  };
});

}  // namespace
}  // namespace longtron::cli
