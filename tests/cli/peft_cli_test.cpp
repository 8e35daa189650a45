// LoRA checkpoints through export, eval and generate (docs/lora.md): the step folder holds the
// adapter (a PEFT folder) and state.json names the base folder and its fingerprint. `export`
// writes the adapter as a PEFT folder (InternLM2's wqkv adapter as Llama's q/k/v adapters with
// --format llama), `export --merge-lora` the merged model W + s·B·A; `eval` and `generate` merge
// the adapter at load and give what the merged folder gives; a moved or changed base is refused
// naming its path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_fixture.h"
#include "core/safetensors.h"
#include "model/hf_config.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/peft.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::Prepared;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::write_file;
using nlohmann::json;
namespace st = longtron::safetensors;
namespace tr = longtron::train;
namespace model = longtron::model;

namespace {

/// A random adapter (rank 4, alpha 8) of `targets` on the model of HF folder `base`.
tr::PeftAdapter random_adapter(const fs::path& base, const std::vector<std::string>& targets, uint64_t seed) {
  const model::ModelConfig config = model::read_hf_config(base);
  const model::ParamTable layout(config);
  model::LoraConfig lora;
  lora.rank = 4;
  lora.targets = targets;
  tr::PeftAdapter a;
  a.config.r = 4;
  a.config.lora_alpha = 8;
  a.config.target_modules = model::lora_resolve_targets(config.type, targets);
  a.config.base_model_name_or_path = fs::absolute(base).string();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const auto& m : model::lora_modules(layout, lora)) {
    tr::PeftModuleAdapter x{m.module, m.in, m.out, std::vector<float>(size_t(4 * m.in)),
                            std::vector<float>(size_t(m.out * 4))};
    for (auto& v : x.A) v = normal(rng);
    for (auto& v : x.B) v = normal(rng);
    a.modules.push_back(std::move(x));
  }
  return a;
}

/// A LoRA step folder as training writes it: the adapter, the base's config.json and tokenizer
/// files, and state.json whose config is `run_state`'s and whose extra.lora names the base.
fs::path make_lora_step(const fs::path& root, const fs::path& base, const tr::PeftAdapter& adapter,
                        const fs::path& run_state) {
  const fs::path step = root / "step_1";
  tr::write_peft_adapter(step.string(), adapter);
  fs::copy_file(base / "config.json", step / "config.json");
  tr::copy_tokenizer_files(base, step);
  json state = json::parse(read_file(run_state));
  state["step"] = 1;
  state["extra"] = {{"lora", {{"base", fs::absolute(base).string()},
                              {"base_fingerprint", tr::base_fingerprint(base.string())},
                              {"rank", 4}, {"alpha", 8.0}}}};
  write_file(step / "state.json", state.dump(2));
  write_file(root / "latest", "step_1\n");
  return step;
}

/// Every tensor of a folder's model.safetensors, by name.
std::map<std::string, std::vector<float>> tensors(const fs::path& folder) {
  const st::Reader reader(folder);
  std::map<std::string, std::vector<float>> out;
  for (const auto& name : reader.names()) out[name] = reader.file_of(name).read_floats(name);
  return out;
}

/// The base's weights with `adapter` merged, by the base family's names.
std::map<std::string, std::vector<float>> merged_in_process(const fs::path& base, const tr::PeftAdapter& adapter) {
  const model::ModelConfig config = model::read_hf_config(base);
  const model::ParamTable layout(config);
  model::Params<float> full(layout);
  tr::load_hf_model(base, full);
  tr::merge_peft_adapter(adapter, full, "test");
  std::map<std::string, std::vector<float>> out;
  const tr::HfTensors named = tr::hf_named_tensors(full);
  for (const auto& t : named.tensors) out[t.name] = std::vector<float>(t.data, t.data + t.numel());
  return out;
}

double eval_loss(const std::string& checkpoint, const fs::path& data) {
  const auto r = run_longtron("eval --checkpoint " + checkpoint + " --data " + data.string() +
                              " --seq-len 64 --micro-bsz 2 --json --threads 1");
  EXPECT_EQ(r.status, 0) << r.output;
  const auto brace = r.output.rfind("\n{");
  return json::parse(r.output.substr(brace == std::string::npos ? 0 : brace + 1))["loss"].get<double>();
}

std::string generated(const std::string& checkpoint) {
  const auto r = run_longtron("generate --checkpoint " + checkpoint +
                              " --prompt-ids 3,5,7,11 --max-new-tokens 8 --threads 1");
  EXPECT_EQ(r.status, 0) << r.output;
  std::istringstream lines(r.output);
  std::string ids;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.find_first_not_of("0123456789,") == std::string::npos) ids = line;
  return ids;
}

}  // namespace

