// The trainer on a tiny model and tiny generated datasets: the loss falls, resume is exact, the
// step loss reductions, --dump-grads against finite differences, bf16 / sharded --init-from.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../test_util.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/megatron.h"
#include "data/open.h"
#include "model/hf_config.h"
#include "modes/engine.h"
#include "ops/ops.h"
#include "parallel/layout.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace longtron;
using longtron::testing::quiet;
using longtron::testing::TempDir;
using longtron::testing::train_run;

namespace {

/// The arithmetic-run corpus (trainer_fixture.h) with documents of 8 … 47 tokens.
void write_dataset(const fs::path& dir, int documents, uint32_t seed) {
  longtron::testing::write_arithmetic_dataset(dir, documents, seed, 40);
}

std::string tiny_toml(const fs::path& root) {
  return "[model]\nvocab_size = 64\nhidden_size = 32\nnum_layers = 2\nnum_attention_heads = 4\n"
         "num_kv_attention_heads = 2\nmultiple_of = 32\n"
         "[data]\ntrain_folder = \"" + (root / "train").string() + "\"\nvalid_folder = \"" +
         (root / "valid").string() + "\"\nseq_len = 32\nmicro_bsz = 2\nmicro_num = 2\n"
         "[optimizer]\nlr = 1e-2\n[lr_scheduler]\nwarmup_steps = 2\n"
         "[train]\ntotal_steps = 30\nnum_threads = 1\n";
}

struct Tiny {
  TempDir dir;
  Tiny() {
    write_dataset(dir / "train", 300, 1);
    write_dataset(dir / "valid", 20, 2);
  }
  train::TrainConfig config(const std::vector<std::string>& overrides = {}) const {
    return train::parse_config(tiny_toml(dir.path()), "tiny.toml", overrides);
  }
};

TEST(Trainer, LossFallsAndValidRowsAtStartEveryAndEnd) {
  Tiny t;
  auto c = t.config({"train.valid_every=10", "train.metrics_file=\"" + (t.dir / "m.jsonl").string() + "\""});
  const auto s = train_run(c, quiet());
  ASSERT_EQ(s.losses.size(), 30u);
  EXPECT_NEAR(s.losses.front(), std::log(64.0), 0.3);  // init std 0.02: near uniform
  double last = 0;
  for (size_t i = 25; i < 30; ++i) last += s.losses[i] / 5;
  EXPECT_LT(last, s.losses.front() - 1.5);
  ASSERT_EQ(s.valid.size(), 4u);  // steps 0, 10, 20, 30
  EXPECT_EQ(s.valid[0].first, 0);
  EXPECT_EQ(s.valid[3].first, 30);
  EXPECT_LT(s.valid[3].second, s.valid[0].second - 1.5);
  // The loss picture next to the metrics file (SVG, or PNG once the plot moves to raster).
  EXPECT_TRUE(fs::exists(t.dir / "m.svg") || fs::exists(t.dir / "m.png"));
  // Rows carry the GEMM precision; the start-up GEMM rates (MFU denominators) were measured.
  EXPECT_EQ(s.dtype, "float32");
  for (const auto& r : s.rows) EXPECT_EQ(r.dtype, "float32");
  EXPECT_GT(s.sgemm_flops, 0);
  if (longtron::ops::gemm_backend().native_bf16) {
    EXPECT_GT(s.bf16_gemm_flops, 0);
  }
}

TEST(Trainer, ResumeGivesTheLossesOfAnUninterruptedRun) {
  Tiny t;
  const std::string a = (t.dir / "a").string(), b = (t.dir / "b").string();
  auto full = train_run(t.config({"train.total_steps=8", "train.save_every=3",
                                  "train.checkpoint_dir=\"" + a + "\""}), quiet());
  ASSERT_TRUE(fs::exists(fs::path(a) / "step_3" / "optimizer.safetensors"));
  auto o = quiet();
  o.resume = fs::path(a) / "step_3";
  auto c = t.config({"train.total_steps=8", "train.checkpoint_dir=\"" + b + "\""});
  auto resumed = train_run(c, o);
  EXPECT_EQ(resumed.start_step, 3);
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(resumed.losses[i], full.losses[3 + i]) << "step " << i + 4;
  // A second resume from the root (latest = step_8) has nothing left to do.
  o.resume = b;
  EXPECT_EQ(train_run(c, o).losses.size(), 0u);
}

TEST(Trainer, StepLossReductionsHandChecked) {
  // Two micro-batches: (sum 3, count 1) and (sum 3, count 3).
  const std::vector<model::LossSum> micro = {{3.0, 1}, {3.0, 3}};
  EXPECT_DOUBLE_EQ(train::combine_step_loss(micro, train::LossReduction::kToken), 6.0 / 4.0);
  EXPECT_DOUBLE_EQ(train::combine_step_loss(micro, train::LossReduction::kMicroMean), (3.0 + 1.0) / 2.0);
  // Gradient scales: token → 1/Σcount for every micro-batch; micro_mean → 1/(micro_num·dp·count).
  EXPECT_DOUBLE_EQ(train::micro_loss_scale(train::LossReduction::kToken, 1, 4, 2, 1), 0.25);
  EXPECT_DOUBLE_EQ(train::micro_loss_scale(train::LossReduction::kMicroMean, 1, 4, 2, 1), 0.5);
  EXPECT_DOUBLE_EQ(train::micro_loss_scale(train::LossReduction::kMicroMean, 3, 4, 2, 1), 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(train::micro_loss_scale(train::LossReduction::kMicroMean, 3, 4, 2, 2), 1.0 / 12.0);
  EXPECT_DOUBLE_EQ(train::micro_loss_scale(train::LossReduction::kToken, 0, 0, 2, 1), 0.0);
}

TEST(Trainer, MicroMeanStepLossIsTheMeanOfMicroBatchMeans) {
  Tiny t;
  auto c = t.config({"train.total_steps=1", "lr_scheduler.warmup_steps=0", "train.loss_reduction=micro_mean"});
  const auto s = train_run(c, quiet());
  // Recompute step 1's loss from the same initial model and batches.
  model::ParamTable layout(c.model);
  model::Params<float> params(layout);
  model::init_params(params, static_cast<uint64_t>(c.train.seed));
  model::Decoder<float> m(layout, params);
  data::BatchLoader loader(data::open_dataset(c.data.train_folder), train::loader_config(c), 1);
  std::vector<model::LossSum> micro;
  for (const auto& b : loader.step(0, 0)) micro.push_back(m.forward_loss(b));
  ASSERT_EQ(micro.size(), 2u);
  EXPECT_NE(micro[0].count, micro[1].count);  // otherwise both reductions agree
  EXPECT_NEAR(s.losses[0], train::combine_step_loss(micro, train::LossReduction::kMicroMean), 1e-6);
  EXPECT_GT(std::abs(s.losses[0] - train::combine_step_loss(micro, train::LossReduction::kToken)), 1e-7);
}

/// The step loss of step 1 (token-weighted) at `params`.
double step_loss(model::Decoder<float>& m, const std::vector<data::MicroBatch>& batches) {
  std::vector<model::LossSum> micro;
  for (const auto& b : batches) micro.push_back(m.forward_loss(b));
  return train::combine_step_loss(micro, train::LossReduction::kToken);
}

TEST(Trainer, DumpGradsMatchesFiniteDifferencesOfTheStepLoss) {
  Tiny t;
  auto c = t.config({"train.total_steps=1", "lr_scheduler.warmup_steps=0"});
  auto o = quiet();
  o.dump_grads = t.dir / "grads";
  train_run(c, o);
  safetensors::Reader grads(o.dump_grads);
  model::ParamTable layout(c.model);
  model::Params<float> params(layout);
  model::init_params(params, static_cast<uint64_t>(c.train.seed));
  model::Decoder<float> m(layout, params);
  data::BatchLoader loader(data::open_dataset(c.data.train_folder), train::loader_config(c), 1);
  const auto batches = loader.step(0, 0);
  for (const char* name : {"output.weight", "model.layers.0.attention.wqkv.weight",
                           "model.layers.1.feed_forward.w2.weight", "model.norm.weight"}) {
    const auto& view = layout.at(name);
    std::vector<float> g(static_cast<size_t>(view.numel));
    grads.read_floats(name, view.shape, g.data());
    // The entry with the largest gradient: the best-conditioned finite difference in float.
    const auto k = static_cast<size_t>(std::max_element(g.begin(), g.end(), [](float a, float b) {
                     return std::abs(a) < std::abs(b);
                   }) - g.begin());
    float* p = params.get(name) + k;
    const float saved = *p, eps = 1e-2f;
    *p = saved + eps;
    const double up = step_loss(m, batches);
    *p = saved - eps;
    const double down = step_loss(m, batches);
    *p = saved;
    const double fd = (up - down) / (2.0 * eps);
    EXPECT_NEAR(g[k], fd, 1e-2 * std::abs(fd) + 1e-5) << name << "[" << k << "]";
  }
}

TEST(Trainer, InitFromBf16AndShardedFolders) {
  Tiny t;
  auto c = t.config({"train.total_steps=1", "lr_scheduler.warmup_steps=0"});
  // An HF folder: config.json + bf16 weights in shards of at most 8 KiB.
  model::ParamTable layout(c.model);
  model::Params<float> params(layout);
  model::init_params(params, 77);
  const fs::path hf = t.dir / "hf";
  fs::create_directories(hf);
  model::write_hf_config(hf / "config.json", c.model);
  std::vector<safetensors::WriteTensor> tensors;
  for (const auto& v : layout.views())
    tensors.push_back({v.name, v.shape, safetensors::DType::BF16, params.get(v.name), nullptr});
  ASSERT_GT(safetensors::write_sharded(hf, tensors, 8192), 1);
  // The model the folder holds: every weight rounded to bf16.
  for (int64_t i = 0; i < params.numel(); ++i)
    params.data()[i] = safetensors::bf16_to_float(safetensors::float_to_bf16(params.data()[i]));
  // Scored by a dense engine (one process) holding those weights.
  const parallel::Grid grid = parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
  parallel::ParallelEngine engine(c.model, grid, params);
  data::Dataset valid = data::open_dataset(c.data.valid_folder);
  data::DatasetRows rows(valid, train::loader_config(c).pack, 0, false, static_cast<uint32_t>(c.data.seed));
  const model::LossSum expected = train::evaluate_rows(engine, rows);

  auto o = quiet();
  o.init_from = hf;
  // Shape keys from config.json: a config without them works, one that disagrees names the key.
  train::resolve_model_config(c, o);
  const auto s = train_run(c, o);
  ASSERT_FALSE(s.valid.empty());
  EXPECT_DOUBLE_EQ(s.valid[0].second, expected.sum / static_cast<double>(expected.count));

  auto bad = t.config({"model.hidden_size=64", "train.total_steps=1", "lr_scheduler.warmup_steps=0"});
  try {
    train::resolve_model_config(bad, o);
    FAIL() << "disagreeing model.hidden_size accepted";
  } catch (const longtron::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
}

}  // namespace
