// Hugging Face families through the CLI (docs/model.md): an InternLM2 checkpoint exported as a
// Llama folder, trained further with --init-from on it ([model] left out of the TOML), names and
// config.json keys kept, tokenizer files carried, and the round trip export → --init-from exact;
// `generate --prompt-ids` on a folder whose only tokenizer is a tokenizer.json.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_fixture.h"
#include "comm/communicator.h"
#include "core/safetensors.h"
#include "parallel/layout.h"
#include "train/model_io.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::Prepared;
using longtron::testing::TempDir;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::write_file;
using nlohmann::json;
namespace st = longtron::safetensors;

namespace {

double first_loss(const fs::path& metrics) {
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("loss") && j["loss"].is_number()) return j["loss"].get<double>();
  }
  ADD_FAILURE() << "no loss row in " << metrics;
  return 0;
}

std::vector<float> tensor(const fs::path& file, const std::string& name) {
  return st::Reader(file).file_of(name).read_floats(name);
}

/// A TOML with the tiny run's data and train sections and no [model] (it comes from config.json).
void write_fine_tune_toml(const Prepared& p, const std::string& name, const std::string& ckpt) {
  write_file(p.dir / name,
             "[data]\ntrain_folder = \"" + (p.dir / "data" / "train").string() +
                 "\"\nseq_len = 64\nmicro_bsz = 2\n[optimizer]\nlr = 1e-3\n[train]\ntotal_steps = 1\n"
                 "num_threads = 1\ncheckpoint_dir = \"" + (p.dir / ckpt).string() +
                 "\"\nmetrics_file = \"" + (p.dir / (ckpt + ".jsonl")).string() + "\"\n");
}

