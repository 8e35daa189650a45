// model.dtype end to end: a bf16 training run's start-up lines and metrics rows, `eval` and
// `generate` in the run's dtype unless --dtype says otherwise, and the CPU-feature mask making
// "auto" fall back to float32 and an explicit bfloat16 an error (exit status 1).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::Prepared;
using longtron::testing::read_file;
using longtron::testing::run_command;
using longtron::testing::run_longtron;

namespace {

bool native_bf16() {
  return longtron::ops::cpu_has_avx512_bf16() && longtron::ops::gemm_backend().native_bf16;
}

/// `longtron ARGS` with the CPU's AVX512-BF16 hidden.
longtron::testing::CommandResult without_bf16(const std::string& args) {
  return run_command(std::string("LONGTRON_CPU_FEATURES_MASK=avx512_bf16 ") + LONGTRON_BINARY +
                     " " + args);
}

double json_loss(const std::string& output) { return nlohmann::json::parse(output)["loss"].get<double>(); }

}  // namespace

TEST(DtypeCli, Bf16RunEvalAndGenerateInTheRunsDtype) {
  if (!native_bf16()) GTEST_SKIP() << "this CPU has no native bf16";
  Prepared p;
  auto r = run_longtron("train" + p.config() + " --set model.dtype=auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtype bfloat16 (auto: this CPU has AVX512-BF16)")) << r.output;
  EXPECT_TRUE(contains(r.output, "train: GEMM oneDNN ") && contains(r.output, "; mfu against bf16") &&
              contains(r.output, "(against the measured bf16 GEMM speed)")) << r.output;
  double last_valid = 0;
  int rows = 0;
  std::istringstream in(read_file(p.dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("valid_loss")) last_valid = j["valid_loss"].get<double>();
    if (!j.contains("loss")) continue;
    EXPECT_EQ(j["dtype"], "bfloat16") << line;
    ++rows;
  }
  EXPECT_EQ(rows, 6);
  const std::string eval = "eval --json --checkpoint " + (p.dir / "ckpt").string() + " --data " +
                           (p.dir / "data" / "valid").string();
  r = run_longtron(eval);
  ASSERT_EQ(r.status, 0) << r.output;
  const double bf16 = json_loss(r.output);
  EXPECT_NEAR(bf16, last_valid, 1e-6);  // the run validated in bf16 too
  r = run_longtron(eval + " --dtype float32");
  ASSERT_EQ(r.status, 0) << r.output;
  const double fp32 = json_loss(r.output);
  EXPECT_NE(fp32, bf16);
  EXPECT_NEAR(fp32, bf16, 1e-2 * bf16);
  // Without AVX512-BF16 the run's "auto" resolves to float32 for eval as well.
  r = without_bf16(eval);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json_loss(r.output), fp32);
  r = without_bf16(eval + " --dtype bfloat16");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--dtype: \"bfloat16\" needs native bf16") &&
              contains(r.output, "AVX512-BF16 (avx512_bf16")) << r.output;
  r = run_longtron(eval + " --dtype half");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--dtype: \"half\" is not one of")) << r.output;
  r = run_longtron("generate --checkpoint " + (p.dir / "ckpt").string() +
                   " --prompt \"the state of\" --max-new-tokens 4 --dtype bfloat16");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the state of")) << r.output;
}

TEST(DtypeCli, WithoutAvx512Bf16AutoTrainsInFloat32AndBfloat16IsAnError) {
  Prepared p;
  auto r = without_bf16("train" + p.config() + " --set model.dtype=auto --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtype float32 (auto: this CPU lacks AVX512-BF16")) << r.output;
  EXPECT_TRUE(contains(r.output, "; mfu against fp32")) << r.output;
  r = without_bf16("train" + p.config() + " --overwrite --set model.dtype=\"torch.bfloat16\"");
  EXPECT_EQ(r.status, 1) << r.output;
  // The CPU's own AVX512-BF16 is named as hidden; on a CPU without it, as missing.
  const std::string missing = longtron::ops::cpu_reports("avx512_bf16")
                                  ? "AVX512-BF16 (avx512_bf16, hidden by LONGTRON_CPU_FEATURES_MASK)"
                                  : "AVX512-BF16 (avx512_bf16)";
  EXPECT_TRUE(contains(r.output, "--set model.dtype=torch.bfloat16: \"bfloat16\" needs native bf16") &&
              contains(r.output, missing))
      << r.output;
}

// With AVX-512 hidden (or absent) the kernels and oneDNN run their AVX2 code, the start-up line
// says so, and the run trains; where the CPU has AVX-512 and nothing is hidden, it is used.
TEST(DtypeCli, AvxMaskChoosesTheKernelsAndOneDnnIsa) {
  Prepared p;
  auto r = run_command(std::string("LONGTRON_CPU_FEATURES_MASK=avx512f ") + LONGTRON_BINARY +
                       " train" + p.config() + " --set model.dtype=auto --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "train: GEMM oneDNN ") && contains(r.output, " (avx2): fp32"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "train: kernels: fp32 attention, tiles, rounding avx2; bf16 "
                                 "attention: none")) << r.output;
  EXPECT_TRUE(contains(r.output, "dtype float32 (auto: this CPU lacks AVX512-BF16")) << r.output;
  if (longtron::ops::kernel_isa() != longtron::ops::KernelIsa::kAvx512) return;
  r = run_longtron("train" + p.config() + " --overwrite --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "train: kernels: fp32 attention, tiles, rounding avx512")) << r.output;
}

// A dry run says which dtype it planned for; an explicit bfloat16 is planned (for another
// machine) even where this CPU could not train it, and says so.
TEST(DtypeCli, DryRunNamesThePlannedDtypeAndWhetherThisCpuCouldTrainIt) {
  Prepared p;
  auto r = without_bf16("train" + p.config() + " --dry-run --set model.dtype=bfloat16");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtype: bfloat16 (planned as given; this CPU could not train it: "
                                 "model.dtype: \"bfloat16\" needs native bf16")) << r.output;
  r = without_bf16("train" + p.config() + " --dry-run --set model.dtype=auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtype: float32 (auto: this CPU lacks AVX512-BF16")) << r.output;
  r = run_longtron("train" + p.config() + " --dry-run --set model.dtype=float32");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtype: float32\n")) << r.output;
}
