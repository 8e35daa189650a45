// The memory terms of the "2d" mode (mode_memory.h): MindSpeed's 2D tensor parallel.
#include <fmt/core.h>

#include <cmath>
#include <string>

#include "modes/engine.h"
#include "modes/mode_memory.h"

namespace longtron::parallel {
namespace {

/// Elements one layer's 2D linears keep between calls (parallel/tp_linear.cpp): for a linear
/// gathering its input over a group of `ag` and reduce-scattering its output over `rs`, the
/// gathered input N × in (kept for backward; shared by w1/w3), the partial input gradient N × in
/// (shared by w1/w3), the reduce-scattered input gradient N/ag × in, and the partial output and
/// gathered output gradient N × out each.
double linear_2d_elements(const model::ParamTable& local, const model::BlockParamIds& b, double N,
                          double x, double y) {
  struct Use {
    int view;
    double ag, rs;
    int role;
  };  // role: 0 alone, 1 first, 2 second of a pair
  const Use uses[] = {
      {b.wqkv, x, y, 0}, {b.wo, y, x, 0}, {b.w1, x, y, 1}, {b.w3, x, y, 2}, {b.w2, y, x, 0}};
  double total = 0;
  for (const Use& u : uses) {
    const double out = static_cast<double>(local.view(u.view).shape[0]);
    const double in = static_cast<double>(local.view(u.view).shape[1]);
    if (u.role != 2) total += N * in * (u.ag > 1 ? 2 : 1);
    if (u.ag > 1 && u.role != 1) total += N / u.ag * in;
    if (u.rs > 1) total += 2 * N * out;
  }
  return total;
}

}  // namespace

void tp2d_memory(const ModeMemoryInputs& in, ModeMemory& s) {
  const auto [P, d, Hq, Hkv, Hid, V, T] = memory_sizes(in);
  model::WorkspaceShape& w = s.ws;
  const double x = in.grid.layout.tensor_2d_x, y = in.grid.layout.tensor_2d_y;
  const double hqx = Hq / x, hkvx = Hkv / x;
  w.R = std::ceil(P / x);
  w.A = hqx * d;
  if (y == 1) {
    w.saved_qkv = P * (hqx + 2 * hkvx) * d;
    w.saved_lse = P * hqx;
    s.attn_hq = hqx;
    s.attn_hkv = hkvx;
  } else {
    const UlyssesShare h = ulysses_share(hqx, hkvx, y);
    const double chunk = std::ceil(P / y);
    w.saved_qkv = chunk * (y * (h.q + 2 * h.kv) + hqx) * d;
    w.saved_lse = chunk * hqx;
    s.attn_hq = h.q;
    s.attn_hkv = h.kv;
  }
  s.head_vocab = std::ceil(V / T);
  // Every 2D linear of every layer keeps its own buffers (parallel/tp_linear.cpp); the
  // embedding and the head hold full-row copies (N × H each: 2 and 3).
  s.layout_scratch =
      w.L * linear_2d_elements(in.local, in.local.layers.front(), P, x, y) + 5 * P * Hid;
  s.bf16_operands = Bf16Operands::kHeadWeight;
  s.scratch_key = "parallel.tensor_2d";
  s.sizes = fmt::format(", tensor_2d {}x{}", in.grid.layout.tensor_2d_x, in.grid.layout.tensor_2d_y);
}

}  // namespace longtron::parallel
