// The workspace table (model/workspace.h) is what InternLM2 allocates: the chunked
// recomputation's buffers one by one, and the unchunked arenas' sizes, in float, double and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "bf16_here.h"
#include "model/decoder.h"
#include "model_testing.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace longtron::model {
namespace {

using testing::tiny_row;

template <typename T>
void fill(Params<T>& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.1);
  for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] = static_cast<T>(normal(rng));
}

/// The dense model's workspace shape for a row of N tokens.
WorkspaceShape shape_of(const ModelConfig& c, double N) {
  return WorkspaceShape{double(c.num_layers), N, N, double(c.hidden_size), double(c.qkv_size()),
                        double(c.ffn_size()), double(c.attention_size()),
                        N * double(c.qkv_size()), N * double(c.num_attention_heads)};
}

/// The table's buffers as (slot, bytes) with elements of `bytes_t` in the float arena.
std::vector<std::pair<WorkspaceSlot, int64_t>> table_bytes(const WorkspaceShape& s,
                                                           size_t bytes_t) {
  std::vector<std::pair<WorkspaceSlot, int64_t>> r;
  for (const WorkspaceBuffer& b : workspace_table(s))
    r.emplace_back(b.slot, int64_t(b.elements) * int64_t(b.bf16 ? 2 : bytes_t));
  return r;
}

/// The compute context of a check: bf16 or float32.
const ops::ComputeContext& context_of(bool bf16) {
  static const ops::ComputeContext bf16_context(ops::ComputeType::kBFloat16);
  return bf16 ? bf16_context : ops::ComputeContext::fp32();
}

template <typename T>
void check_chunked(bool bf16) {
  ModelConfig c = testing::tiny_config();
  c.checkpoint = true;
  c.chunk_tokens = 5;
  const ParamTable layout(c);
  Params<T> params(layout), grads(layout);
  fill(params, 3);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  WorkspaceShape s = shape_of(c, double(batch.input_ids.size()));
  s.chunk = 5;
  s.bf16 = bf16;
  Decoder<T> forward_only(layout, params, make_dense_ops<T>(layout, context_of(bf16)));
  forward_only.forward_loss(batch);
  s.train = false;
  EXPECT_EQ(forward_only.chunk_buffers(), table_bytes(s, sizeof(T)));
  Decoder<T> model(layout, params, make_dense_ops<T>(layout, context_of(bf16)));
  model.forward_backward(batch, grads, 1.0);
  s.train = true;
  EXPECT_EQ(model.chunk_buffers(), table_bytes(s, sizeof(T)));
  EXPECT_EQ(double(model.workspace_bytes()),
            workspace_elements(s) * sizeof(T) + workspace_bf16_elements(s) * 2);
}

TEST(WorkspaceTable, IsWhatTheChunkedModelAllocates) {
  check_chunked<double>(false);
  check_chunked<float>(false);
}

TEST(WorkspaceTable, IsWhatTheChunkedModelAllocatesInBf16) {
  const testing::Bf16Here here;
  if (!here.runs()) GTEST_SKIP() << "this CPU cannot run bf16, not even emulated";
  check_chunked<float>(true);
}

/// The unchunked arenas: training without recomputation (a set of saved state per layer) and a
/// forward-only call (one shared set).
template <typename T>
void check_unchunked(bool bf16) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  Params<T> params(layout), grads(layout);
  fill(params, 4);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  WorkspaceShape s = shape_of(c, double(batch.input_ids.size()));
  s.bf16 = bf16;
  const auto bytes = [&] {
    return workspace_elements(s) * sizeof(T) + workspace_bf16_elements(s) * 2;
  };
  Decoder<T> forward_only(layout, params, make_dense_ops<T>(layout, context_of(bf16)));
  forward_only.forward_loss(batch);
  EXPECT_EQ(double(forward_only.workspace_bytes()), bytes());
  Decoder<T> model(layout, params, make_dense_ops<T>(layout, context_of(bf16)));
  model.forward_backward(batch, grads, 1.0);
  s.per_layer = true;
  EXPECT_EQ(double(model.workspace_bytes()), bytes());
  // Every buffer of the unchunked layouts grows with the row.
  for (const WorkspaceBuffer& b : workspace_table(s)) EXPECT_TRUE(b.row) << b.name;
}

TEST(WorkspaceTable, IsWhatTheUnchunkedModelAllocates) {
  check_unchunked<double>(false);
  check_unchunked<float>(false);
  const testing::Bf16Here here;
  if (!here.runs()) GTEST_SKIP() << "this CPU cannot run bf16, not even emulated";
  check_unchunked<float>(true);
}

// The chunked layout's row-sized bytes per token under bf16 (docs/memory.md, "Long rows"): the
// block inputs in bf16, q/k/v, the attention output in bf16, lse, dO and dL/d(residual).
TEST(WorkspaceTable, ChunkedBf16BytesPerToken) {
  ModelConfig c = testing::tiny_config();
  WorkspaceShape s = shape_of(c, 1000);
  s.chunk = 10, s.bf16 = true;
  double row = 0;
  for (const WorkspaceBuffer& b : workspace_table(s))
    if (b.row) row += b.elements * (b.bf16 ? 2 : 4);
  const double L = double(c.num_layers), H = double(c.hidden_size), A = double(c.attention_size());
  const double Q = double(c.qkv_size()), hq = double(c.num_attention_heads);
  EXPECT_EQ(row / 1000, L * H * 2 + Q * 4 + A * 2 + hq * 4 + A * 4 + H * 4);
}

}  // namespace
}  // namespace longtron::model
