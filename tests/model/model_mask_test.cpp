// Document-mask invariance : in float, a document no longer than seq_len and
// not cut by a row edge has the same loss packed with others, packed alone, or alone with a pad
// segment (1e-6 relative) — attention never crosses a cu_seqlens boundary and every other op is
// per token.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/decoder.h"
#include "model_testing.h"

namespace longtron::model {
namespace {

using testing::append_document;
using testing::append_pad;
using testing::random_document;

ModelConfig mask_config() {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;
  c.multiple_of = 16;
  return c;
}

/// Weights of order 0.3 so that a leak across documents would move the loss visibly.
void randomize(Params<float>& p) {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (const auto& v : p.layout().views()) {
    float* x = p.data() + v.offset;
    for (int64_t i = 0; i < v.numel; ++i) x[i] = v.is_norm ? 1.0f + normal(rng) : normal(rng);
  }
}

double loss_of(Decoder<float>& model, const data::MicroBatch& b, int64_t begin, int64_t len) {
  std::vector<double> losses;
  model.forward_loss(b, &losses);
  double s = 0;
  for (int64_t i = begin; i < begin + len; ++i) s += losses[static_cast<size_t>(i)];
  return s;
}

TEST(ModelMask, DocumentLossIndependentOfNeighbours) {
  const ModelConfig c = mask_config();
  const ParamTable layout(c);
  Params<float> params(layout);
  randomize(params);
  Decoder<float> model(layout, params);
  std::mt19937_64 rng(4);
  const int64_t seq_len = 64;
  const std::vector<int32_t> doc = random_document(rng, 50, c.vocab_size);

  // Packed: P = 4 × 64 = 256 tokens; the document starts at token 71 after three others.
  data::MicroBatch packed;
  for (int64_t len : {30, 1, 40}) append_document(packed, random_document(rng, len, c.vocab_size));
  append_document(packed, doc);
  for (int64_t len : {64, 17}) append_document(packed, random_document(rng, len, c.vocab_size));
  append_pad(packed, static_cast<int32_t>(256 - packed.input_ids.size()));
  ASSERT_EQ(packed.input_ids.size(), 256u);
  const double in_pack = loss_of(model, packed, 71, 50);

  data::MicroBatch alone;
  append_document(alone, doc);
  const double by_itself = loss_of(model, alone, 0, 50);

  data::MicroBatch padded;  // the unpacked form: one document per seq_len slot, then pad
  append_document(padded, doc);
  append_pad(padded, static_cast<int32_t>(seq_len - 50));
  const double unpacked = loss_of(model, padded, 0, 50);

  EXPECT_GT(in_pack, 1.0);
  EXPECT_NEAR(in_pack, by_itself, 1e-6 * std::abs(by_itself));
  EXPECT_NEAR(unpacked, by_itself, 1e-6 * std::abs(by_itself));

  // Negative control: merging the document into its predecessor's segment (a missing mask)
  // changes its loss by far more than the tolerance, so the test can fail.
  data::MicroBatch leaky = packed;
  leaky.cu_seqlens.erase(leaky.cu_seqlens.begin() + 3);  // drop the boundary at token 71
  for (int64_t i = 0; i < 50; ++i) leaky.indexes[static_cast<size_t>(71 + i)] = int32_t(40 + i);
  const double leaked = loss_of(model, leaky, 71, 50);
  EXPECT_GT(std::abs(leaked - by_itself), 1e-3 * std::abs(by_itself));
}

}  // namespace
}  // namespace longtron::model
