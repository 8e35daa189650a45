// Whole-model gradients against central finite differences in double, with and
// without activation checkpointing, on a tiny GQA config over a packed row with length-1 segments
// and a pad segment.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "bf16_here.h"
#include "core/error.h"
#include "model/decoder.h"
#include "model_testing.h"
#include "ops/fd_check.h"
#include "ops/ops.h"
#include "ops/precision.h"

namespace longtron::model {
namespace {

using testing::append_document;
using testing::tiny_row;

/// Parameters far from the init scale so every nonlinearity is exercised.
void randomize(Params<double>& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.4);
  for (const auto& v : p.layout().views()) {
    double* x = p.data() + v.offset;
    for (int64_t i = 0; i < v.numel; ++i) x[i] = v.is_norm ? 1.0 + 0.3 * normal(rng) : normal(rng);
  }
}

void check_gradients(const ModelConfig& config, bool checkpoint) {
  ModelConfig c = config;
  c.checkpoint = checkpoint;
  const ParamTable layout(c);
  Params<double> params(layout), grads(layout);
  randomize(params, 11);
  Decoder<double> model(layout, params);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  const double scale = 0.37;
  const LossSum loss = model.forward_backward(batch, grads, scale);
  EXPECT_EQ(loss.count, 6 + 0 + 4 + 0 + 5);
  std::vector<double> token_losses;
  const LossSum eval = model.forward_loss(batch, &token_losses);
  EXPECT_NEAR(loss.sum, eval.sum, 1e-12 * std::abs(loss.sum));
  EXPECT_EQ(eval.count, loss.count);
  double total = 0;
  for (size_t i = 0; i < token_losses.size(); ++i) {
    total += token_losses[i];
    if (batch.labels[i] == data::kIgnoreIndex) {
      EXPECT_EQ(token_losses[i], 0.0);
    }
  }
  EXPECT_NEAR(total, loss.sum, 1e-12 * std::abs(loss.sum));

  // Eight random elements of every tensor, against central differences of the summed loss.
  std::mt19937_64 rng(3);
  for (const auto& v : layout.views()) {
    std::uniform_int_distribution<int64_t> pick(0, v.numel - 1);
    std::vector<int64_t> indices;
    for (int k = 0; k < 8; ++k) indices.push_back(v.offset + pick(rng));
    testing::expect_fd_at(
        params.data(), grads.data(), layout.numel(), indices,
        [&] { return model.forward_loss(batch).sum; },
        [](double fd) { return 1e-8 + 1e-6 * std::abs(fd); },
        [&](int64_t i) {
          return i < 0 ? v.name : v.name + " element " + std::to_string(i - v.offset);
        },
        scale);
  }
}

TEST(ModelGrad, FiniteDifferences) { check_gradients(testing::tiny_config(), false); }

TEST(ModelGrad, FiniteDifferencesWithCheckpoint) {
  check_gradients(testing::tiny_config(), true);
}

TEST(ModelGrad, FiniteDifferencesWithBiasesAndOneKvHead) {
  ModelConfig c = testing::tiny_config();
  c.qkv_bias = true;
  c.o_bias = true;
  c.mlp_bias = true;  // Llama's gate/up/down biases
  c.num_kv_attention_heads = 1;  // GQA with a single group
  check_gradients(c, false);
}

// Sliding window 3 (documents of 7, 5 and 6 tokens) in layer 1 only, and an explicit head_dim 6
// (q/k/v of 4·6 and 2·6 features, wo [16, 24]).
TEST(ModelGrad, FiniteDifferencesWithWindowAndHeadDim) {
  ModelConfig c = testing::tiny_config();
  c.sliding_window = 3;
  c.window_layers = {false, true};  // layer 1 only
  c.explicit_head_dim = 6;
  check_gradients(c, false);
}

// Qwen3's per-head q/k RMSNorm (QkNorm) between wqkv and RoPE, with an explicit head_dim 6 (heads
// of 6 features over hidden 16) and a window in layer 1: the q/k norm weights' gradients too.
TEST(ModelGrad, FiniteDifferencesWithQkNorm) {
  ModelConfig c = testing::tiny_config();
  c.type = "qwen3";
  c.explicit_head_dim = 6;
  c.sliding_window = 3;
  c.window_layers = {false, true};
  check_gradients(c, false);
}

// The q/k norms through the chunked recomputation (chunks of 5 tokens), one kv head, biases on
// q, k, v and o (Qwen3's attention_bias), and through the unchunked recomputation.
TEST(ModelGrad, FiniteDifferencesWithQkNormThroughChunks) {
  ModelConfig c = testing::tiny_config();
  c.type = "qwen3";
  c.chunk_tokens = 5;
  c.num_kv_attention_heads = 1;
  c.qkv_bias = c.o_bias = true;
  check_gradients(c, true);
}

TEST(ModelGrad, CheckpointGivesIdenticalGradients) {
  ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  Params<double> params(layout), plain(layout), recomputed(layout);
  randomize(params, 5);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  Decoder<double> model(layout, params);
  const LossSum a = model.forward_backward(batch, plain, 1.0);
  model.set_checkpoint(true);
  const LossSum b = model.forward_backward(batch, recomputed, 1.0);
  EXPECT_EQ(a.sum, b.sum);
  EXPECT_EQ(a.count, b.count);
  for (int64_t i = 0; i < layout.numel(); ++i)
    ASSERT_EQ(plain.data()[i], recomputed.data()[i]) << "element " << i;
}

// Under bf16 mixed precision the block inputs are saved in bf16 without checkpoint and in fp32
// with it (so the recomputed block matches its forward); both round x the same way for the
// norm's backward, so the gradients agree bitwise, and forward_loss runs the same forward.
/// The body of CheckpointGivesIdenticalGradientsInBf16 for a model of family `type`.
void expect_bf16_checkpoint_identical(const std::string& type) {
  ModelConfig c = testing::tiny_config();
  c.type = type;
  const ParamTable layout(c);
  Params<double> wide(layout);
  randomize(wide, 5);
  Params<float> params(layout), plain(layout), recomputed(layout);
  for (int64_t i = 0; i < layout.numel(); ++i) params.data()[i] = float(wide.data()[i]);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  const ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  Decoder<float> model(layout, params, make_dense_ops<float>(layout, bf16));
  const LossSum a = model.forward_backward(batch, plain, 1.0);
  EXPECT_EQ(model.forward_loss(batch).sum, a.sum);
  model.set_checkpoint(true);
  const LossSum b = model.forward_backward(batch, recomputed, 1.0);
  EXPECT_EQ(a.sum, b.sum);
  EXPECT_EQ(a.count, b.count);
  double norm = 0;
  for (int64_t i = 0; i < layout.numel(); ++i) {
    ASSERT_EQ(plain.data()[i], recomputed.data()[i]) << "element " << i;
    norm += double(plain.data()[i]) * plain.data()[i];
  }
  EXPECT_GT(norm, 0);
}

TEST(ModelGrad, CheckpointGivesIdenticalGradientsInBf16) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  expect_bf16_checkpoint_identical("internlm2");
  expect_bf16_checkpoint_identical("qwen3");  // the q/k norms between wqkv and RoPE
}