TEST(HfCli, InternLM2CheckpointExportedAsLlamaTrainsFurther) {
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set train.total_steps=2");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path llama = p.dir / "llama";
  r = run_longtron("export --checkpoint " + (p.dir / "ckpt").string() + " --output " +
                   llama.string() + " --format llama");
  ASSERT_EQ(r.status, 0) << r.output;
  json cfg = json::parse(read_file(llama / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_FALSE(cfg.contains("bias")) << "an InternLM2 key in a Llama config";
  EXPECT_TRUE(fs::exists(llama / "tokenizer.model"));
  const st::Reader exported(llama);
  EXPECT_EQ(exported.file_of("model.layers.1.self_attn.k_proj.weight")
                .info("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{16, 32}));  // 2 kv heads × head_dim 8
  // Keys longtron does not use pass through; max_position_embeddings is not replaced by seq_len.
  cfg["max_position_embeddings"] = 4096;
  cfg["bos_token_id"] = 7;
  write_file(llama / "config.json", cfg.dump(2));
  write_file(llama / "generation_config.json", "{\"do_sample\": false}\n");

  // Fine-tune from the Llama folder and, for comparison, from the InternLM2 checkpoint itself.
  write_fine_tune_toml(p, "ft_llama.toml", "ck_llama");
  write_fine_tune_toml(p, "ft_internlm2.toml", "ck_internlm2");
  r = run_longtron("train --config " + (p.dir / "ft_llama.toml").string() + " --init-from " +
                   llama.string() + " --dump-grads " + (p.dir / "g_llama").string());
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron("train --config " + (p.dir / "ft_internlm2.toml").string() + " --init-from " +
                   (p.dir / "ckpt" / "step_2").string() + " --dump-grads " +
                   (p.dir / "g_internlm2").string());
  ASSERT_EQ(r.status, 0) << r.output;
  // A checkpoint root means its latest step (as for --resume, eval and export).
  write_fine_tune_toml(p, "ft_root.toml", "ck_root");
  r = run_longtron("train --config " + (p.dir / "ft_root.toml").string() + " --init-from " +
                   (p.dir / "ckpt").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(first_loss(p.dir / "ck_root.jsonl"), first_loss(p.dir / "ck_internlm2.jsonl"));
  // The same model under two names: the same loss and gradients, each under its family's names.
  EXPECT_EQ(first_loss(p.dir / "ck_llama.jsonl"), first_loss(p.dir / "ck_internlm2.jsonl"));
  EXPECT_EQ(tensor(p.dir / "g_llama", "lm_head.weight"), tensor(p.dir / "g_internlm2", "output.weight"));
  EXPECT_EQ(tensor(p.dir / "g_llama", "model.layers.0.mlp.down_proj.weight"),
            tensor(p.dir / "g_internlm2", "model.layers.0.feed_forward.w2.weight"));
  const fs::path step = p.dir / "ck_llama" / "step_1";
  const json saved = json::parse(read_file(step / "config.json"));
  EXPECT_EQ(saved["model_type"], "llama");
  EXPECT_EQ(saved["max_position_embeddings"], 4096);
  EXPECT_EQ(saved["bos_token_id"], 7);
  EXPECT_TRUE(st::Reader(step).file_of("lm_head.weight").contains("lm_head.weight"));
  EXPECT_TRUE(fs::exists(step / "tokenizer.model"));
  EXPECT_TRUE(fs::exists(step / "generation_config.json"));

  // Round trip: the Llama folder exported again is the same folder, and trains the same.
  const fs::path again = p.dir / "llama_again";
  r = run_longtron("export --checkpoint " + llama.string() + " --output " + again.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(again / "config.json")), cfg);
  const st::Reader a(llama), b(again);
  auto na = a.names(), nb = b.names();
  std::sort(na.begin(), na.end());
  std::sort(nb.begin(), nb.end());
  ASSERT_EQ(na, nb);
  for (const auto& name : na)
    EXPECT_EQ(a.file_of(name).read_floats(name), b.file_of(name).read_floats(name)) << name;
  EXPECT_TRUE(fs::exists(again / "generation_config.json"));
  write_fine_tune_toml(p, "ft_again.toml", "ck_again");
  r = run_longtron("train --config " + (p.dir / "ft_again.toml").string() + " --init-from " +
                   again.string() + " --dump-grads " + (p.dir / "g_again").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(first_loss(p.dir / "ck_again.jsonl"), first_loss(p.dir / "ck_llama.jsonl"));
  EXPECT_EQ(tensor(p.dir / "g_again", "model.layers.1.self_attn.q_proj.weight"),
            tensor(p.dir / "g_llama", "model.layers.1.self_attn.q_proj.weight"));

  // --dtype bfloat16 (InternEvo's spelling too) writes BF16 tensors and says so in config.json;
  // the values are the float32 export's rounded to bf16.
  const fs::path half = p.dir / "llama_bf16";
  r = run_longtron("export --checkpoint " + llama.string() + " --output " + half.string() +
                   " --dtype torch.bfloat16");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(half / "config.json"))["torch_dtype"], "bfloat16");
  const st::Reader h(half);
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  EXPECT_EQ(h.file_of(q).info(q).dtype, st::DType::BF16);
  const std::vector<float> full = a.file_of(q).read_floats(q), rounded = h.file_of(q).read_floats(q);
  ASSERT_EQ(full.size(), rounded.size());
  for (size_t i = 0; i < full.size(); ++i)
    ASSERT_NEAR(rounded[i], full[i], std::abs(full[i]) * 0x1p-8) << q << " [" << i << "]";

  // A TOML that names another family is refused, naming both.
  r = run_longtron("train --config " + (p.dir / "ft_again.toml").string() + " --init-from " +
                   again.string() + " --set model.type=\"internlm2\" --overwrite");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "model.type = \"internlm2\"") && contains(r.output, "\"llama\""))
      << r.output;
}

// configs/tiny_{llama,qwen2,mistral,qwen3}.toml train from scratch and save under their family's
// names.
TEST(HfCli, TinyConfigOfEachFamilyTrainsAndSavesItsNames) {
  Prepared p;
  for (const std::string family : {"llama", "qwen2", "mistral", "qwen3"}) {
    const fs::path out = p.dir / family;
    const auto r = run_longtron(
        "train --config " + std::string(LONGTRON_SOURCE_DIR) + "/configs/tiny_" + family +
        ".toml --set model.vocab_size=400 --set train.total_steps=2 --set train.valid_every=0"
        " --set data.train_folder=\"" + (p.dir / "data" / "train").string() +
        "\" --set data.valid_folder=\"" + (p.dir / "data" / "valid").string() +
        "\" --set train.checkpoint_dir=\"" + (out / "ckpt").string() +
        "\" --set train.metrics_file=\"" + (out / "metrics.jsonl").string() + "\"");
    ASSERT_EQ(r.status, 0) << family << "\n" << r.output;
    const fs::path step = out / "ckpt" / "step_2";
    const json cfg = json::parse(read_file(step / "config.json"));
    EXPECT_EQ(cfg["model_type"], family);
    const st::Reader saved(step);
    EXPECT_TRUE(saved.file_of("model.layers.1.mlp.gate_proj.weight").contains("model.layers.1.mlp.gate_proj.weight"));
    const auto names = saved.names();
    const bool has_bias = std::find(names.begin(), names.end(), "model.layers.0.self_attn.q_proj.bias") != names.end();
    EXPECT_EQ(has_bias, family == "qwen2") << family;
    if (family == "mistral") {
      EXPECT_EQ(cfg["sliding_window"], 32);
    }
    const bool has_qk_norm = std::find(names.begin(), names.end(),
                                       "model.layers.1.self_attn.k_norm.weight") != names.end();
    EXPECT_EQ(has_qk_norm, family == "qwen3") << family;
    if (family != "qwen3") continue;
    EXPECT_EQ(cfg["head_dim"], 32);
    // Trained further from its folder ([model] from config.json), and refused as a Llama folder.
    write_fine_tune_toml(p, "ft_qwen3.toml", "ft_qwen3");
    auto again = run_longtron("train --config " + (p.dir / "ft_qwen3.toml").string() +
                              " --init-from " + step.string() + " --overwrite");
    ASSERT_EQ(again.status, 0) << again.output;
    EXPECT_EQ(json::parse(read_file(p.dir / "ft_qwen3" / "step_1" / "config.json"))["model_type"],
              "qwen3");
    // eval and generate read the Qwen3 folder (the q/k norms run in their forward).
    again = run_longtron("eval --checkpoint " + step.string() + " --data " +
                         (p.dir / "data" / "valid").string() + " --json");
    ASSERT_EQ(again.status, 0) << again.output;
    EXPECT_TRUE(std::isfinite(json::parse(again.output)["loss"].get<double>())) << again.output;
    again = run_longtron("generate --checkpoint " + step.string() +
                         " --prompt-ids 5,6,7 --max-new-tokens 3");
    ASSERT_EQ(again.status, 0) << again.output;
    again = run_longtron("export --checkpoint " + step.string() + " --output " +
                         (p.dir / "as_llama").string() + " --format llama");
    EXPECT_NE(again.status, 0);
    EXPECT_TRUE(contains(again.output, "q_norm and k_norm")) << again.output;
  }
  // A Qwen2 without its q/k/v bias cannot be written as Qwen2: refused before training.
  const auto r = run_longtron("train --config " + std::string(LONGTRON_SOURCE_DIR) +
                              "/configs/tiny_qwen2.toml --set model.qkv_bias=false --dry-run");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "model.type") && contains(r.output, "qkv_bias = false")) << r.output;
}

