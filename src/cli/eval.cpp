// `longtron eval`: loss of a checkpoint on a dataset (README, "Commands"), documents packed as in
// training.
#include <fmt/core.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/registry.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/phase.h"
#include "core/plural.h"
#include "data/open.h"
#include "data/validate.h"
#include "modes/engine.h"
#include "ops/threads.h"
#include "parallel/layout.h"
#include "train/evaluate.h"
#include "train/memory_plan.h"
#include "train/model_io.h"

namespace longtron::cli {
namespace {

struct EvalOptions {
  std::string checkpoint, data;
  bool json = false;
  int64_t seq_len = 0, micro_bsz = 0;
  int threads = 0;
  std::string dtype;  // empty: the run's model.dtype
  int tensor_size = 1;          // parallel.tensor.size of the evaluation's layout
  std::string tensor_mode = "mtp";  // parallel.tensor.mode
  int context_size = 1;             // parallel.sequence_2D.context_size (> 1: 2D-Attention)
  std::string context_balance = "zigzag";  // parallel.sequence_2D.balance
};

int64_t config_int(const nlohmann::json& config, const char* key) {
  if (config.contains("data") && config["data"].contains(key) && config["data"][key].is_number_integer())
    return config["data"][key].get<int64_t>();
  return 0;
}

// data.KEY of the run's saved config when it is a boolean, else `fallback` (a hand-edited or
// foreign state file must not abort with a JSON type error).
bool config_bool(const nlohmann::json& config, const char* key, bool fallback) {
  if (config.contains("data") && config["data"].contains(key) && config["data"][key].is_boolean())
    return config["data"][key].get<bool>();
  return fallback;
}

int eval_on(const EvalOptions& o, const comm::CommPtr& world) {
  set_num_threads(o.threads, world->size() > 1 ? comm::ranks_on_node() : 1);
  train::LoadedModel m = train::load_model_dir(o.checkpoint, /*read_weights=*/false);
  const ops::ComputeTypeScope precision(train::loaded_compute_type(m, o.dtype));
  data::PackConfig pack;
  pack.seq_len = o.seq_len > 0 ? o.seq_len : config_int(m.train_config, "seq_len");
  pack.micro_bsz = o.micro_bsz > 0 ? o.micro_bsz : config_int(m.train_config, "micro_bsz");
  check(pack.seq_len > 0 && pack.micro_bsz > 0,
        "eval: {} holds no data.seq_len/micro_bsz (an HF folder?): pass --seq-len and --micro-bsz",
        o.checkpoint);
  pack.use_packed_dataset = config_bool(m.train_config, "use_packed_dataset", pack.use_packed_dataset);
  pack.pack_sample_into_one =
      config_bool(m.train_config, "pack_sample_into_one", pack.pack_sample_into_one);
  pack.split_documents = config_bool(m.train_config, "split_documents", pack.split_documents);
  // The memory plan of the forward pass, before the rows are packed or the workspace allocated.
  const train::MemoryPlan plan =
      train::plan_forward_memory(m.layout->config(), pack.seq_len, pack.micro_bsz, o.data,
                                 train::resident_bytes(), "--seq-len, --micro-bsz");
  train::check_memory(plan, train::available_memory_bytes(1));
  Phase phase(fmt::format("evaluating {} (planned peak {})", o.data, train::format_bytes(plan.peak_bytes)));
  const data::Dataset dataset = data::open_dataset(o.data);
  // eval reads every token anyway: check ids first so the error names the file and document.
  data::validate_dataset(dataset, m.layout->config().vocab_size);
  parallel::Layout layout;  // dp × tensor over the world; one rank: the dense mode
  layout.tensor_size = o.tensor_size;
  layout.tensor_mode = parallel::parse_tensor_mode(o.tensor_mode, "--tensor-mode");
  if (o.context_size > 1) {  // 2D-Attention: head parallel × context parallel inside TENSOR
    check(layout.tensor_mode == parallel::TensorMode::kIsp && o.tensor_size % o.context_size == 0,
          "eval: --context-size {} needs --tensor-mode isp and a --tensor-size it divides (got {} {})",
          o.context_size, o.tensor_mode, o.tensor_size);
    layout.seq2d = true;
    layout.seq2d_head = o.tensor_size / o.context_size;
    layout.seq2d_context = o.context_size;
    layout.seq2d_balance = o.context_balance;
  }
  const auto engine =
      train::load_into_engine(m, parallel::make_grid(world, layout), pack.packed_length());
  const train::EvalResult r = train::evaluate_documents(*engine, dataset, pack);
  // A loss of 0 would read as a perfect model: with no label there is no loss to report.
  check(r.count > 0, "{}: no token has a label ({}, every target masked: negative ids "
        "or labels -100, or one-token documents): there is no loss to evaluate", o.data,
        count_of(int64_t(r.documents.size()), "document"));
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
  int argc = 0;
  char** argv = nullptr;
  comm::CommPtr world = comm::init(argc, argv);  // under mpirun: the MPI world; else one rank
  const int status = comm::abort_on_error([&] { return eval_on(o, world); });
  world.reset();
  comm::finalize();
  return status;
}

Subcommand eval_command(40, [](CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  auto* sub = app.add_subcommand("eval", "Loss of a checkpoint on a dataset");
  sub->add_option("--checkpoint", o->checkpoint, "Checkpoint root, step folder or HF folder")->required();
  sub->add_option("--data", o->data, "Tokenized dataset (folder or file)")->required();
  sub->add_flag("--json", o->json,
                "Print {documents: [{index, length, tokens, loss_sum, loss}], loss}: each document's "
                "stored length, tokens scored, their loss sum and mean, and the token-weighted loss");
  sub->add_option("--seq-len", o->seq_len, "Override the checkpoint's data.seq_len")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--micro-bsz", o->micro_bsz, "Override the checkpoint's data.micro_bsz")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--threads", o->threads, "Compute threads (default: all cores)");
  sub->add_option("--dtype", o->dtype,
                  "GEMM precision: float32, bfloat16 or auto (default: the run's model.dtype; "
                  "float32 for a Hugging Face folder)");
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