// The chunked recomputation (model.checkpoint with model.chunk_tokens): chunks of 5 tokens put
// chunk boundaries inside documents (the 7-token document spans two), and the attention runs in
// groups of 20 queries (whole documents), so the row's last segments are a second kernel call.
TEST(ModelGrad, FiniteDifferencesThroughChunks) {
  ModelConfig c = testing::tiny_config();
  c.chunk_tokens = 5;
  check_gradients(c, true);
}

// Chunks of 2 tokens (attention groups of 8: the 7-token document is a group of its own), a
// sliding window of 3 in layer 1 and head_dim 6, biases and one kv head.
TEST(ModelGrad, FiniteDifferencesThroughChunksWithWindowAndBiases) {
  ModelConfig c = testing::tiny_config();
  c.chunk_tokens = 2;
  c.sliding_window = 3;
  c.window_layers = {false, true};  // layer 1 only
  c.explicit_head_dim = 6;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.num_kv_attention_heads = 1;
  check_gradients(c, true);
}

/// Largest |a − b| over the largest |b| (0 when b is all zero).
template <typename T>
double relative_max_error(const T* a, const T* b, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? err / scale : err;
}

// Every chunk size gives each token the loss of unchunked execution (recomputation off, the
// whole row per call) and the same gradients up to the order in which chunks add them up.
TEST(ModelGrad, ChunksGiveUnchunkedValues) {
  ModelConfig c = testing::tiny_config();
  c.sliding_window = 4;
  const ParamTable layout(c);
  Params<double> params(layout), plain(layout);
  randomize(params, 9);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  Decoder<double> reference(layout, params);
  const LossSum a = reference.forward_backward(batch, plain, 0.5);
  std::vector<double> want;
  reference.forward_loss(batch, &want);
  for (int64_t chunk : {1, 3, 5, 7, 23, 24, 4096}) {
    ModelConfig cc = c;
    cc.checkpoint = true;
    cc.chunk_tokens = chunk;
    const ParamTable chunked_layout(cc);
    Params<double> grads(chunked_layout);
    Decoder<double> model(chunked_layout, params);
    ASSERT_TRUE(model.chunked());
    const LossSum b = model.forward_backward(batch, grads, 0.5);
    EXPECT_NEAR(a.sum, b.sum, 1e-13 * std::abs(a.sum)) << "chunk " << chunk;
    EXPECT_EQ(a.count, b.count);
    std::vector<double> got;
    model.forward_loss(batch, &got);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-13 * std::max(1.0, std::abs(want[i])))
          << "chunk " << chunk << " token " << i;
    EXPECT_LT(relative_max_error(grads.data(), plain.data(), layout.numel()), 1e-12)
        << "chunk " << chunk;
  }
}

