// Preference training through the trainer under [lora]: from a base model (ten full steps on
// arithmetic runs, saved), DPO on pairs whose chosen answer continues the run and whose rejected
// one does not; the reference is the base (adapters off), so the first loss is log 2 (B starts at
// 0); --resume continues with the losses of an uninterrupted run (the reference needs no state);
// over 60 steps the adapters come to prefer the continuation (reward accuracy > 0.8 on the last
// 20 steps' pairs); a full fine-tuning run refuses --resume with a reference-based loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "data/preference_pairs.h"
#include "expect_error.h"
#include "test_util.h"
#include "train/config.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace longtron {
namespace {
namespace fs = std::filesystem;

/// 96 pairs: a prompt of 3–6 terms of an arithmetic run (ids 2…61), chosen = its next 3 terms,
/// rejected = 3 random ids.
void write_pairs(const fs::path& dir) {
  fs::create_directories(dir);
  std::mt19937 rng(4);
  std::vector<data::PairIds> pairs;
  for (int p = 0; p < 96; ++p) {
    const int start = int(rng() % 60), stride = 1 + int(rng() % 3), n = 3 + int(rng() % 4);
    data::PairIds ids;
    for (int i = 0; i < n + 3; ++i) (i < n ? ids.prompt : ids.chosen).push_back(2 + (start + i * stride) % 60);
    for (int i = 0; i < 3; ++i) ids.rejected.push_back(2 + int(rng() % 60));
    pairs.push_back(ids);
  }
  data::write_preference_pairs(dir / "pairs.jsonl", pairs);
}

std::string toml(const fs::path& data) {
  return "[model]\nvocab_size = 64\nhidden_size = 32\nnum_layers = 2\nnum_attention_heads = 4\n"
         "num_kv_attention_heads = 2\nmultiple_of = 32\n[data]\ntrain_folder = \"" +
         data.string() + "\"\nseq_len = 16\nmicro_bsz = 2\nmicro_num = 2\n[optimizer]\nlr = 1e-2\n"
         "[train]\ntotal_steps = 4\nnum_threads = 1\n";
}

TEST(PreferenceTrainer, LoraReferenceIsTheBaseAndResumeContinues) {
  testing::TempDir dir;
  testing::write_arithmetic_dataset(dir / "runs", 200, 1, 20);
  write_pairs(dir / "pairs");
  train::TrainConfig base_config = train::parse_config(
      toml(dir / "runs"), "base.toml",
      {"train.total_steps=10", "train.checkpoint_dir=\"" + (dir / "base").string() + "\""});
  testing::train_run(base_config, testing::quiet());
  const fs::path base = dir / "base" / "step_10";
  const fs::path ck = dir / "ck";
  const std::vector<std::string> keys = {"lora.rank=4", "lora.alpha=8.0", "train.save_every=2",
                                         "train.checkpoint_dir=\"" + ck.string() + "\""};
  const auto run = [&](train::TrainOptions o) {
    train::TrainConfig c = train::parse_config(toml(dir / "pairs"), "dpo.toml", keys);
    train::resolve_model_config(c, o);
    return testing::train_run(c, o);
  };
  train::TrainOptions o = testing::quiet();
  o.init_from = base;
  const train::TrainSummary whole = run(o);
  ASSERT_EQ(whole.losses.size(), 4u);
  EXPECT_NEAR(whole.losses[0], std::log(2.0), 1e-6);  // B = 0: the policy is the base
  ASSERT_TRUE(whole.rows[3].preference);
  train::TrainOptions r = testing::quiet();
  r.resume = ck / "step_2";
  const train::TrainSummary rest = run(r);
  ASSERT_EQ(rest.losses.size(), 2u);
  EXPECT_NEAR(rest.losses[0], whole.losses[2], 1e-6 * whole.losses[2]);
  EXPECT_NEAR(rest.losses[1], whole.losses[3], 1e-6 * whole.losses[3]);
  // Longer (no checkpoints): the adapters learn to prefer the run's continuation. (With a much
  // higher lr, 3e-2, the adapters wreck the base's arithmetic and the chosen log-probs fall faster
  // than the random rejected ones: DPO's known failure, not a wrong gradient.)
  {
    train::TrainConfig c = train::parse_config(toml(dir / "pairs"), "learn.toml",
                                               {"lora.rank=4", "lora.alpha=8.0",
                                                "train.total_steps=60", "optimizer.lr=2e-3"});
    train::resolve_model_config(c, o);
    const train::TrainSummary learn = testing::train_run(c, o);
    double accuracy = 0, margin = 0;
    for (size_t i = 40; i < 60; ++i)
      accuracy += learn.rows[i].reward_accuracy / 20, margin += learn.rows[i].reward_margin / 20;
    std::printf("[preference-trainer] steps 41-60: reward_accuracy %.3f, reward_margin %.4f\n",
                accuracy, margin);
    EXPECT_GT(accuracy, 0.8);
    EXPECT_GT(margin, 0.0);
  }
  // Full fine-tuning: its reference is the starting weights, which a checkpoint does not hold.
  train::TrainConfig full = train::parse_config(
      toml(dir / "pairs"), "full.toml",
      {"train.checkpoint_dir=\"" + (dir / "full").string() + "\"", "train.total_steps=2"});
  testing::train_run(full, testing::quiet());
  train::TrainOptions fr = testing::quiet();
  fr.resume = dir / "full" / "step_2";
  full.train.total_steps = 3;
  testing::expect_error([&] { testing::train_run(full, fr); },
                        {"--resume", "preference", "sigmoid", "reference"});
}

}  // namespace
}  // namespace longtron
