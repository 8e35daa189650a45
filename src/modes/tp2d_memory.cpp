// The memory terms of the "2d" mode (mode_memory.h): MindSpeed's 2D tensor parallel.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "modes/engine.h"
#include "modes/mode_memory.h"

namespace longtron::parallel {
namespace {

/// Elements the 2D linears hold between calls (parallel/tp_linear.cpp), for a linear gathering its
/// input over a group of `ag` and reduce-scattering its output over `rs`. Per layer: the gathered
/// input N × in of each linear that gathers (kept for backward; one for w1/w3). Once for all
/// linears, each buffer as large as its largest use: the partial input gradient N × in (not for
/// a linear that needs no reduction of it), the reduce-scattered input gradient N/ag × in, and
/// the partial output and gathered output gradient N × out each.
struct Linear2DElements {
  double per_layer = 0, shared = 0;
};

Linear2DElements linear_2d_elements(const model::ParamTable& local, const model::BlockParamIds& b,
                                    double N, double x, double y) {
  struct Use {
    int view;
    double ag, rs;
    int role;
  };  // role: 0 alone, 1 first, 2 second of a pair
  const Use uses[] = {
      {b.wqkv, x, y, 0}, {b.wo, y, x, 0}, {b.w1, x, y, 1}, {b.w3, x, y, 2}, {b.w2, y, x, 0}};
  Linear2DElements e;
  double dx_partial = 0, reduced = 0, out_rows = 0;
  for (const Use& u : uses) {
    const double out = static_cast<double>(local.view(u.view).shape[0]);
    const double in = static_cast<double>(local.view(u.view).shape[1]);
    if (u.ag > 1 && u.role != 2) e.per_layer += N * in;
    if (u.ag > 1 || u.role != 0) dx_partial = std::max(dx_partial, N * in);
    if (u.ag > 1 && u.role != 1) reduced = std::max(reduced, N / u.ag * in);
    if (u.rs > 1) out_rows = std::max(out_rows, N * out);
  }
  e.shared = dx_partial + reduced + 2 * out_rows;
  return e;
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
  if (in.local.layers.front().q_norm >= 0) {  // the q/k norms' saves: N/y rows of x's heads
    w.qk_heads = (hqx + hkvx) / y;
    w.qk = w.qk_heads * d;
  }
  s.head_vocab = std::ceil(V / T);
  // The 2D linears' buffers (above); the embedding and the head hold full-row copies (N × H
  // each: 2 and 3).
  const Linear2DElements e = linear_2d_elements(in.local, in.local.layers.front(), P, x, y);
  s.layout_scratch = w.L * e.per_layer + e.shared + 5 * P * Hid;
  s.bf16_operands = Bf16Operands::kHeadWeight;
  s.scratch_key = "parallel.tensor_2d";
  s.sizes = fmt::format(", tensor_2d {}x{}", in.grid.layout.tensor_2d_x, in.grid.layout.tensor_2d_y);
}

}  // namespace longtron::parallel
