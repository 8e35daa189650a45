// The memory terms of the "isp" mode (mode_memory.h): Ulysses sequence parallel with the weights
// gathered per layer, and 2D-Attention's context parallel.
#include <algorithm>
#include <fmt/core.h>

#include <cmath>
#include <string>

#include "modes/engine.h"
#include "modes/mode_memory.h"
#include "packing/context_split.h"

namespace longtron::parallel {

void isp_memory(const ModeMemoryInputs& in, ModeMemory& s) {
  const model::ModelConfig& m = in.model;
  const model::ParamTable& full = in.full;
  const auto [P, d, Hq, Hkv, Hid, V, T] = memory_sizes(in);
  model::WorkspaceShape& w = s.ws;
  // 2D-Attention: Ulysses over the head group of Th = head_size ranks, the context share of
  // M = P / C tokens after it (docs/isp.md); without it Th = T, C = 1.
  const Layout& l = in.grid.layout;
  const double C = l.seq2d ? l.seq2d_context : 1, Th = T / C;
  const UlyssesShare h = ulysses_share(Hq, Hkv, Th);
  const double N = std::ceil(P / T), local_heads = h.q + 2 * h.kv;
  w.N = w.R = N;
  w.H = Hid;
  w.Q = static_cast<double>(m.qkv_size());
  w.F = static_cast<double>(m.ffn_size());
  w.A = Hq * d;
  w.saved_qkv = N * (Th * local_heads + Hq) * d;
  w.saved_lse = N * Hq;
  s.attn_hq = h.q;
  s.attn_hkv = h.kv;
  // The kernels run over groups of whole query runs (cp_attention.h; the plan sizes one), but
  // for the all-gather form of context parallelism, one call.
  s.attn_tokens = N * Th;
  s.attn_groups = !(l.seq2d && l.seq2d_context > 1 && !l.seq2d_ring);
  s.head_rows = N;
  // Gathered weights: the largest tensor (the head or the embedding) once, twice with prefetch,
  // its full gradient before the reduce-scatter, and the send/receive staging; plus Ulysses'
  // split and packed token buffers where there is an all-to-all (Th > 1). Under bf16 a gathered weight other than the embedding
  // (gathered in fp32 for its fp32 lookup) holds 2 bytes an element: half a float.
  double largest = 0, gathered = 0;
  for (const auto& v : full.views()) {
    const double numel = static_cast<double>(v.numel);
    largest = std::max(largest, numel);
    const bool fp32 = !in.bf16 || &v == &full.view(full.tok_embeddings);
    gathered = std::max(gathered, fp32 ? numel : 0.5 * numel);
  }
  const double slots = l.weight_overlap ? 2 : 1;
  const double staging = Th > 1 ? N * (w.Q + Th * local_heads * d) * 2 : 0;
  s.layout_scratch = slots * gathered + 3 * largest + staging;
  // Context parallel over C ranks, M = N·Th local tokens, K/V rows of 2·kv·d floats.
  const double M = N * Th, kv_row = 2 * h.kv * d;
  if (C > 1 && l.seq2d_ring) {
    // Ring attention (cp_ring.h), backward (the larger pass): this rank's packed K/V, the block
    // received, one pass's key rows and their gradient, its own dK/dV sum and the one it adds
    // into, one incoming sum, and the sums in flight, each at most M rows. A sum sent at step k
    // is freed at the end of step k + 1: on one ring (window 1 or C) a rank sends one sum a step,
    // so two are in flight; the double ring's sums may wait for their inner ring, bounded by the
    // C − 1 a rank sends in all.
    const bool one_ring = l.seq2d_window == 1 || l.seq2d_window == l.seq2d_context;
    const double in_flight = one_ring ? std::min(2.0, C - 1) : C - 1;
    s.layout_scratch += (6 + in_flight) * M * kv_row;
  } else if (C > 1) {
    // The all-gather form (cp_attention.h): this rank's K/V, the gathered row's, the key buffer
    // and its gradient (at most about twice the row: a rank's two zigzag pieces of a document
    // both copy its start).
    s.layout_scratch += (M + P + 2 * 2 * P) * kv_row;
  }
  s.bf16_operands = Bf16Operands::kHeadRows;
  s.sizes = fmt::format(", tensor {}, weight {}", l.tensor_size, l.weight_size);
  if (l.seq2d)
    s.sizes += fmt::format(", 2D-Attention head {} x context {} ({})", l.seq2d_head,
                           l.seq2d_context, data::context_balance_name(l.seq2d_balance));
}

}  // namespace longtron::parallel
