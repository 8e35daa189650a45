// LoRA training through the trainer (docs/lora.md): a frozen base from --init-from, adapters only
// in the optimizer, PEFT step folders, --resume giving the losses of an uninterrupted run,
// --init-adapter, --dump-grads by PEFT names, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "bf16_here.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "expect_error.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/peft.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace longtron {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

std::string toml(const fs::path& root, const std::string& type) {
  return "[model]\ntype = \"" + type + "\"\nvocab_size = 64\nhidden_size = 32\nnum_layers = 2\n"
         "num_attention_heads = 4\nnum_kv_attention_heads = 2\nmultiple_of = 32\n"
         "[data]\ntrain_folder = \"" + (root / "train").string() + "\"\nseq_len = 32\n"
         "micro_bsz = 2\nmicro_num = 2\n"
         "[optimizer]\nlr = 1e-2\n[lr_scheduler]\nwarmup_steps = 1\n"
         "[train]\ntotal_steps = 2\nnum_threads = 1\n";
}

/// A base model (30 full fine-tuning steps from a drawn model, saved as a step folder) and data.
struct Base {
  TempDir dir;
  std::string type;
  fs::path base;
  explicit Base(const std::string& family) : type(family) {
    testing::write_arithmetic_dataset(dir / "train", 200, 1, 40);
    train::TrainConfig c = config({"train.checkpoint_dir=\"" + (dir / "base").string() + "\"",
                                   "train.total_steps=30"});
    testing::train_run(c, testing::quiet());
    base = dir / "base" / "step_30";
  }
  train::TrainConfig config(const std::vector<std::string>& overrides) const {
    return train::parse_config(toml(dir.path(), type), "lora.toml", overrides);
  }
  /// A run from the base (or resumed), config resolved as the CLI does.
  train::TrainSummary run(const std::vector<std::string>& overrides, train::TrainOptions o,
                          bool from_base = true) const {
    if (from_base && o.resume.empty()) o.init_from = base;
    train::TrainConfig c = config(overrides);
    train::resolve_model_config(c, o);
    return testing::train_run(c, o);
  }
};

const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=8.0", "train.total_steps=4"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(LoraTrainer, FirstLossIsTheBaseLossAndAdaptersLearn) {
  Base b("llama");
  // B starts at zero: the first step's loss is the frozen base's (a full fine-tune's first loss).
  const train::TrainSummary full = b.run({"train.total_steps=1"}, testing::quiet());
  const train::TrainSummary lora =
      b.run(with(kLora, {"train.total_steps=40", "optimizer.lr=3e-2"}), testing::quiet());
  ASSERT_EQ(lora.losses.size(), 40u);
  EXPECT_NEAR(lora.losses[0], full.losses[0], 1e-6 * full.losses[0]);
  // The same batches with the adapters held still (lr ≈ 0): the trained adapters do better.
  const train::TrainSummary still = b.run(
      with(kLora, {"train.total_steps=40", "optimizer.lr=1e-12"}), testing::quiet());
  double gain = 0;
  for (size_t i = 30; i < 40; ++i) gain += still.losses[i] - lora.losses[i];
  EXPECT_GT(gain / 10, 0.05);
  // Only the adapters train: their gradient norm differs from the full model's.
  EXPECT_NE(lora.grad_norms[0], full.grad_norms[0]);
  for (double g : lora.grad_norms) EXPECT_TRUE(std::isfinite(g) && g > 0);
}

