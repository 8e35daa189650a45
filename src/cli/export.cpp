// `longtron export`: a checkpoint (or Hugging Face folder) as a Hugging Face folder (docs/model.md):
// model.safetensors (f32 or bf16) under the names of the chosen family, its config.json, and the
// tokenizer files found with the model. Written under a temporary name and renamed.
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cli/registry.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/hf_config.h"
#include "ops/precision.h"
#include "train/checkpoint.h"
#include "train/model_io.h"

namespace fs = std::filesystem;

namespace longtron::cli {
namespace {

struct ExportOptions {
  std::string checkpoint, output, format, dtype = "float32";
};

int run_export(const ExportOptions& o) {
  const fs::path out = o.output;
  check(!fs::exists(out) || fs::is_empty(out), "export: --output {} exists and is not empty", o.output);
  // InternEvo's spellings (torch.float32, torch.bfloat16) as model.dtype and eval --dtype take them.
  const std::string dtype = ops::canonical_dtype(o.dtype);
  check(dtype == "float32" || dtype == "bfloat16",
        "export: --dtype must be float32 or bfloat16, got \"{}\"", o.dtype);
  // Loading checks every tensor's name and shape before anything is written.
  const train::LoadedModel m = train::load_model_dir(o.checkpoint);
  const model::ModelConfig& config = m.layout->config();
  const std::string format = o.format.empty() ? config.type : o.format;
  model::check_model_type(format, "export --format");
  // The config first: it refuses what the format cannot express before any tensor is copied.
  nlohmann::json hf = model::to_hf_config(config, 0, format);
  const bool bf16 = dtype == "bfloat16";
  hf["torch_dtype"] = dtype;
  const train::HfTensors named = train::hf_named_tensors(*m.params, "", format);
  const fs::path tmp = out.string() + ".tmp-export";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a leftover of an interrupted export; create_directories reports why not
  fs::create_directories(tmp, ec);
  check(!ec, "export: cannot create the folder {} next to --output {} ({})", tmp.string(), o.output,
        ec.message());
  std::vector<std::string> copied;
  try {
    {
      std::ofstream file(tmp / "config.json");
      file << hf.dump(2) << "\n";
      file.close();
      check(file.good(), "export: writing {} failed", (tmp / "config.json").string());
    }
    std::vector<safetensors::WriteTensor> tensors;
    const auto dtype = bf16 ? safetensors::DType::BF16 : safetensors::DType::F32;
    for (const auto& t : named.tensors) tensors.push_back({t.name, t.shape, dtype, t.data, nullptr});
    safetensors::write_file(tmp / "model.safetensors", tensors, {{"format", "pt"}},
                            "writing " + (out / "model.safetensors").string());
    copied = train::copy_tokenizer_files(m.dir, tmp);
    if (!m.tokenizer.empty() && !fs::exists(tmp / "tokenizer.model")) {
      fs::copy_file(m.tokenizer, tmp / "tokenizer.model");
      copied.push_back("tokenizer.model");
    }
    if (fs::exists(out)) fs::remove(out);
    fs::rename(tmp, out);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp);
    fail("export: writing {} failed: {}", o.output, e.what());
  }
  std::string files;
  for (const auto& c : copied) files += ", " + c;
  fmt::print("export: {} -> {} ({} {} parameters, {}{})\n", m.dir.string(), o.output,
             m.layout->numel(), format, dtype, copied.empty() ? ", no tokenizer found" : files);
  return 0;
}

Subcommand export_command(50, [](CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* sub = app.add_subcommand("export", "Write a checkpoint as a Hugging Face folder");
  sub->add_option("--checkpoint", o->checkpoint, "Checkpoint root, step folder or Hugging Face folder")
      ->required();
  sub->add_option("--output", o->output, "Output folder (new or empty)")->required();
  sub->add_option("--format", o->format,
                  "Family to write: internlm2, llama, qwen2 or mistral (default: the model's own; "
                  "an InternLM2 model written as llama has its wqkv split into q/k/v_proj)");
  sub->add_option("--dtype", o->dtype, "Tensor type: float32 (default) or bfloat16 (torch.float32, torch.bfloat16 also accepted)");
  return [o] { return run_export(*o); };
});

}  // namespace
}  // namespace longtron::cli