// Under bf16 the chunked recomputation keeps the block inputs in bf16, as the forward reads them:
// every chunk size gives the gradients and token losses of the unchunked bf16 path (no
// recomputation) within float rounding of the sums' order.
/// The body of ChunksGiveUnchunkedValuesInBf16 for a model of family `type`.
void expect_bf16_chunks_match(const std::string& type) {
  ModelConfig c = testing::tiny_config();
  c.type = type;
  const ParamTable layout(c);
  Params<double> wide(layout);
  randomize(wide, 5);
  Params<float> params(layout), plain(layout);
  for (int64_t i = 0; i < layout.numel(); ++i) params.data()[i] = float(wide.data()[i]);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  const ops::ComputeContext bf16(ops::ComputeType::kBFloat16);
  Decoder<float> reference(layout, params, make_dense_ops<float>(layout, bf16));
  const LossSum a = reference.forward_backward(batch, plain, 1.0);
  std::vector<double> want;
  reference.forward_loss(batch, &want);
  for (int64_t chunk : {2, 5, 4096}) {
    ModelConfig cc = c;
    cc.checkpoint = true;
    cc.chunk_tokens = chunk;
    const ParamTable chunked_layout(cc);
    Params<float> grads(chunked_layout);
    Decoder<float> model(chunked_layout, params, make_dense_ops<float>(chunked_layout, bf16));
    const LossSum b = model.forward_backward(batch, grads, 1.0);
    EXPECT_NEAR(a.sum, b.sum, 1e-5 * std::abs(a.sum)) << "chunk " << chunk;
    std::vector<double> got;
    model.forward_loss(batch, &got);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])))
          << "chunk " << chunk << " token " << i;
    EXPECT_LT(relative_max_error(grads.data(), plain.data(), layout.numel()), 1e-5)
        << "chunk " << chunk;
  }
}

TEST(ModelGrad, ChunksGiveUnchunkedValuesInBf16) {
  const longtron::testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  expect_bf16_chunks_match("internlm2");
  expect_bf16_chunks_match("qwen3");  // the q/k norms between wqkv and RoPE
}

