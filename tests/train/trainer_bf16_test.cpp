// The trainer with model.dtype: a bf16 run's first step against fp32 (loss and gradients), its rows
// and start-up rates, exact resume of a bf16 run with fp32 checkpoints, eval's and generate's dtype
// taken from the run, and "auto"/"bfloat16" on a CPU without AVX512-BF16 (played through the
// CPU-feature mask).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>

#include "../test_util.h"
#include "bf16_here.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/megatron.h"
#include "model/hf_names.h"
#include "model/params.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "train/config.h"
#include "train/model_io.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace longtron;
using longtron::testing::quiet;
using longtron::testing::TempDir;
using longtron::testing::train_run;

namespace {

/// The arithmetic-run corpus (trainer_fixture.h) with documents of 8 … 127 tokens.
void write_dataset(const fs::path& dir, int documents, uint32_t seed) {
  longtron::testing::write_arithmetic_dataset(dir, documents, seed, 120);
}

/// A small model wide enough for bf16's rounding to average out as it does at real sizes.
struct Small {
  TempDir dir;
  Small() { write_dataset(dir / "train", 200, 1); }
  train::TrainConfig config(const std::vector<std::string>& overrides = {}) const {
    const std::string toml =
        "[model]\nvocab_size = 64\nhidden_size = 128\nnum_layers = 2\nnum_attention_heads = 4\n"
        "num_kv_attention_heads = 2\nmultiple_of = 64\n"
        "[data]\ntrain_folder = \"" + (dir / "train").string() + "\"\nseq_len = 128\n"
        "micro_bsz = 2\nmicro_num = 2\n[optimizer]\nlr = 3e-3\n[lr_scheduler]\nwarmup_steps = 1\n"
        "[train]\ntotal_steps = 6\nnum_threads = 1\n";
    return train::parse_config(toml, "small.toml", overrides);
  }
};

bool native_bf16() { return ops::cpu_has_avx512_bf16() && ops::gemm_backend().native_bf16; }

/// Sets the CPU-feature mask for the scope's lifetime.
class MaskedFeatures {
 public:
  explicit MaskedFeatures(const char* value) { setenv(ops::kCpuFeaturesMaskEnv, value, 1); }
  ~MaskedFeatures() { unsetenv(ops::kCpuFeaturesMaskEnv); }
};

/// Every tensor of `dir` (--dump-grads), by the family's names (model/hf_names.h), in order.
std::vector<float> read_all(const fs::path& dir, const model::ParamTable& layout) {
  safetensors::Reader r(dir);
  std::vector<float> all;
  for (const auto& t : model::hf_tensors(layout)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> g(static_cast<size_t>(n));
    r.read_floats(t.name, t.shape, g.data());
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

}  // namespace

TEST(TrainerBf16, ConfigSpellingsAndBadValue) {
  Small s;
  EXPECT_EQ(s.config().model.dtype, "float32");
  EXPECT_EQ(s.config({"model.dtype=torch.bfloat16"}).model.dtype, "bfloat16");
  EXPECT_EQ(s.config({"model.dtype=\"torch.float32\""}).model.dtype, "float32");
  EXPECT_EQ(s.config({"model.dtype=auto"}).model.dtype, "auto");
  EXPECT_EQ(train::to_json(s.config({"model.dtype=bfloat16"}))["model"]["dtype"], "bfloat16");
  try {
    s.config({"model.dtype=float16"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--set model.dtype=float16: \"float16\" is not one of"),
              std::string::npos) << e.what();
  }
}

// Mixed precision's contract: the first step's loss within 1e-3 relative and its gradients within
// 2e-2 relative (‖g_bf16 − g_fp32‖ / ‖g_fp32‖) of the fp32 run on the same batch and weights; for
// InternLM2 and for Qwen3 (its q/k norms run in fp32 between the bf16 GEMMs).
TEST(TrainerBf16, FirstStepLossAndGradientsNearFp32) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Small s;
  for (const std::string type : {"internlm2", "qwen3"}) {
    const std::string type_key = "model.type=\"" + type + "\"";
    train::TrainSummary runs[2];
    std::vector<float> grads[2];
    const char* dtypes[2] = {"float32", "bfloat16"};
    const model::ParamTable layout(s.config({type_key}).model);
    for (int k = 0; k < 2; ++k) {
      auto o = quiet();
      o.dump_grads = s.dir / (type + "_" + dtypes[k]);
      runs[k] = train_run(
          s.config({"train.total_steps=1", std::string("model.dtype=") + dtypes[k], type_key}), o);
      grads[k] = read_all(o.dump_grads, layout);
    }
    EXPECT_EQ(runs[0].dtype, "float32");
    EXPECT_EQ(runs[1].dtype, "bfloat16");
    EXPECT_EQ(runs[1].rows.at(0).dtype, "bfloat16");
    const double loss_rel = std::abs(runs[1].losses[0] - runs[0].losses[0]) / runs[0].losses[0];
    double diff = 0, norm = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      diff += std::pow(double(grads[1][i]) - grads[0][i], 2);
      norm += std::pow(double(grads[0][i]), 2);
    }
    const double grad_rel = std::sqrt(diff / norm);
    std::printf("[bf16 vs fp32] %s: step-1 loss %.6f vs %.6f (rel %.2e), gradients rel %.2e\n",
                type.c_str(), runs[1].losses[0], runs[0].losses[0], loss_rel, grad_rel);
    EXPECT_LT(loss_rel, 1e-3) << type;
    EXPECT_LT(grad_rel, 2e-2) << type;
    EXPECT_GT(grad_rel, 1e-5) << type << ": the bf16 run computed in fp32";
  }
}

