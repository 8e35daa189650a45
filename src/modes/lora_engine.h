// The engine's LoRA state (engine.h, "LoRA"): private to src/modes/engine.cpp and lora_engine.cpp.
#pragma once
#include <memory>
#include <vector>

#include "model/lora.h"
#include "modes/engine.h"

namespace longtron::parallel {

/// The adapter table of one rank: full and local layouts, its plan, values and gradients, and the
/// state the wrapped ops share. Heap-held (the plan points at `full`).
struct ParallelEngine::Lora {
  Lora(const model::ParamTable& base, const model::LoraConfig& config, const Grid& grid);
  std::vector<model::LoraModule> modules;
  model::ParamTable full;
  ShardPlan plan;
  model::ParamTable local;  ///< set after the plan's splits (build_lora)
  std::unique_ptr<model::Params<float>> params, grads;
  std::shared_ptr<model::LoraState<float>> state;
  std::vector<uint16_t> base16;  ///< the bf16 base (freeze_lora_base), else empty
};

/// The wrapped ops' state of `lora` (nullptr-safe for the engine's RAII below).
inline model::LoraState<float>* lora_state(ParallelEngine::Lora& lora) { return lora.state.get(); }

/// Sets LoraState::training for one forward(_backward) call and restores it after.
class LoraTraining {
 public:
  LoraTraining(model::LoraState<float>* state, bool training) : state_(state) {
    if (state_) previous_ = std::exchange(state_->training, training);
  }
  ~LoraTraining() {
    if (state_) state_->training = previous_;
  }
  LoraTraining(const LoraTraining&) = delete;
  LoraTraining& operator=(const LoraTraining&) = delete;

 private:
  model::LoraState<float>* state_;
  bool previous_ = false;
};

}  // namespace longtron::parallel
