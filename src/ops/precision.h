// The compute type of float GEMMs and attention: float32, or bfloat16 inputs with float32
// accumulation (mixed precision as torch.autocast does it: a scope, per calling thread).
#pragma once

namespace longtron::ops {

/// What float GEMMs and attention compute in. kBFloat16: inputs rounded to bf16, products and
/// sums in fp32, results fp32 (Micikevicius et al. 2018, "Mixed Precision Training").
enum class ComputeType { kFloat32, kBFloat16 };

/// The compute type of the calling thread (kFloat32 unless a ComputeTypeScope says otherwise).
ComputeType compute_type();

/// Sets the calling thread's compute type for the scope's lifetime, restoring the previous one on
/// exit (like torch.autocast). Ops read it on the calling thread, before their parallel regions.
class ComputeTypeScope {
 public:
  explicit ComputeTypeScope(ComputeType type);
  ~ComputeTypeScope();
  ComputeTypeScope(const ComputeTypeScope&) = delete;
  ComputeTypeScope& operator=(const ComputeTypeScope&) = delete;

 private:
  ComputeType previous_;
};

}  // namespace longtron::ops
