// Where the bf16 tests run: natively, or through the test-only emulation of the bf16 instructions
// (ops/precision.h), so that they run rather than skip on a CPU without AVX512-BF16.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace longtron::testing {

/// For one bf16 test: where native bf16 is missing (no AVX512-BF16, or hidden by
/// LONGTRON_CPU_FEATURES_MASK, or oneDNN's ISA capped), switches set_bf16_emulation_for_tests on
/// for the object's lifetime (off again after: tests of the user's rule must see it unchanged).
class Bf16Here {
 public:
  Bf16Here() : native_(ops::cpu_has_avx512_bf16() && ops::gemm_backend().native_bf16) {
    if (!native_) ops::set_bf16_emulation_for_tests(true);
  }
  ~Bf16Here() {
    if (!native_) ops::set_bf16_emulation_for_tests(false);
  }
  Bf16Here(const Bf16Here&) = delete;
  Bf16Here& operator=(const Bf16Here&) = delete;

  /// Whether bf16 runs here, natively or emulated: false only on a CPU without AVX-512F/BW/VL/DQ
  /// (the caller skips).
  bool runs() const { return native_ || ops::bf16_emulated(); }
  /// Whether it runs natively.
  bool native() const { return native_; }

 private:
  bool native_;
};

/// Whether oneDNN has no bf16 matmul here: on a CPU without AVX-512 (or with it hidden by
/// LONGTRON_CPU_FEATURES_MASK, which caps oneDNN too) every bf16 GEMM is refused. Then this checks
/// what the CPU does instead (a bf16 GEMM throws longtron::Error naming oneDNN's ISA) and returns
/// true, and the calling bf16 test ends there; the bf16 path itself is tested on AVX-512 machines
/// and, with AVX512-BF16 hidden, on those without it.
inline bool bf16_gemm_refused_here() {
  const ops::GemmBackend gemm = ops::gemm_backend();
  if (gemm.isa.rfind("avx512", 0) == 0) return false;
  std::vector<uint16_t> a(4, 0x3F80);  // bf16 1.0
  std::vector<float> c(4);
  try {
    ops::gemm_bf16(false, false, 2, 2, 2, 1.0f, a.data(), a.data(), 0.0f, c.data());
    ADD_FAILURE() << "a bf16 GEMM ran on oneDNN's ISA " << gemm.isa;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no bf16 matmul on this CPU (ISA " + gemm.isa),
              std::string::npos) << e.what();
  }
  return true;
}

}  // namespace longtron::testing
