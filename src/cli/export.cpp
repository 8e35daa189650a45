// `longtron export`: a checkpoint (or Hugging Face folder) as a Hugging Face folder (docs/model.md):
// model.safetensors (f32 or bf16) under the names of the chosen family, its config.json, and the
// tokenizer files found with the model. Written under a temporary name and renamed. A LoRA step
// folder (docs/lora.md) is written as its adapter, a PEFT folder (train/peft.h), or with
// --merge-lora as the merged model.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cli/options.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/families.h"
#include "model/hf_config.h"
#include "ops/precision.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/model_io.h"
#include "train/peft.h"

namespace fs = std::filesystem;

namespace longtron::cli {
namespace {

struct ExportOptions {
  std::string checkpoint, output, format, dtype = "float32";
  bool overwrite = false;  ///< replace a non-empty --output (after the new folder is complete)
  bool merge_lora = false;  ///< a LoRA checkpoint as the merged model rather than its adapter
};

/// The step folder of --checkpoint when it is a LoRA checkpoint (state.json's extra.lora), else
/// empty. A Hugging Face folder or an unreadable path is left to load_model_dir to report.
fs::path lora_step(const std::string& checkpoint) {
  const fs::path path = checkpoint;
  if (fs::is_regular_file(path / "config.json") && !fs::exists(path / "state.json") &&
      !fs::exists(path / "latest"))
    return {};
  try {
    const fs::path step = train::resolve_checkpoint(path);
    const train::CheckpointState state = train::read_checkpoint_state(step);
    return state.extra.is_object() && state.extra.contains("lora") ? step : fs::path();
  } catch (const Error&) {
    return {};
  }
}

/// Refuses an --output that is, or holds, the checkpoint being exported (--overwrite would
/// remove it).
void check_output_apart(const ExportOptions& o, const fs::path& dir) {
  const fs::path out = o.output;
  std::error_code ec;
  check(!fs::exists(out) || !fs::equivalent(out, dir, ec),
        "export: --output {} is the checkpoint being exported", o.output);
  if (fs::exists(out)) {
    const fs::path outer = fs::weakly_canonical(out, ec);
    for (const fs::path& inner : {fs::weakly_canonical(dir, ec), fs::weakly_canonical(o.checkpoint, ec)}) {
      const auto [mismatch, rest] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
      check(mismatch != outer.end() || outer.empty(),
            "export: --output {} holds the checkpoint being exported ({}); it would be removed", o.output,
            inner.string());
    }
  }
}

/// A LoRA step folder's adapter as a PEFT folder (adapter_model.safetensors, adapter_config.json)
/// with the tokenizer files, in its family's names or --format's: an InternLM2 wqkv adapter as
/// Llama's q/k/v_proj adapters sharing A (exact), Llama's as InternLM2's when q, k and v share A.
int run_export_adapter(const ExportOptions& o, const fs::path& step) {
  const fs::path out = o.output;
  check(ops::canonical_dtype(o.dtype) == "float32",
        "export: --dtype {}: an adapter is written in float32 (PEFT casts it to the base's dtype "
        "when it loads it); --merge-lora writes the merged model in bfloat16", o.dtype);
  check_output_apart(o, step);
  const fs::path base = train::lora_checkpoint_base(step);  // moved or changed base: an error
  const model::ModelConfig config = model::read_hf_config(step);
  train::PeftAdapter adapter = train::read_peft_adapter(step.string());
  train::check_adapter_fits(adapter, model::ParamTable(config), step.string());
  const std::string format = o.format.empty() ? config.type : o.format;
  model::check_model_type(format, "export --format");
  model::to_hf_config(config, 0, format);  // refuses what the format cannot express
  using model::TensorNames;
  const TensorNames from = model::family(config.type, "model.type").names;
  const TensorNames to = model::family(format, "export --format").names;
  if (from == TensorNames::kFused && to == TensorNames::kSeparate)
    adapter = train::internlm2_adapter_as_llama(adapter, config);
  else if (from == TensorNames::kSeparate && to == TensorNames::kFused)
    try {
      adapter = train::llama_adapter_as_internlm2(adapter, config);
    } catch (const Error& e) {
      fail("export --format {} of the {} adapter {}: {}", format, config.type, step.string(), e.what());
    }
  const fs::path tmp = out.string() + ".tmp-export";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  std::vector<std::string> copied;
  try {
    train::write_peft_adapter(tmp.string(), adapter);
    copied = train::copy_tokenizer_files(step, tmp);
    if (copied.empty()) copied = train::copy_tokenizer_files(base, tmp);
    if (fs::exists(out)) fs::remove_all(out);
    fs::rename(tmp, out);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    fail("export: writing {} failed: {}", o.output, e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  std::string files;
  for (const auto& c : copied) files += ", " + c;
  int64_t numel = 0;
  for (const auto& m : adapter.modules) numel += int64_t(m.A.size() + m.B.size());
  fmt::print("export: {} -> {} (LoRA adapter of {} modules, rank {}, {} parameters, {} names, base "
             "{}{})\n", step.string(), o.output, adapter.modules.size(), adapter.config.r, numel,
             format, base.string(), copied.empty() ? ", no tokenizer found" : files);
  return 0;
}

int run_export(const ExportOptions& o) {
  const fs::path out = o.output;
  check(o.overwrite || !fs::exists(out) || fs::is_empty(out),
        "export: --output {} exists and is not empty (pass --overwrite to replace it)", o.output);
  // InternEvo's spellings (torch.float32, torch.bfloat16) as model.dtype and eval --dtype take them.
  const std::string dtype = ops::canonical_dtype(o.dtype);
  check(dtype == "float32" || dtype == "bfloat16",
        "export: --dtype must be float32 or bfloat16, got \"{}\"", o.dtype);
  const fs::path lora = lora_step(o.checkpoint);
  if (!lora.empty() && !o.merge_lora) return run_export_adapter(o, lora);
  check(!o.merge_lora || !lora.empty(),
        "export: --merge-lora: {} is not a LoRA checkpoint (its state.json names no adapter base)",
        o.checkpoint);
  // Loading checks every tensor's name and shape before anything is written (a LoRA checkpoint:
  // its base, checked, with the adapter merged).
  const train::LoadedModel m = train::load_model_dir(o.checkpoint);
  // --overwrite removes --output: it must not hold the checkpoint (--output the checkpoint
  // folder whose step_N is exported, or a folder above it), which would be deleted with it.
  check_output_apart(o, m.dir);
  const model::ModelConfig& config = m.layout->config();
  const std::string format = o.format.empty() ? config.type : o.format;
  model::check_model_type(format, "export --format");
  // The config first: it refuses what the format cannot express before any tensor is copied.
  nlohmann::json hf = model::to_hf_config(config, 0, format);
  const bool bf16 = dtype == "bfloat16";
  hf["torch_dtype"] = dtype;
  const train::HfTensors named = train::hf_named_tensors(*m.params, "", format);
  for (const auto& t : named.tensors) {  // an export, like a checkpoint, holds finite values only
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(t.data[i]))
        fail("export: {}: tensor {} holds the non-finite value {} at element {}; nothing was "
             "written", m.dir.string(), t.name, t.data[i], i);
  }
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
    if (copied.empty() && !m.lora_base.empty()) copied = train::copy_tokenizer_files(m.lora_base, tmp);
    if (!m.tokenizer.empty())
      for (const fs::path& file : text::tokenizer_file_set(m.tokenizer))
        if (!fs::exists(tmp / file.filename())) {
          fs::copy_file(file, tmp / file.filename());
          copied.push_back(file.filename().string());
        }
    if (fs::exists(out)) fs::remove_all(out);  // empty, or --overwrite: the new folder is complete
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

Subcommand export_command(help_order::kExport, [](CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* sub = app.add_subcommand("export", "Write a checkpoint as a Hugging Face folder");
  add_checkpoint_option(*sub, o->checkpoint, "Checkpoint root, step folder or Hugging Face folder");
  sub->add_option("--output", o->output, "Output folder (new or empty, or any with --overwrite)")->required();
  sub->add_flag("--overwrite", o->overwrite,
                "Replace --output if it holds files (once the new folder is complete)");
  sub->add_option("--format", o->format,
                  "Family to write: " + model::or_list(model::model_types()) +
                      " (default: the model's own; an InternLM2 model written as llama has its wqkv "
                      "split into q/k/v_proj, and an InternLM2 LoRA adapter its wqkv adapter into "
                      "q/k/v_proj adapters sharing A)");
  sub->add_flag("--merge-lora", o->merge_lora,
                "A LoRA checkpoint as the merged model W + s·B·A (a full Hugging Face folder of "
                "its family) instead of its adapter (a PEFT folder)");
  sub->add_option("--dtype", o->dtype, "Tensor type: float32 (default) or bfloat16 (torch.float32, torch.bfloat16 also accepted)");
  return [o] { return run_export(*o); };
});

}  // namespace
}  // namespace longtron::cli
