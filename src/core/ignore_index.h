// The label value that takes no loss: PyTorch's cross-entropy ignore_index default, which
// InternEvo, Megatron-LM and Hugging Face data use. The one definition every folder reads.
#pragma once
#include <cstdint>

namespace longtron {

/// Label value that takes no loss (PyTorch's ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

}  // namespace longtron