// A forward-only call after training reuses the training buffers, and one before it allocates
// no more than training does (validation never needs more memory than the step).
TEST(ModelGrad, ChunkedForwardNeedsNoMoreThanTraining) {
  ModelConfig c = testing::tiny_config();
  c.checkpoint = true;
  c.chunk_tokens = 5;
  const ParamTable layout(c);
  Params<double> params(layout), grads(layout);
  randomize(params, 3);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  Decoder<double> model(layout, params);
  model.forward_loss(batch);
  const int64_t forward = model.workspace_bytes();
  model.forward_backward(batch, grads, 1.0);
  const int64_t train = model.workspace_bytes();
  EXPECT_GT(forward, 0);
  EXPECT_LT(forward, train);
  model.forward_loss(batch);
  EXPECT_EQ(model.workspace_bytes(), train);
  // The memory plan's count (workspace_elements with a chunk) is what the model allocates.
  const double N = static_cast<double>(batch.input_ids.size());
  WorkspaceShape shape{double(c.num_layers), N, N, double(c.hidden_size), double(c.qkv_size()),
                       double(c.ffn_size()), double(c.attention_size()), N * double(c.qkv_size()),
                       N * double(c.num_attention_heads)};
  shape.chunk = 5;
  EXPECT_EQ(workspace_elements(shape) * sizeof(double), double(train));
  shape.train = false;
  EXPECT_EQ(workspace_elements(shape) * sizeof(double), double(forward));
}

TEST(ModelGrad, GradientsAccumulate) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  Params<double> params(layout), once(layout), twice(layout);
  randomize(params, 9);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  Decoder<double> model(layout, params);
  model.forward_backward(batch, once, 1.0);
  model.forward_backward(batch, twice, 0.5);
  model.forward_backward(batch, twice, 1.5);
  for (int64_t i = 0; i < layout.numel(); ++i)
    ASSERT_NEAR(twice.data()[i], 2.0 * once.data()[i], 1e-12 + 1e-10 * std::abs(once.data()[i]));
}

TEST(ModelGrad, WorkspaceRelayoutKeepsResults) {
  // A model first used for generation/eval (compact workspace, shorter rows) and then for
  // training gives the same gradients as a fresh one.
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  Params<double> params(layout), fresh_g(layout), used_g(layout);
  randomize(params, 17);
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  Decoder<double> fresh(layout, params), used(layout, params);
  const std::vector<int32_t> prompt = {5, 6, 7};
  used.logits_last(prompt);
  used.forward_loss(batch);
  const LossSum a = fresh.forward_backward(batch, fresh_g, 1.0);
  const LossSum b = used.forward_backward(batch, used_g, 1.0);
  EXPECT_EQ(a.sum, b.sum);
  for (int64_t i = 0; i < layout.numel(); ++i) ASSERT_EQ(fresh_g.data()[i], used_g.data()[i]);
  EXPECT_EQ(fresh.logits_last(prompt), used.logits_last(prompt));
}

TEST(ModelGrad, BadBatchesAreErrors) {
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  Params<double> params(layout), grads(layout);
  Decoder<double> model(layout, params);
  data::MicroBatch b = tiny_row(c.vocab_size);
  b.input_ids[3] = 32;  // outside the vocabulary
  EXPECT_THROW(model.forward_loss(b), longtron::Error);
  b = tiny_row(c.vocab_size);
  b.labels[2] = -5;
  EXPECT_THROW(model.forward_backward(b, grads, 1.0), longtron::Error);
  b = tiny_row(c.vocab_size);
  b.cu_seqlens.back() = 23;
  EXPECT_THROW(model.forward_loss(b), longtron::Error);
  b = tiny_row(c.vocab_size);
  b.indexes.pop_back();
  EXPECT_THROW(model.forward_loss(b), longtron::Error);
  // Fewer than 2 offsets: the message once read front() and back() of the empty vector.
  for (const size_t n : {0, 1}) {
    b = tiny_row(c.vocab_size);
    b.cu_seqlens.resize(n);
    EXPECT_THROW(model.forward_loss(b), longtron::Error) << n << " offsets";
    EXPECT_THROW(model.forward_backward(b, grads, 1.0), longtron::Error) << n << " offsets";
  }
}

