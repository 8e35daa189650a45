// The decoder's workspace table (model/workspace.h).
#include "model/workspace.h"

namespace longtron::model {
namespace {

double pad16(double n) { return std::ceil(n / 16) * 16; }  // 64 bytes of float
double pad32(double n) { return std::ceil(n / 32) * 32; }  // 64 bytes of bf16

using S = WorkspaceSlot;

/// The chunked recomputation (Decoder::chunk_reserve): row-sized buffers, then one chunk's.
void chunked(const WorkspaceShape& s, std::vector<WorkspaceBuffer>& t) {
  const double N = s.N, H = s.H, A = s.A, C = std::min(N, s.chunk), F = s.F;
  const double slots = s.train ? s.L : 1;
  if (s.bf16) t.push_back({"block inputs (bf16)", S::kChunkInputs16, 0, slots * N * H, true, true});
  else t.push_back({"block inputs", S::kChunkInputs, 0, slots * N * H, false, true});
  t.push_back({"q, k, v after RoPE (then dq, dk, dv)", S::kChunkQkv, 0, s.saved_qkv, false, true});
  if (s.bf16) t.push_back({"attention output (bf16)", S::kChunkOut16, 0, N * A, true, true});
  else t.push_back({"attention output", S::kChunkOut, 0, N * A, false, true});
  t.push_back({"attention lse", S::kChunkLse, 0, s.saved_lse, false, true});
  if (s.qk > 0) {
    t.push_back({"q, k before their norms", S::kChunkQkIn, 0, N * s.qk, false, true});
    t.push_back({"q, k norm rstd", S::kChunkQkRstd, 0, N * s.qk_heads, false, true});
  }
  if (s.train) {
    t.push_back({"attention output gradient", S::kChunkDout, 0, N * A, false, true});
    t.push_back({"dL/d(residual)", S::kChunkDres, 0, N * H, false, true});
  }
  // xw, xn, h, hw, t (C × H each), rstd (C), g1…g4 (C × F each), under bf16 the widened output.
  t.push_back({"chunk temporaries", S::kChunkTemps, 0,
               5 * C * H + C + 4 * C * F + (s.bf16 ? C * A : 0), false, false});
  if (s.bf16) t.push_back({"chunk a, b (bf16)", S::kChunkTemps16, 0, 2 * C * F, true, false});
}

/// The per-block saves of the q/k norms (none without them).
void qk_saves(const WorkspaceShape& s, int block, std::vector<WorkspaceBuffer>& t) {
  if (s.qk <= 0) return;
  t.push_back({"q, k before their norms", S::kQkIn, block, pad16(s.N * s.qk), false, true});
  t.push_back({"q, k norm rstd", S::kQkRstd, block, pad16(s.N * s.qk_heads), false, true});
}

/// The unchunked bf16 layout (Decoder::reserve with bf16).
void unchunked_bf16(const WorkspaceShape& s, std::vector<WorkspaceBuffer>& t) {
  const double R = s.R, N = s.N, H = s.H;
  const int L = static_cast<int>(s.L), nacts = s.per_layer ? L : 1;
  // Block inputs in bf16 with per-block acts; in fp32 when recomputing (checkpoint), so the
  // recomputed block starts from the forward's x.
  for (int i = 0; i < L; ++i) {
    if (s.per_layer) t.push_back({"block input (bf16)", S::kInput16, i, pad32(R * H), true, true});
    else t.push_back({"block input", S::kInput, i, pad16(R * H), false, true});
  }
  for (int i = 0; i < nacts; ++i) {
    t.push_back({"attention lse", S::kLse, i, pad16(s.saved_lse), false, true});
    t.push_back({"residual after attention (bf16)", S::kH16, i, pad32(R * H), true, true});
    t.push_back({"q, k, v after RoPE (bf16)", S::kQkv16, i, pad32(s.saved_qkv), true, true});
    t.push_back({"attention output (bf16)", S::kAttn16, i, pad32(N * s.A), true, true});
    t.push_back({"FFN a (bf16)", S::kA16, i, pad32(N * s.F), true, true});
    t.push_back({"FFN b (bf16)", S::kB16, i, pad32(N * s.F), true, true});
    qk_saves(s, i, t);
  }
  t.push_back({"final norm rstd", S::kRstdF, 0, pad16(R), false, true});
  t.push_back({"norm rstd (recomputed)", S::kRstdScratch, 0, pad16(R), false, true});
  t.push_back({"fp32 pool (one block's temporaries)", S::kPool, 0,
               pool_sizes<double>(R, N, H, s.Q, s.F, s.A, s.saved_qkv).total(), false, true});
  // The bits a norm or SwiGLU writes beside its float output for the GEMM that reads it next.
  t.push_back({"GEMM input (bf16)", S::kGemmIn16, 0, pad32(N * std::max(H, s.F)), true, true});
}

/// The unchunked float layout (Decoder::reserve without bf16).
void unchunked(const WorkspaceShape& s, std::vector<WorkspaceBuffer>& t) {
  const double R = s.R, N = s.N, H = s.H, F = s.F, A = s.A, sq = s.saved_qkv;
  const int L = static_cast<int>(s.L), nacts = s.per_layer ? L : 1;
  for (int i = 0; i <= L; ++i)
    t.push_back({"block input (the last: output)", S::kInput, i, pad16(R * H), false, true});
  for (int i = 0; i < nacts; ++i) {
    t.push_back({"q, k, v after RoPE", S::kQkvSaved, i, pad16(sq), false, true});
    t.push_back({"attention output", S::kAttn, i, pad16(N * A), false, true});
    t.push_back({"FFN a", S::kA, i, pad16(N * F), false, true});
    t.push_back({"FFN b", S::kB, i, pad16(N * F), false, true});
    t.push_back({"attention lse", S::kLse, i, pad16(s.saved_lse), false, true});
    t.push_back({"residual after attention", S::kH, i, pad16(R * H), false, true});
    t.push_back({"attention norm rstd", S::kRstd1, i, pad16(R), false, true});
    t.push_back({"FFN norm rstd", S::kRstd2, i, pad16(R), false, true});
    qk_saves(s, i, t);
  }
  const struct { const char* name; S slot; double n; } temps[] = {
      {"norm output", S::kXn, R * H},         {"qkv", S::kQkv, N * s.Q},
      {"linear output", S::kTmp, R * H},      {"FFN g", S::kG, N * F},
      {"final norm output", S::kXf, R * H},   {"final norm rstd", S::kRstdF, R},
      {"norm rstd (recomputed)", S::kRstdScratch, R},
      {"dL/d(residual)", S::kDres, R * H},    {"residual gradient part", S::kDtmp, R * H},
      {"norm output gradient", S::kDxn, R * H}, {"FFN dg", S::kDg, N * F},
      {"FFN da", S::kDa, N * F},              {"FFN db", S::kDb, N * F},
      {"attention output gradient", S::kDattn, N * A},
      {"q, k, v gradient (split)", S::kDqkvSaved, sq}};
  for (const auto& b : temps) t.push_back({b.name, b.slot, 0, pad16(b.n), false, true});
}

double sum(const WorkspaceShape& s, bool bf16) {
  double n = 0;
  for (const WorkspaceBuffer& b : workspace_table(s))
    if (b.bf16 == bf16) n += b.elements;
  return n;
}

}  // namespace

std::vector<WorkspaceBuffer> workspace_table(const WorkspaceShape& s) {
  std::vector<WorkspaceBuffer> t;
  if (s.chunk > 0) chunked(s, t);
  else if (s.bf16) unchunked_bf16(s, t);
  else unchunked(s, t);
  return t;
}

double workspace_elements(const WorkspaceShape& s) { return sum(s, false); }

double workspace_bf16_elements(const WorkspaceShape& s) { return sum(s, true); }

}  // namespace longtron::model
