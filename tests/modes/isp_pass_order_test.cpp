// ISP's weight store (modes/isp_weights.h) on a one-rank WEIGHT group: the embedding begins every
// pass (dropping gathered copies an optimizer step made stale); an op that gathers its weight for
// a forward after the last pass's backward, before the embedding, is an Error at the embedding.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/params.h"
#include "modes/isp_weights.h"

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

}  // namespace
}  // namespace longtron::parallel
