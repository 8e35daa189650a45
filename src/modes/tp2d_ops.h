// MindSpeed 2D tensor parallel (tp = x × y) as a parallel mode of the engine (MindSpeed
// mindspeed/core/tensor_parallel/tp_2d; docs/tp2d.md). Registered as "2d" (parallel.tensor_2d = {x, y,
// overlap}); x2×y1 is Megatron TP + sequence parallel (MSP) with t = 2, op for op.
//
// Layouts (N = tokens of the packed row; rank (xr, yr), tensor rank r = xr + x·yr):
//   residual stream, norm in/out     [N/x, H/y]   rows block xr, hidden block yr
//   wqkv, w1, w3 (linear A=X, R=Y)   [N/x, H/y] → [N/y, out/x]
//   attention                        heads split on x (Hq/x q heads, Hkv/x kv heads: whole GQA
//                                    groups, docs/model.md grouped rows); with y > 1 Ulysses over the y
//                                    group (all-to-all: scatter the x-rank's heads over y, gather
//                                    the sequence; kv heads repeated when y > Hkv/x) — reference
//                                    MindSpeed's "attention over the TP-Y-union-CP group" with cp = 1
//   wo, w2 (linear A=Y, R=X)         [N/y, in/x] → [N/x, H/y]
//   embedding                        InternEvo's hidden-split table [V, H/tp] over the whole
//                                    tensor group (as MSP), lookup, all-gather along hidden,
//                                    keep block (xr, yr); backward all-gathers the blocks.
//                                    Tied to the head (tie_word_embeddings): the head's vocab
//                                    rows [V/tp], partial lookup reduce-scattered into the blocks
//   final norm → head                all-gather the blocks over the tensor group to [N, H];
//                                    vocab-parallel head + cross-entropy over the tensor group;
//                                    backward reduce-scatters dX over the tensor group straight
//                                    into the blocks (MindSpeed all-reduces, then splits)
// Parameters (plan): wqkv [Q/x (whole kv groups of xr), H/y]; wo [H/y, (Hq/x)·d]; w1/w3 [F/x,
// H/y]; w2 [H/y, F/x] (F split unevenly by shard_range); norms [H/y], gradient SUMMED over X;
// wqkv, w1 and w3 biases [Q/x], [F/x] summed over Y; wo and w2 biases [H/y] summed over X; output rows [V/tp] (uneven);
// embedding columns [H/tp] (uneven), or the output's rows when tied (one tensor).
// Generation (logits_row) is not supported under 2D (Error); training and evaluation are.
#pragma once
#include "model/layers.h"
#include "modes/engine.h"

namespace longtron::parallel {

/// The plan entries of the 2D mode (splits over X, Y, TENSOR and gradient SUMs, as above).
void tp2d_plan(ShardPlan& plan);

/// The 2D ops over ctx.local; overlap from ctx.grid.layout.tensor_2d_overlap (Error naming
/// parallel.tensor_2d.overlap when unknown).
model::ModelOps<float> make_tp2d_ops(const ModeContext& ctx);

/// Registers "2d" (called from register_builtin_modes).
void register_2d_mode();

}  // namespace longtron::parallel