TEST(ModelGrad, LogitsLastMatchesTokenLoss) {
  // The loss of the last prompt token's label equals lse − logit from logits_last.
  const ModelConfig c = testing::tiny_config();
  const ParamTable layout(c);
  Params<double> params(layout);
  randomize(params, 13);
  Decoder<double> model(layout, params);
  const std::vector<int32_t> doc = {3, 9, 27, 4, 11};
  data::MicroBatch b;
  testing::append_document(b, doc);
  std::vector<double> losses;
  model.forward_loss(b, &losses);
  const std::vector<double> logits =
      model.logits_last(std::span<const int32_t>(doc.data(), doc.size() - 1));
  double mx = logits[0];
  for (double l : logits) mx = std::max(mx, l);
  double se = 0;
  for (double l : logits) se += std::exp(l - mx);
  EXPECT_NEAR(losses[3], mx + std::log(se) - logits[11], 1e-12);
  EXPECT_EQ(losses[4], 0.0);  // last token: label -100
}

// The head's chunk: at most 2^22 logits and ceil(N / 32) rows, at least 256 rows (or 64 for a
// vocabulary over 2^16), so a rank's chunk shrinks with its rows.
TEST(ModelGrad, HeadChunkRowsShrinkWithTheRows) {
  EXPECT_EQ(head_chunk_rows(4096, 32768), 1024);    // one process, the docs/isp.md row: the cap
  EXPECT_EQ(head_chunk_rows(4096, 8192), 256);      // the same row on 4 context ranks
  EXPECT_EQ(head_chunk_rows(4096, 16384), 512);
  EXPECT_EQ(head_chunk_rows(4096, 1 << 20), 1024);  // never over 2^22 logits
  EXPECT_EQ(head_chunk_rows(96, 200), 256);         // short rows: one chunk of 256 >= N
  EXPECT_EQ(head_chunk_rows(32000, 8192), 131);     // 2^22 / V below 256 rows
  EXPECT_EQ(head_chunk_rows(1 << 20, 8192), 64);    // never under 64 rows
}

// The chunked head + cross-entropy gives the same loss, token losses, dX and dW whatever the chunk
// (one row, rows not dividing N, all rows at once), up to double rounding of the sums.
TEST(ModelGrad, ChunkedHeadLossDoesNotDependOnTheChunk) {
  const int64_t N = 37, V = 11, H = 5;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(size_t(N * H)), W(size_t(V * H));
  for (double& e : x) e = normal(rng);
  for (double& e : W) e = normal(rng);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) labels[size_t(n)] = n % 6 == 5 ? -100 : int32_t(n * 7 % V);
  struct Result {
    LossSum loss;
    std::vector<double> dx, dW, token;
  };
  const auto run = [&](int64_t chunk) {
    Result r;
    r.dx.assign(size_t(N * H), 0.0);
    r.dW.assign(size_t(V * H), 0.0);
    r.token.assign(size_t(N), 0.0);
    HeadChunks<double> scratch;
    r.loss = chunked_head_loss(ops::ComputeContext::fp32(), scratch, r.dx.data(), r.dW.data(),
                               x.data(), W.data(),
                               labels.data(), N, V, H, chunk, 0.5, r.token.data());
    return r;
  };
  const Result whole = run(N);
  EXPECT_EQ(whole.loss.count, N - N / 6);
  for (const int64_t chunk : {int64_t(1), int64_t(8), int64_t(36), int64_t(64)}) {
    const Result r = run(chunk);
    EXPECT_EQ(r.loss.count, whole.loss.count) << chunk;
    EXPECT_NEAR(r.loss.sum, whole.loss.sum, 1e-12 * std::abs(whole.loss.sum)) << chunk;
    for (size_t i = 0; i < r.dx.size(); ++i) EXPECT_NEAR(r.dx[i], whole.dx[i], 1e-13) << chunk;
    for (size_t i = 0; i < r.dW.size(); ++i) EXPECT_NEAR(r.dW[i], whole.dW[i], 1e-12) << chunk;
    for (size_t i = 0; i < r.token.size(); ++i)
      EXPECT_NEAR(r.token[i], whole.token[i], 1e-13) << chunk;
  }
}

}  // namespace
}  // namespace longtron::model