TEST(PeftCli, LlamaAdapterExportMergeEvalGenerate) {
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path base = p.dir / "base";
  r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " + base.string() +
                   " --format llama");
  ASSERT_EQ(r.status, 0) << r.output;
  const tr::PeftAdapter adapter = random_adapter(base, {"all-linear"}, 5);
  const fs::path step = make_lora_step(p.dir / "lora", base, adapter, p.dir / "ckpt" / "step_1" / "state.json");

  // The adapter as a PEFT folder, the same values under the same names; tokenizer files along.
  r = run_longtron("export --checkpoint " + (p.dir / "lora").string() + " --output " + (p.dir / "adapter").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "LoRA adapter of 14 modules, rank 4")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "adapter" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(p.dir / "adapter" / "tokenizer.model"));
  const tr::PeftAdapter back = tr::read_peft_adapter((p.dir / "adapter").string());
  ASSERT_EQ(back.modules.size(), adapter.modules.size());
  for (size_t i = 0; i < back.modules.size(); ++i) {
    EXPECT_EQ(back.modules[i].module, adapter.modules[i].module);
    EXPECT_EQ(back.modules[i].A, adapter.modules[i].A);
    EXPECT_EQ(back.modules[i].B, adapter.modules[i].B);
  }
  EXPECT_EQ(back.config.base_model_name_or_path, fs::absolute(base).string());
  r = run_longtron("eval --checkpoint " + (p.dir / "adapter").string() + " --data " +
                   (p.dir / "data" / "valid").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "PEFT adapter folder") && contains(r.output, "--merge-lora")) << r.output;
  r = run_longtron("export --checkpoint " + step.string() + " --output " + (p.dir / "x").string() +
                   " --dtype bfloat16");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "float32")) << r.output;

  // Llama's q/k/v adapters with their own A do not fuse into one wqkv adapter of the same rank.
  r = run_longtron("export --checkpoint " + step.string() + " --format internlm2 --output " +
                   (p.dir / "fused").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--format internlm2") && contains(r.output, "different lora_A") &&
              contains(r.output, "rank 12")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "fused"));

  // The merged model: the base's tensors with W + s·B·A, as merging in this process gives.
  const fs::path merged = p.dir / "merged";
  r = run_longtron("export --checkpoint " + step.string() + " --merge-lora --output " + merged.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(merged / "config.json"))["model_type"], "llama");
  EXPECT_TRUE(fs::exists(merged / "tokenizer.model"));
  const auto want = merged_in_process(base, adapter);
  const auto got = tensors(merged);
  EXPECT_EQ(got, want);
  EXPECT_NE(got.at("model.layers.1.mlp.down_proj.weight"), tensors(base).at("model.layers.1.mlp.down_proj.weight"));
  r = run_longtron("export --checkpoint " + base.string() + " --merge-lora --output " + (p.dir / "y").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "not a LoRA checkpoint")) << r.output;

  // eval and generate of the LoRA checkpoint: the merged folder's loss and tokens.
  const fs::path valid = p.dir / "data" / "valid";
  const double lora_loss = eval_loss(step.string(), valid);
  EXPECT_EQ(lora_loss, eval_loss(merged.string(), valid));
  EXPECT_NE(lora_loss, eval_loss(base.string(), valid));
  const std::string ids = generated(step.string());
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(ids, generated(merged.string()));

  // An adapter that does not fit the base is refused naming its tensor.
  {
    tr::PeftAdapter bad = adapter;
    bad.modules[1].out += 1;  // model.layers.0.self_attn.k_proj
    bad.modules[1].B.resize(size_t(bad.modules[1].out * 4), 0.01f);
    const fs::path bad_step = make_lora_step(p.dir / "bad", base, bad, p.dir / "ckpt" / "step_1" / "state.json");
    for (const std::string& cmd : {"eval --data " + valid.string(), "export --merge-lora --output " + (p.dir / "w").string(),
                                   std::string("export --output ") + (p.dir / "w").string()}) {
      r = run_longtron(cmd + " --checkpoint " + bad_step.string());
      EXPECT_NE(r.status, 0) << cmd;
      EXPECT_TRUE(contains(r.output, "base_model.model.model.layers.0.self_attn.k_proj.lora_")) << cmd << ": " << r.output;
    }
  }

  // A changed base is refused naming it; so is a moved one.
  {
    auto w = tensors(base);
    std::vector<st::WriteTensor> list;
    w["model.norm.weight"][0] += 1.0f;
    for (const auto& [name, v] : w) list.push_back({name, {}, st::DType::F32, v.data(), nullptr});
    const st::Reader reader(base);
    for (auto& t : list) t.shape = reader.info(t.name).shape;
    st::write_file(base / "model.safetensors", list);
  }
  r = run_longtron("eval --checkpoint " + step.string() + " --data " + valid.string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, base.string()) && contains(r.output, "changed")) << r.output;
  fs::rename(base, p.dir / "moved");
  for (const std::string& cmd : {"eval --data " + valid.string(), "export --output " + (p.dir / "z").string(),
                                std::string("generate --prompt-ids 1,2")}) {
    r = run_longtron(cmd + " --checkpoint " + step.string());
    EXPECT_NE(r.status, 0) << cmd;
    EXPECT_TRUE(contains(r.output, base.string()) && contains(r.output, "does not exist")) << cmd << ": " << r.output;
  }
}

