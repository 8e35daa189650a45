// model.dtype's resolution on this CPU: the spellings, "auto"'s choice, and the error of an explicit
// "bfloat16" without AVX512-BF16, the latter two played through the CPU-feature mask.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace ops = longtron::ops;

namespace {
/// Sets the feature mask for the test's lifetime (restoring the previous value).
class MaskedFeatures {
 public:
  explicit MaskedFeatures(const char* value) {
    if (const char* old = getenv(ops::kCpuFeaturesMaskEnv)) previous_ = old, had_ = true;
    setenv(ops::kCpuFeaturesMaskEnv, value, 1);
  }
  ~MaskedFeatures() {
    if (had_) setenv(ops::kCpuFeaturesMaskEnv, previous_.c_str(), 1);
    else unsetenv(ops::kCpuFeaturesMaskEnv);
  }

 private:
  std::string previous_;
  bool had_ = false;
};

bool native_here() {
  const char* old = getenv(ops::kCpuFeaturesMaskEnv);
  return old == nullptr && ops::cpu_has_avx512_bf16() && ops::gemm_backend().native_bf16;
}
}  // namespace

TEST(Precision, SpellingsAreCanonical) {
  EXPECT_EQ(ops::canonical_dtype("float32"), "float32");
  EXPECT_EQ(ops::canonical_dtype("torch.float32"), "float32");
  EXPECT_EQ(ops::canonical_dtype("bfloat16"), "bfloat16");
  EXPECT_EQ(ops::canonical_dtype("torch.bfloat16"), "bfloat16");
  EXPECT_EQ(ops::canonical_dtype("auto"), "auto");
  EXPECT_EQ(ops::canonical_dtype("bf16"), "");
  EXPECT_EQ(ops::canonical_dtype("torch.float16"), "");
  EXPECT_STREQ(ops::compute_type_name(ops::ComputeType::kBFloat16), "bfloat16");
  EXPECT_STREQ(ops::compute_type_name(ops::ComputeType::kFloat32), "float32");
}

TEST(Precision, Float32IsFloat32Everywhere) {
  MaskedFeatures mask("avx512_bf16");
  EXPECT_EQ(ops::resolve_dtype("float32", "model.dtype"), ops::ComputeType::kFloat32);
  EXPECT_EQ(ops::resolve_dtype("torch.float32", "model.dtype"), ops::ComputeType::kFloat32);
}

TEST(Precision, UnknownNameIsAnError) {
  try {
    ops::resolve_dtype("float16", "--dtype");
    FAIL() << "no error";
  } catch (const longtron::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype: \"float16\" is not one of"), std::string::npos)
        << e.what();
  }
}

TEST(Precision, AutoFallsBackToFloat32WithoutAvx512Bf16) {
  MaskedFeatures mask("avx2, avx512_bf16");
  EXPECT_FALSE(ops::cpu_has_avx512_bf16());
  std::string note;
  EXPECT_EQ(ops::resolve_dtype("auto", "model.dtype", &note), ops::ComputeType::kFloat32);
  EXPECT_NE(note.find("lacks AVX512-BF16"), std::string::npos) << note;
}

TEST(Precision, ExplicitBfloat16WithoutAvx512Bf16IsAnErrorNamingIt) {
  MaskedFeatures mask("avx512_bf16");
  for (const char* name : {"bfloat16", "torch.bfloat16"}) {
    try {
      ops::resolve_dtype(name, "model.dtype");
      FAIL() << "no error for " << name;
    } catch (const longtron::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("model.dtype: \"bfloat16\" needs native bf16"), std::string::npos) << m;
      EXPECT_NE(m.find("AVX512-BF16 (avx512_bf16"), std::string::npos) << m;
    }
  }
}

// The test-only emulation switch lets an explicit bfloat16 run without AVX512-BF16 (the kernels'
// emulation), leaves auto at float32, and once off restores the user's rule; where native bf16
// runs it changes nothing.
TEST(Precision, EmulationSwitchAdmitsBfloat16OnlyWhileOn) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
    GTEST_SKIP() << "no AVX-512 on this CPU";
  const bool native = native_here();
  {
    MaskedFeatures mask("avx512_bf16");
    ops::set_bf16_emulation_for_tests(true);
    EXPECT_TRUE(ops::bf16_emulated());
    std::string note;
    EXPECT_EQ(ops::resolve_dtype("bfloat16", "model.dtype", &note), ops::ComputeType::kBFloat16);
    EXPECT_NE(note.find("emulated"), std::string::npos) << note;
    EXPECT_EQ(ops::resolve_dtype("auto", "model.dtype"), ops::ComputeType::kFloat32);
    ops::set_bf16_emulation_for_tests(false);
    EXPECT_FALSE(ops::bf16_emulated());
    EXPECT_THROW(ops::resolve_dtype("bfloat16", "model.dtype"), longtron::Error);
  }
  if (!native) return;
  ops::set_bf16_emulation_for_tests(true);
  EXPECT_FALSE(ops::bf16_emulated());  // native bf16 runs: nothing to emulate
  EXPECT_TRUE(ops::attention_bf16_native());
  ops::set_bf16_emulation_for_tests(false);
}

TEST(Precision, MisspeltMaskedFeatureIsAnErrorNamingIt) {
  MaskedFeatures mask("amx_bf16, avx512bf16");  // "avx512bf16" hides nothing: say so
  for (const char* dtype : {"float32", "auto", "bfloat16"}) {
    try {
      ops::resolve_dtype(dtype, "model.dtype");
      FAIL() << "no error for " << dtype;
    } catch (const longtron::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("LONGTRON_CPU_FEATURES_MASK: \"avx512bf16\" is neither"), std::string::npos)
          << m;
    }
  }
}

TEST(Precision, OtherMaskedFeaturesLeaveBf16Alone) {
  if (!native_here()) GTEST_SKIP() << "this CPU has no native bf16";
  MaskedFeatures mask("avx512_bf16x,amx_bf16");
  EXPECT_TRUE(ops::cpu_has_avx512_bf16());
}

// On a CPU with AVX512-BF16 (the development machine has it), auto and bfloat16 choose bf16.
TEST(Precision, AutoAndBfloat16ChooseBf16WhereTheCpuHasIt) {
  if (!native_here()) GTEST_SKIP() << "this CPU has no native bf16";
  std::string note;
  EXPECT_EQ(ops::resolve_dtype("auto", "model.dtype", &note), ops::ComputeType::kBFloat16);
  EXPECT_NE(note.find("has AVX512-BF16"), std::string::npos) << note;
  EXPECT_EQ(ops::resolve_dtype("torch.bfloat16", "model.dtype"), ops::ComputeType::kBFloat16);
}