TEST(LoraTrainer, ResumeGivesTheUninterruptedLossesAndStepFolderIsPeft) {
  Base b("internlm2");
  const std::vector<std::string> keys = with(kLora, {"lora.dropout=0.1", "lora.seed=3"});
  const fs::path ck = b.dir / "ck";
  const auto save = with(keys, {"train.save_every=2", "train.checkpoint_dir=\"" + ck.string() + "\""});
  const train::TrainSummary whole = b.run(save, testing::quiet());
  const fs::path step2 = ck / "step_2";
  EXPECT_TRUE(fs::exists(step2 / train::kAdapterWeightsFile));
  EXPECT_TRUE(fs::exists(step2 / train::kAdapterConfigFile));
  EXPECT_TRUE(fs::exists(step2 / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(step2 / "model.safetensors"));  // the base is not re-saved
  const train::CheckpointState state = train::read_checkpoint_state(step2);
  EXPECT_EQ(state.extra["lora"]["base"].get<std::string>(), fs::absolute(b.base).lexically_normal().string());
  EXPECT_EQ(state.extra["lora"]["base_fingerprint"].get<std::string>(), train::base_fingerprint(b.base.string()));
  const train::PeftAdapter a = train::read_peft_adapter(step2.string());
  EXPECT_EQ(a.config.r, 4);
  ASSERT_EQ(a.modules.size(), 10u);  // 5 linears × 2 layers
  EXPECT_EQ(a.modules[0].module, "model.layers.0.attention.wqkv");
  train::TrainOptions o = testing::quiet();
  o.resume = step2;
  const train::TrainSummary rest = b.run(save, o);
  ASSERT_EQ(rest.losses.size(), 2u);
  EXPECT_NEAR(rest.losses[0], whole.losses[2], 1e-6 * whole.losses[2]);
  EXPECT_NEAR(rest.losses[1], whole.losses[3], 1e-6 * whole.losses[3]);
  // What defines the adapter may not change on resume: refused naming both values.
  testing::expect_error([&] { b.run(with(save, {"lora.alpha=16.0"}), o); },
                        {"adapter_config.json", "lora_alpha = 8", "lora.alpha = 16"});
  testing::expect_error([&] { b.run(with(save, {"lora.rank=2"}), o); },
                        {"adapter_config.json", "r = 4", "lora.rank = 2"});
  testing::expect_error([&] { b.run(with(save, {"lora.use_rslora=true"}), o); },
                        {"adapter_config.json", "use_rslora = false", "lora.use_rslora = true"});
  testing::expect_error([&] { b.run(with(save, {"lora.targets=[\"wqkv\", \"wo\"]"}), o); },
                        {"adapter_config.json", "target_modules", "lora.targets = [wo, wqkv]"});
  // Dropout is a training setting (PEFT's resumed runs take the script's LoraConfig): it may
  // change, and the run continues from the saved adapter.
  const train::TrainSummary other = b.run(with(save, {"lora.dropout=0.3"}), o);
  ASSERT_EQ(other.losses.size(), 2u);
  EXPECT_NEAR(other.losses[0], whole.losses[2], 0.05 * whole.losses[2]);
  // Without [lora] (rank 0) the step folder, which holds no model, is refused as a LoRA one.
  testing::expect_error([&] { b.run(with(save, {"lora.rank=0"}), o); },
                        {step2.string(), "LoRA checkpoint", "lora.rank = 0", "--merge-lora"});
  // A moved base is refused naming the folder state.json records.
  const fs::path recorded = state.extra["lora"]["base"].get<std::string>();
  fs::rename(b.base, b.dir / "moved");
  testing::expect_error([&] { b.run(save, o); }, {recorded.string(), "does not exist"});
}

TEST(LoraTrainer, InitAdapterAndDumpGrads) {
  Base b("llama");
  const fs::path ck = b.dir / "ck";
  b.run(with(kLora, {"train.checkpoint_dir=\"" + ck.string() + "\""}), testing::quiet());
  // Starting from the saved adapter: the first loss is the saved run's loss after its updates,
  // not the base's.
  train::TrainOptions o = testing::quiet();
  o.init_adapter = ck / "step_4";
  o.dump_grads = b.dir / "grads";
  const train::TrainSummary again = b.run(with(kLora, {"train.total_steps=1"}), o);
  const train::TrainSummary fresh = b.run(with(kLora, {"train.total_steps=1"}), testing::quiet());
  EXPECT_NE(again.losses[0], fresh.losses[0]);
  const safetensors::Reader grads(b.dir / "grads" / train::kAdapterWeightsFile);
  const auto names = grads.names();
  EXPECT_EQ(names.size(), 2u * 7u * 2u);
  EXPECT_NE(std::find(names.begin(), names.end(),
                      "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"),
            names.end());
  // A LoRA step folder is not a model to start from.
  train::TrainOptions from_adapter = testing::quiet();
  from_adapter.init_from = ck / "step_4";
  for (const char* rank : {"lora.rank=0", "lora.rank=4"})
    testing::expect_error([&] { b.run(with(kLora, {rank, "train.total_steps=1"}), from_adapter, false); },
                          {(ck / "step_4").string(), "LoRA checkpoint", "--merge-lora", "--init-adapter"});
  // A disagreeing adapter_config.json is refused naming both values.
  testing::expect_error([&] { b.run(with(kLora, {"lora.rank=8", "train.total_steps=1"}), o); },
                        {"adapter_config.json", "r = 4", "lora.rank = 8"});
  testing::expect_error(
      [&] { b.run(with(kLora, {"lora.targets=[\"q_proj\"]", "train.total_steps=1"}), o); },
      {"target_modules", "lora.targets = [q_proj]"});
}

// A base held only in bf16 (2 bytes a parameter) under bf16 compute: the GEMMs read the same bf16
// weights as with an fp32 base rounded each step, and the embedding's rows, rounded in the bf16
// base, are rounded anyway as the first block's input (the bf16 residual stream starts from
// each block's input rounded to bf16), so the two runs give the same losses.
TEST(LoraTrainer, Bf16BaseAgreesWithFp32Base) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Base b("llama");
  const auto keys = with(kLora, {"model.dtype=\"bfloat16\"", "train.total_steps=3"});
  const train::TrainSummary fp32 = b.run(with(keys, {"lora.base_dtype=\"float32\""}), testing::quiet());
  const train::TrainSummary bf16 = b.run(with(keys, {"lora.base_dtype=\"bfloat16\""}), testing::quiet());
  const train::TrainSummary autodt = b.run(keys, testing::quiet());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 1e-3 * fp32.losses[i]) << i;
    EXPECT_EQ(autodt.losses[i], bf16.losses[i]) << i;  // auto: bf16 under bf16 compute
  }
  EXPECT_NEAR(bf16.grad_norms[0], fp32.grad_norms[0], 1e-2 * fp32.grad_norms[0]);
  EXPECT_EQ(bf16.losses[0], fp32.losses[0]);
}

TEST(LoraTrainer, Refusals) {
  Base b("llama");
  testing::expect_error([&] { b.run(kLora, testing::quiet(), /*from_base=*/false); },
                        {"lora.rank", "--init-from"});
  testing::expect_error([&] { b.run(with(kLora, {"lora.targets=[\"wqkv\"]"}), testing::quiet()); },
                        {"lora.targets", "'wqkv' is not a linear"});
  testing::expect_error([&] { b.run(with(kLora, {"lora.rank=-1"}), testing::quiet()); },
                        {"lora.rank", ">= 0"});
  testing::expect_error([&] { b.run(with(kLora, {"lora.dropout=1.0"}), testing::quiet()); },
                        {"lora.dropout", "[0, 1)"});
}

}  // namespace
}  // namespace longtron
