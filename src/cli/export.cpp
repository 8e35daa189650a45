// `longtron export`: a checkpoint as a Hugging Face folder (docs/model.md): model.safetensors (f32, HF
// names), config.json, tokenizer.model. Written under a temporary name and renamed.
#include <fmt/core.h>

#include <filesystem>
#include <memory>
#include <string>

#include "cli/registry.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "train/checkpoint.h"
#include "train/model_io.h"

namespace fs = std::filesystem;

namespace longtron::cli {
namespace {

struct ExportOptions {
  std::string checkpoint, output;
};

int run_export(const ExportOptions& o) {
  const fs::path out = o.output;
  check(!fs::exists(out) || fs::is_empty(out), "export: --output {} exists and is not empty", o.output);
  // Loading checks every tensor's name and shape before anything is written.
  const train::LoadedModel m = train::load_model_dir(o.checkpoint);
  const fs::path tmp = out.string() + ".tmp-export";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a leftover of an interrupted export; create_directories reports why not
  fs::create_directories(tmp, ec);
  check(!ec, "export: cannot create the folder {} next to --output {} ({})", tmp.string(), o.output,
        ec.message());
  try {
    fs::copy_file(m.dir / "config.json", tmp / "config.json");
    if (fs::is_regular_file(m.dir / "model.safetensors")) {
      fs::copy_file(m.dir / "model.safetensors", tmp / "model.safetensors");
    } else {
      std::vector<safetensors::WriteTensor> tensors;
      for (const auto& v : m.layout->views())
        tensors.push_back({v.name, v.shape, safetensors::DType::F32, m.params->get(v.name), nullptr});
      safetensors::write_file(tmp / "model.safetensors", tensors);
    }
    if (!m.tokenizer.empty()) fs::copy_file(m.tokenizer, tmp / "tokenizer.model");
    if (fs::exists(out)) fs::remove(out);
    fs::rename(tmp, out);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp);
    fail("export: writing {} failed: {}", o.output, e.what());
  }
  fmt::print("export: {} -> {} ({} parameters{})\n", m.dir.string(), o.output, m.layout->numel(),
             m.tokenizer.empty() ? ", no tokenizer.model found" : ", tokenizer.model");
  return 0;
}

Subcommand export_command(50, [](CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* sub = app.add_subcommand("export", "Write a checkpoint as a Hugging Face folder");
  sub->add_option("--checkpoint", o->checkpoint, "Checkpoint root or step folder")->required();
  sub->add_option("--output", o->output, "Output folder (new or empty)")->required();
  return [o] { return run_export(*o); };
});

}  // namespace
}  // namespace longtron::cli
