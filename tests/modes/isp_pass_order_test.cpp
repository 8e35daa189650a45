// ISP's weight store (modes/isp_weights.h) on a one-rank WEIGHT group: the embedding begins every
// pass (dropping gathered copies an optimizer step made stale); an op that gathers its weight for
// a forward after the last pass's backward, before the embedding, is an Error at the embedding.
// And IspLinear's bf16 forms: the output's bits written by the GEMM, the input read as bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bf16_here.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "model/model_testing.h"
#include "model/params.h"
#include "modes/isp_weights.h"
#include "ops/compute_context.h"
#include "ops/ops.h"

namespace longtron::parallel {
namespace {

TEST(IspPassOrder, AnOpBeforeTheEmbeddingIsAnError) {
  model::ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_layers = 1;
  c.num_attention_heads = 2;
  c.num_kv_attention_heads = 1;
  const model::ParamTable full(c);
  model::Params<float> params(full), grads(full);
  model::init_params(params, 3);
  const int64_t H = c.hidden_size, N = 3;
  const model::ParamView& wo = full.view(full.layers[0].wo);
  auto store = std::make_shared<IspWeightStore>(comm::make_local_communicator(), false);
  IspEmbedding emb(store, full.tok_embeddings, c.vocab_size, H);
  IspLinear lin(store, full.layers[0].wo, -1, wo.shape[0], wo.shape[1]);
  const std::vector<int32_t> ids = {1, 4, 7};
  std::vector<float> x(N * H), y(N * wo.shape[0]), dx(N * wo.shape[1]);
  const std::vector<float> dy(N * wo.shape[0], 0.5f);
  auto pass = [&] {  // embedding, linear forward and backward: the order of a model's pass
    emb.forward(x.data(), ids.data(), N, params);
    lin.forward(y.data(), x.data(), N, params);
    lin.backward(dx.data(), dy.data(), x.data(), N, params, &grads, false);
  };
  pass();
  pass();
  lin.forward(y.data(), x.data(), N, params);  // a recomputation inside the pass is fine ...
  lin.backward(dx.data(), dy.data(), x.data(), N, params, &grads, false);
  pass();
  lin.forward(y.data(), x.data(), N, params);  // ... an op before the next pass's embedding is not
  EXPECT_THROW(emb.forward(x.data(), ids.data(), N, params), Error);
  // Forward-only passes (evaluation) gather no backward: any order of them is accepted.
  auto eval_store = std::make_shared<IspWeightStore>(comm::make_local_communicator(), false);
  IspEmbedding emb2(eval_store, full.tok_embeddings, c.vocab_size, H);
  IspLinear lin2(eval_store, full.layers[0].wo, -1, wo.shape[0], wo.shape[1]);
  for (int k = 0; k < 2; ++k) {
    emb2.forward(x.data(), ids.data(), N, params);
    lin2.forward(y.data(), x.data(), N, params);
  }
  EXPECT_NO_THROW(emb2.forward(x.data(), ids.data(), N, params));
}

// forward_out16 is round_to_bf16 of forward's output under bf16 without a bias, and nothing
// (false, no bits written) under fp32 or with a bias; under bf16 the input is read as bits only.
TEST(IspLinear, Out16IsTheRoundedForward) {
  if (longtron::testing::bf16_gemm_refused_here()) return;
  model::ModelConfig c = testing::tiny_config();
  c.mlp_bias = true;
  const model::ParamTable full(c);
  model::Params<float> params(full);
  model::init_params(params, 5);
  const model::ParamView& w1 = full.view(full.layers[0].w1);
  const int64_t N = 5, out = w1.shape[0], in = w1.shape[1];
  std::vector<float> x(N * in);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.05f * static_cast<float>(i % 23) - 0.5f;
  ops::ComputeContext fp32, bf16(ops::ComputeType::kBFloat16);
  for (const ops::ComputeContext* cc : {&fp32, &bf16}) {
    auto store = std::make_shared<IspWeightStore>(comm::make_local_communicator(), false, *cc);
    IspLinear plain(store, full.layers[0].w1, -1, out, in);
    IspLinear biased(store, full.layers[0].w1, full.layers[0].w1_bias, out, in);
    EXPECT_EQ(plain.reads_shared_input_bits_only(*cc), cc->bf16());
    EXPECT_FALSE(plain.reads_shared_input_bits_only(cc == &bf16 ? fp32 : bf16));
    std::vector<uint16_t> y16(N * out, 7), want(N * out);
    EXPECT_FALSE(biased.forward_out16(y16.data(), x.data(), N, params));
    EXPECT_EQ(plain.forward_out16(y16.data(), x.data(), N, params), cc->bf16());
    if (!cc->bf16()) {
      EXPECT_EQ(y16, std::vector<uint16_t>(N * out, 7));
      continue;
    }
    std::vector<float> y(N * out);
    plain.forward(y.data(), x.data(), N, params);
    ops::round_to_bf16(y.data(), N * out, want.data());
    EXPECT_EQ(y16, want);
  }
}

}  // namespace
}  // namespace longtron::parallel