// An InternLM2 LoRA checkpoint exported with --format llama: q/k/v adapters that share A and
// take their rows of wqkv's B; merged onto the Llama export of the same base they give exactly
// the InternLM2 merge exported as Llama.
TEST(PeftCli, InternLm2AdapterExportedAsLlama) {
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path base = p.dir / "base", llama = p.dir / "base_llama";
  for (const auto& [out, format] : {std::pair{base, "internlm2"}, std::pair{llama, "llama"}}) {
    r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " + out.string() +
                     " --format " + format);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const tr::PeftAdapter adapter = random_adapter(base, {"wqkv", "w2"}, 9);
  const fs::path step = make_lora_step(p.dir / "lora", base, adapter, p.dir / "ckpt" / "step_1" / "state.json");
  r = run_longtron("export --checkpoint " + step.string() + " --format llama --output " + (p.dir / "adapter").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const tr::PeftAdapter split = tr::read_peft_adapter((p.dir / "adapter").string());
  EXPECT_EQ(split.config.target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "down_proj"}));
  ASSERT_EQ(split.modules.size(), 8u);
  EXPECT_EQ(split.modules[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(split.modules[1].A, split.modules[0].A);
  const fs::path merged = p.dir / "merged";
  r = run_longtron("export --checkpoint " + step.string() + " --merge-lora --format llama --output " + merged.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(tensors(merged), merged_in_process(llama, split));
}

// A LoRA run's own checkpoint: eval merges the adapter at load and gives the validation loss the
// run logged with the adapter applied inside the model (fp32: equal up to the rounding of the
// merge), and its --merge-lora export evaluates the same.
TEST(PeftCli, TrainedLoraCheckpointEvaluatesAsTraining) {
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path base = p.dir / "base";
  r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " + base.string() +
                   " --format llama");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path valid = p.dir / "data" / "valid";
  write_file(p.dir / "lora.toml",
             "[data]\ntrain_folder = \"" + (p.dir / "data" / "train").string() + "\"\nvalid_folder = \"" +
                 valid.string() + "\"\nseq_len = 64\nmicro_bsz = 2\n[optimizer]\nlr = 1e-2\n[train]\n"
                 "total_steps = 3\nnum_threads = 1\ncheckpoint_dir = \"" + (p.dir / "lck").string() +
                 "\"\nmetrics_file = \"" + (p.dir / "lm.jsonl").string() +
                 "\"\n[lora]\nrank = 4\nalpha = 8\ndropout = 0.1\n");
  r = run_longtron("train --config " + (p.dir / "lora.toml").string() + " --init-from " + base.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "train: LoRA rank 4, alpha 8 on ") &&
              contains(r.output, " trainable parameters (")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "lck" / "step_3" / "model.safetensors"));
  double logged = 0;
  {
    std::istringstream in(read_file(p.dir / "lm.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("valid_loss") && j["step"] == 3) logged = j["valid_loss"].get<double>();
    }
  }
  ASSERT_GT(logged, 0);
  const double loss = eval_loss((p.dir / "lck").string(), valid);
  EXPECT_NEAR(loss, logged, 1e-6 * logged);
  EXPECT_NE(loss, eval_loss(base.string(), valid));  // the adapter trained
  r = run_longtron("export --checkpoint " + (p.dir / "lck").string() + " --merge-lora --output " +
                   (p.dir / "merged").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(eval_loss((p.dir / "merged").string(), valid), loss);
}
