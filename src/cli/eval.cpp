// `longtron eval`: loss of a checkpoint on a dataset (README, "Commands"), documents packed as in
// training.
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/options.h"
#include "cli/registry.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/phase.h"
#include "core/plural.h"
#include "data/open.h"
#include "data/preference_pairs.h"
#include "data/validate.h"
#include "modes/engine.h"
#include "ops/threads.h"
#include "packing/context_split.h"
#include "parallel/layout.h"
#include "train/config.h"
#include "train/data_progress.h"
#include "train/evaluate.h"
#include "train/memory_plan.h"
#include "train/model_io.h"

namespace longtron::cli {
namespace {

struct EvalOptions {
  std::string checkpoint, data;
  bool json = false;
  int64_t seq_len = 0, micro_bsz = 0;
  ComputeOptions compute;
  int tensor_size = 1;          // parallel.tensor.size of the evaluation's layout
  std::string tensor_mode = "mtp";  // parallel.tensor.mode
  int context_size = 1;             // parallel.sequence_2D.context_size (> 1: 2D-Attention)
  std::string context_balance = "zigzag";  // parallel.sequence_2D.balance
};

int eval_on(const EvalOptions& o, const comm::CommPtr& world) {
  set_num_threads(o.compute.threads, world->size() > 1 ? comm::ranks_on_node() : 1);
  train::LoadedModel m = train::load_model_dir(o.checkpoint, /*read_weights=*/false);
  const ops::ComputeType compute = train::loaded_compute_type(m, o.compute.dtype);
  // The run's data.* keys from its saved config, through the config's own key table (a Hugging
  // Face folder has none: the defaults).
  const train::TrainConfig run = train::saved_train_config(m.train_config);
  data::PackConfig pack;
  pack.seq_len = o.seq_len > 0 ? o.seq_len : run.data.seq_len;
  pack.micro_bsz = o.micro_bsz > 0 ? o.micro_bsz : run.data.micro_bsz;
  check(pack.seq_len > 0 && pack.micro_bsz > 0,
        "eval: {} holds no data.seq_len/micro_bsz (an HF folder?): pass --seq-len and --micro-bsz",
        o.checkpoint);
  pack.use_packed_dataset = run.data.use_packed_dataset;
  pack.pack_sample_into_one = run.data.pack_sample_into_one;
  pack.split_documents = run.data.split_documents;
  // The memory plan of the forward pass, before the rows are packed or the workspace allocated.
  const train::MemoryPlan plan =
      train::plan_forward_memory(m.layout->config(), pack.seq_len, pack.micro_bsz, o.data,
                                 train::resident_bytes(), "--seq-len, --micro-bsz");
  train::check_memory(plan, train::available_memory_bytes(1));
  Phase phase(fmt::format("evaluating {} (planned peak {})", o.data, train::format_bytes(plan.peak_bytes)));
  const data::Dataset dataset = data::open_dataset(o.data);
  // Its loss would score each chosen and rejected sequence as a document, prompts included: a
  // number that reads valid and is no preference metric.
  for (const auto& file : dataset)
    check(dynamic_cast<const data::PairSource*>(file.get()) == nullptr,
          "eval: {} holds preference pairs; eval scores documents (a preference run's validation "
          "reports reward accuracy and margin on held-out pairs: data.valid_folder)",
          file->path().string());
  // eval reads every token anyway: check ids first so the error names the file and document.
  {
    train::DataProgress progress("--data " + o.data, world->rank() == 0);
    data::validate_dataset(dataset, m.layout->config().vocab_size, &progress);
  }
  // The evaluation's layout as the parallel.* keys would give it: dp × tensor over the world (one
  // rank: the dense mode).
  train::ParallelConfig par;
  par.tensor.size = o.tensor_size;
  par.tensor.mode = parallel::parse_tensor_mode(o.tensor_mode, "--tensor-mode");
  par.zero1.size = 1;  // no optimizer
  if (o.context_size > 1) {  // 2D-Attention: head parallel × context parallel inside TENSOR
    check(par.tensor.mode == parallel::TensorMode::kIsp && o.tensor_size % o.context_size == 0,
          "eval: --context-size {} needs --tensor-mode isp and a --tensor-size it divides (got {} {})",
          o.context_size, o.tensor_mode, o.tensor_size);
    par.sequence_2d.enable = true;
    par.sequence_2d.head_size = o.tensor_size / o.context_size;
    par.sequence_2d.context_size = o.context_size;
    par.sequence_2d.balance = data::parse_context_balance(o.context_balance, "--context-balance");
  }
  const parallel::Layout layout = train::layout_of(par);
  const auto engine =
      train::load_into_engine(m, parallel::make_grid(world, layout), pack.packed_length());
  engine->set_compute_type(compute);
  // No bf16 weight copy: each GEMM rounds its weight (the forward pass's memory plan).
  engine->compute().weights().attach(nullptr, 0);
  const train::EvalResult r = train::evaluate_documents(*engine, dataset, pack);
  // A loss of 0 would read as a perfect model: with no label there is no loss to report.
  check(r.count > 0, "{}: no token has a label ({}, every target masked: negative ids "
        "or labels -100, or one-token documents): there is no loss to evaluate", o.data,
        count_of(int64_t(r.documents.size()), "document"));
  // A NaN or infinite loss is no measurement: the weights hold non-finite or overflowing values.
  if (!std::isfinite(r.loss())) {
    int64_t bad = 0;
    for (const auto& d : r.documents) bad += d.tokens > 0 && !std::isfinite(d.loss());
    fail("eval: the loss of {} on {} is {} ({} of {} with a non-finite loss): its weights hold "
         "non-finite values or values too large for the forward pass", m.dir.string(), o.data,
         r.loss(), bad, count_of(int64_t(r.documents.size()), "document"));
  }
  if (world->rank() != 0) return 0;  // every rank holds the same result
  if (o.json) {
    nlohmann::json docs = nlohmann::json::array();
    for (const auto& d : r.documents)
      docs.push_back({{"index", d.index}, {"length", d.length}, {"tokens", d.tokens},
                      {"loss_sum", d.loss_sum},
                      {"loss", d.tokens > 0 ? nlohmann::json(d.loss()) : nlohmann::json(nullptr)}});
    fmt::print("{}\n", nlohmann::json{{"documents", docs}, {"loss", r.loss()}}.dump());
  } else {
    fmt::print("eval: {}, {} scored, loss {:.6f} (checkpoint {}{})\n",
               count_of(int64_t(r.documents.size()), "document"), count_of(r.count, "token"),
               r.loss(), m.dir.string(),
               world->size() > 1 ? fmt::format("; {} ranks, {}", world->size(), engine->mode()) : "");
  }
  return 0;
}

int run_eval(const EvalOptions& o) {
  return comm::run_on_world([&](const comm::CommPtr& world) { return eval_on(o, world); });
}

Subcommand eval_command(help_order::kEval, [](CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  auto* sub = app.add_subcommand("eval", "Loss of a checkpoint on a dataset");
  add_checkpoint_option(*sub, o->checkpoint);
  sub->add_option("--data", o->data, "Tokenized dataset (folder or file)")->required();
  sub->add_flag("--json", o->json,
                "Print {documents: [{index, length, tokens, loss_sum, loss}], loss}: each document's "
                "stored length, tokens scored, their loss sum and mean, and the token-weighted loss");
  sub->add_option("--seq-len", o->seq_len, "Override the checkpoint's data.seq_len")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--micro-bsz", o->micro_bsz, "Override the checkpoint's data.micro_bsz")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add_compute_options(*sub, o->compute);
  sub->add_option("--tensor-size", o->tensor_size,
                  "Tensor-parallel size T of the evaluation's layout (as parallel.tensor.size; run "
                  "under mpirun, the remaining factor of the ranks is data parallel)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--tensor-mode", o->tensor_mode,
                  "Tensor-parallel mode (as parallel.tensor.mode): mtp, msp, fsp or isp");
  sub->add_option("--context-size", o->context_size,
                  "2D-Attention's context-parallel size (as parallel.sequence_2D.context_size; "
                  "needs --tensor-mode isp, the head-parallel size is --tensor-size / this)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--context-balance", o->context_balance,
                  "Token assignment to context ranks (as parallel.sequence_2D.balance): "
                  "contiguous, zigzag or document");
  return [o] { return run_eval(*o); };
});

}  // namespace
}  // namespace longtron::cli