// A resumed bf16 run reproduces the uninterrupted one exactly (the bf16 copies are made from the
// fp32 master weights, which the checkpoint holds in fp32).
TEST(TrainerBf16, ResumeGivesTheLossesOfAnUninterruptedRun) {
  std::optional<longtron::testing::Bf16Here> bf16_here(std::in_place);
  if (!bf16_here->runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Small s;
  const std::string a = (s.dir / "a").string(), b = (s.dir / "b").string();
  const auto full = train_run(s.config({"model.dtype=bfloat16", "train.save_every=2",
                                        "train.checkpoint_dir=\"" + a + "\""}), quiet());
  safetensors::Reader weights(fs::path(a) / "step_2");
  EXPECT_EQ(weights.info("output.weight").dtype, safetensors::DType::F32);
  auto o = quiet();
  o.resume = fs::path(a) / "step_2";
  const auto resumed =
      train_run(s.config({"model.dtype=bfloat16", "train.checkpoint_dir=\"" + b + "\""}), o);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(resumed.losses[i], full.losses[2 + i]) << "step " << i + 3;
  // eval and generate compute in the run's dtype unless --dtype says otherwise.
  const train::LoadedModel m = train::load_model_dir(b);
  EXPECT_EQ(train::loaded_compute_type(m, ""), ops::ComputeType::kBFloat16);
  EXPECT_EQ(train::loaded_compute_type(m, "float32"), ops::ComputeType::kFloat32);
  bf16_here.reset();  // the user's rule again
  MaskedFeatures mask("avx512_bf16");
  try {
    train::loaded_compute_type(m, "");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state.json: config.model.dtype (the run's dtype; --dtype overrides it): \"bfloat16\" needs"),
              std::string::npos) << e.what();
  }
}

TEST(TrainerBf16, AutoChoosesBf16WhereTheCpuHasIt) {
  if (!native_bf16()) GTEST_SKIP() << "this CPU has no native bf16";
  Small s;
  const auto r = train_run(s.config({"model.dtype=auto", "train.total_steps=1"}), quiet());
  EXPECT_EQ(r.dtype, "bfloat16");
  EXPECT_GT(r.bf16_gemm_flops, 0);
  EXPECT_EQ(r.rows.at(0).dtype, "bfloat16");
}

TEST(TrainerBf16, WithoutAvx512Bf16AutoIsFloat32AndBfloat16AnError) {
  Small s;
  MaskedFeatures mask("avx512_bf16");
  const auto r = train_run(s.config({"model.dtype=auto", "train.total_steps=1"}), quiet());
  EXPECT_EQ(r.dtype, "float32");
  EXPECT_EQ(r.rows.at(0).dtype, "float32");
  try {
    train_run(s.config({"model.dtype=torch.bfloat16", "train.total_steps=1"}), quiet());
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--set model.dtype=torch.bfloat16: \"bfloat16\" needs native bf16"),
              std::string::npos) << m;
    EXPECT_NE(m.find("AVX512-BF16 (avx512_bf16"), std::string::npos) << m;
  }
}
