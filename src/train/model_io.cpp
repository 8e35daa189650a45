#include "train/model_io.h"

#include "core/error.h"
#include "model/hf_config.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/peft.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace longtron::train {

LoadedModel load_model_dir(const fs::path& path, bool read_weights) {
  LoadedModel m;
  const bool hf = fs::is_regular_file(path / "config.json") && !fs::exists(path / "state.json") &&
                  !fs::exists(path / "latest");
  check(hf || fs::exists(path / "state.json") || fs::exists(path / "latest") ||
            !fs::is_regular_file(path / kAdapterConfigFile),
        "{}: a PEFT adapter folder ({}) holds no model: give the LoRA checkpoint it came from "
        "(its state.json names the base), or a folder written by export --merge-lora",
        path.string(), kAdapterConfigFile);
  m.dir = hf ? path : resolve_checkpoint(path);
  m.train_config = hf ? nlohmann::json::object() : read_checkpoint_state(m.dir).config;
  const model::ModelConfig config = model::read_hf_config(m.dir);
  m.layout = std::make_unique<model::ParamTable>(config);
  if (!hf) m.lora_base = lora_checkpoint_base(m.dir);
  if (!m.lora_base.empty()) {  // the base's weights with the adapter merged (fp32)
    m.params = std::make_unique<model::Params<float>>(*m.layout);
    load_hf_model(m.lora_base, *m.params, /*progress=*/true);
    const PeftAdapter adapter = read_peft_adapter(m.dir.string());
    merge_peft_adapter(adapter, *m.params, m.dir.string());
  } else if (read_weights) {
    m.params = std::make_unique<model::Params<float>>(*m.layout);
    load_hf_model(m.dir, *m.params, /*progress=*/true);
  } else {
    m.weights_pending = true;
  }
  for (const fs::path& folder : {m.dir, m.dir.parent_path(), m.lora_base})
    if (const fs::path p = folder.empty() ? fs::path() : text::find_tokenizer_file(folder); !p.empty()) {
      m.tokenizer = p;
      break;
    }
  if (m.tokenizer.empty() && m.train_config.contains("data")) {
    const auto& d = m.train_config["data"];
    if (d.contains("train_folder") && d["train_folder"].is_string())
      m.tokenizer = find_tokenizer(d["train_folder"].get<std::string>());
  }
  return m;
}

ops::ComputeType loaded_compute_type(const LoadedModel& m, const std::string& dtype,
                                     std::string* note) {
  if (!dtype.empty()) return ops::resolve_dtype(dtype, "--dtype", note);
  const nlohmann::json& c = m.train_config;
  if (c.contains("model") && c["model"].contains("dtype") && c["model"]["dtype"].is_string())
    return ops::resolve_dtype(c["model"]["dtype"].get<std::string>(),
                              (m.dir / "state.json").string() +
                                  ": config.model.dtype (the run's dtype; --dtype overrides it)",
                              note);
  return ops::ComputeType::kFloat32;
}

std::unique_ptr<parallel::ParallelEngine> load_into_engine(LoadedModel& m, const parallel::Grid& grid,
                                                           int64_t packed_length) {
  if (m.weights_pending) {
    auto engine = std::make_unique<parallel::ParallelEngine>(
        m.layout->config(), grid, packed_length, parallel::ParallelEngine::Unfilled{});
    load_hf_shards(m.dir, engine->plan(), engine->params(), grid.world_rank == 0);
    m.weights_pending = false;
    return engine;
  }
  check(m.params != nullptr, "load_into_engine: the weights of {} were already handed over",
        m.dir.string());
  auto engine = std::make_unique<parallel::ParallelEngine>(m.layout->config(), grid, *m.params,
                                                           packed_length);
  m.params.reset();
  return engine;
}

}  // namespace longtron::train
