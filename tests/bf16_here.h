// Where the bf16 tests run: natively, or through the test-only emulation of the bf16 instructions
// (ops/precision.h), so that they run rather than skip on a CPU without AVX512-BF16.
#pragma once
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

}  // namespace longtron::testing