// A Llama folder whose only tokenizer is a broken tokenizer.json: --prompt is refused naming the
// file and --prompt-ids; --prompt-ids prints the prompt's ids then the greedy continuation, which equals the
// argmax of the model's logits token by token, and stops before config.json's or
// generation_config.json's eos_token_id.
TEST(HfCli, GeneratePromptIdsWithoutTokenizer) {
  TempDir dir;
  const fs::path folder = longtron::testing::golden_llama_without_eos(dir.path());
  write_file(folder / "tokenizer.json", "{}");

  auto r = run_longtron("generate --checkpoint " + folder.string() + " --prompt hello");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "tokenizer.json: top level: missing \"model\"") &&
              contains(r.output, "--prompt-ids")) << r.output;

  // The expected greedy continuation, from the model's logits in this process.
  const std::vector<int32_t> prompt = {3, 5, 7};
  std::vector<int32_t> want = prompt;
  {
    longtron::train::LoadedModel m = longtron::train::load_model_dir(folder);
    const auto engine = longtron::train::load_into_engine(
        m, longtron::parallel::make_grid(longtron::comm::make_local_communicator(),
                                         longtron::parallel::Layout{}));
    for (int i = 0; i < 6; ++i) {
      const auto logits = engine->model().logits_last(want);
      want.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
  }
  const auto ids_of = [](const std::string& out) {  // the line of comma-separated ids
    std::vector<int32_t> ids;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line.find_first_not_of("0123456789,") != std::string::npos) continue;
      std::istringstream in(line);
      for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoi(item));
    }
    return ids;
  };
  const std::string gen =
      "generate --checkpoint " + folder.string() + " --prompt-ids 3,5,7 --max-new-tokens 6";
  r = run_longtron(gen);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(ids_of(r.output), want) << r.output;
  EXPECT_TRUE(contains(r.output, "generate: 3 prompt tokens, 6 new")) << r.output;

  // eos_token_id = the third new token: the output ends before its first occurrence.
  json cfg = json::parse(read_file(folder / "config.json"));
  cfg["eos_token_id"] = json::array({1000, want[5]});
  write_file(folder / "config.json", cfg.dump(2));
  r = run_longtron(gen);
  ASSERT_EQ(r.status, 0) << r.output;
  size_t stop = prompt.size();
  while (want[stop] != want[5]) ++stop;
  EXPECT_EQ(ids_of(r.output), std::vector<int32_t>(want.begin(), want.begin() + long(stop)))
      << r.output;

  // generation_config.json's eos_token_id (Transformers' GenerationConfig) stops it too: the
  // first new token there, nothing is generated.
  write_file(folder / "generation_config.json",
             json({{"eos_token_id", json::array({want[3], 1001})}}).dump(2));
  r = run_longtron(gen);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(ids_of(r.output), prompt) << r.output;
  EXPECT_TRUE(contains(r.output, "generate: 3 prompt tokens, 0 new")) << r.output;
  std::filesystem::remove(folder / "generation_config.json");

  r = run_longtron("generate --checkpoint " + folder.string() + " --prompt-ids 3,x,7");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "\"x\" is not a token id")) << r.output;
  r = run_longtron("generate --checkpoint " + folder.string() + " --prompt-ids 3,32");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "token id 32 is outside the vocabulary [0, 32)")) << r.output;
  r = run_longtron("generate --checkpoint " + folder.string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--prompt or --prompt-ids is required")) << r.output;
  // An empty list is an error of its own, not a fall-back to an empty text prompt.
  r = run_longtron("generate --checkpoint " + folder.string() + " --prompt-ids ''");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--prompt-ids \"\": \"\" is not a token id")) << r.output;
}

}  // namespace
