// The list of built-in parallel modes (engine.h). To add a mode: define register_<mode>_mode() in
// your own file (its ModeFactory: plan, ops, and where it needs them local_batch with
// gather_token_losses, validate, memory) and add one call below.
#include <mutex>

#include "model/layers.h"
#include "modes/engine.h"
#include "modes/mode_memory.h"

namespace longtron::parallel {

void register_megatron_modes();  // megatron_ops.cpp: "mtp", "msp", "fsp"
void register_isp_mode();        // isp_mode.cpp: "isp"
void register_2d_mode();         // tp2d_ops.cpp: "2d"

namespace {

// One process per model replica (pure data parallel or a single process): the dense ops over
// full tensors.
void register_dense_mode() {
  ModeFactory f;
  f.make_ops = [](const ModeContext& ctx) {
    return model::make_dense_ops<float>(ctx.local, ctx.compute);
  };
  f.memory = megatron_memory;  // Megatron's terms with T = 1
  register_mode("dense", std::move(f));
}

}  // namespace

void register_builtin_modes() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_dense_mode();
    register_megatron_modes();
    register_isp_mode();
    register_2d_mode();
  });
}

}  // namespace longtron::parallel
