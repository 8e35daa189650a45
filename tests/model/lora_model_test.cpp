// LoRA inside the model (model/lora.h): adapter gradients against central finite differences in
// double (with and without dropout, whose mask is fixed by (seed, step), with use_rslora, with
// recomputation), a frozen base, and the merged forward W + s·B·A equal to the adapted one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "bf16_here.h"
#include "core/error.h"
#include "expect_error.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "model_testing.h"
#include "ops/compute_context.h"
#include "ops/fd_check.h"

namespace longtron::model {
namespace {

using testing::tiny_row;

void randomize(double* x, int64_t n, uint64_t seed, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, sd);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(rng);
}

/// A tiny model with adapters, over double.
struct Adapted {
  ParamTable base;
  std::vector<LoraModule> modules;
  ParamTable table;
  Params<double> params, grads, adapter;
  std::shared_ptr<LoraState<double>> state;
  std::unique_ptr<Decoder<double>> model;

  explicit Adapted(const ModelConfig& c)
      : base(c), modules(lora_modules(base, c.lora)), table(lora_table(base, modules, c.lora.rank)),
        params(base), grads(base), adapter(table) {
    for (const auto& v : base.views()) {
      double* x = params.data() + v.offset;
      randomize(x, v.numel, 11 + uint64_t(v.offset), 0.4);
      if (v.is_norm)
        for (int64_t i = 0; i < v.numel; ++i) x[i] += 1.0;
    }
    randomize(adapter.data(), table.numel(), 5, 0.3);  // B non-zero so A's gradient is too
    state = std::make_shared<LoraState<double>>();
    state->config = c.lora;
    state->step = 3;
    state->params = &adapter;
    state->grads = new Params<double>(table);
    ModelOps<double> ops = make_dense_ops<double>(base);
    apply_lora<double>(ops, base, modules, table, state,
                       [](int, int) { return LoraLinearSpec<double>{}; });
    model = std::make_unique<Decoder<double>>(base, params, std::move(ops));
  }
  ~Adapted() { delete state->grads; }
  Params<double>& adapter_grads() { return *state->grads; }
};

ModelConfig lora_config(const std::string& type, double dropout, bool rslora) {
  ModelConfig c = testing::tiny_config();
  c.type = type;
  c.lora.rank = 3;
  c.lora.alpha = 5.0;
  c.lora.dropout = dropout;
  c.lora.use_rslora = rslora;
  c.lora.seed = 9;
  return c;
}

void check_adapter_gradients(const ModelConfig& c, bool checkpoint) {
  ModelConfig cc = c;
  cc.checkpoint = checkpoint;
  Adapted m(cc);
  m.state->training = true;  // dropout on, its mask fixed by (seed, step)
  const data::MicroBatch batch = tiny_row(cc.vocab_size);
  const double scale = 0.37;
  m.model->forward_backward(batch, m.grads, scale);
  // The frozen base gets no gradient.
  for (int64_t i = 0; i < m.base.numel(); ++i) ASSERT_EQ(m.grads.data()[i], 0.0) << i;
  std::mt19937_64 rng(3);
  for (const auto& v : m.table.views()) {
    std::uniform_int_distribution<int64_t> pick(0, v.numel - 1);
    std::vector<int64_t> indices;
    for (int k = 0; k < 6; ++k) indices.push_back(v.offset + pick(rng));
    testing::expect_fd_at(
        m.adapter.data(), m.adapter_grads().data(), m.table.numel(), indices,
        [&] { return m.model->forward_loss(batch).sum; },
        [](double fd) { return 1e-8 + 1e-6 * std::abs(fd); },
        [&](int64_t i) {
          return i < 0 ? v.name : v.name + " element " + std::to_string(i - v.offset);
        },
        scale);
  }
}

TEST(LoraModel, FiniteDifferencesInternLM2) {
  check_adapter_gradients(lora_config("internlm2", 0.0, false), false);
}
TEST(LoraModel, FiniteDifferencesLlamaWithDropout) {
  check_adapter_gradients(lora_config("llama", 0.3, false), false);
}
TEST(LoraModel, FiniteDifferencesRsLoraDropoutCheckpoint) {
  check_adapter_gradients(lora_config("llama", 0.2, true), true);
}
// Qwen3: PEFT's q/k/v/o_proj, gate/up/down_proj targets; its q/k norms stay frozen with the rest
// of the base (no gradient), through the chunked recomputation too.
TEST(LoraModel, FiniteDifferencesQwen3WithFrozenQkNorms) {
  const ModelConfig c = lora_config("qwen3", 0.2, false);
  Adapted probe(c);
  ASSERT_EQ(probe.modules.size(), 7u * size_t(c.num_layers));
  EXPECT_EQ(probe.modules[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(probe.modules[6].module, "model.layers.0.mlp.down_proj");
  ASSERT_GE(probe.base.layers[0].q_norm, 0);
  check_adapter_gradients(c, false);
  check_adapter_gradients(c, true);
}
TEST(LoraModel, FiniteDifferencesSomeTargets) {
  ModelConfig c = lora_config("llama", 0.1, false);
  c.lora.targets = {"v_proj", "q_proj", "down_proj"};
  Adapted probe(c);
  ASSERT_EQ(probe.modules.size(), 3u * size_t(c.num_layers));
  EXPECT_EQ(probe.modules[0].target, "q_proj");
  EXPECT_EQ(probe.modules[1].target, "v_proj");
  check_adapter_gradients(c, false);
}

// The chunked recomputation (model.chunk_tokens smaller than the row, boundaries inside
// documents) drops the same elements as one pass over the row: dropout's mask follows each
// token's row position, so the loss and the adapter gradients equal the unchunked ones.
TEST(LoraModel, ChunkedRecomputationKeepsEachTokensMask) {
  ModelConfig c = lora_config("llama", 0.4, false);
  c.checkpoint = true;
  const data::MicroBatch batch = tiny_row(c.vocab_size);
  auto run = [&](int64_t chunk) {
    ModelConfig cc = c;
    cc.chunk_tokens = chunk;
    auto m = std::make_unique<Adapted>(cc);
    m->state->training = true;
    const double loss = m->model->forward_backward(batch, m->grads, 1.0).sum;
    return std::make_pair(loss, std::vector<double>(m->adapter_grads().data(),
                                                    m->adapter_grads().data() + m->table.numel()));
  };
  const auto [whole, g_whole] = run(4096);
  const auto [chunked, g_chunked] = run(3);
  EXPECT_NEAR(chunked, whole, 1e-12 * std::abs(whole));
  ASSERT_EQ(g_chunked.size(), g_whole.size());
  for (size_t i = 0; i < g_whole.size(); ++i)
    ASSERT_NEAR(g_chunked[i], g_whole[i], 1e-11 * (1.0 + std::abs(g_whole[i]))) << i;
}

// W + s·B·A (merged into the base) gives the adapted forward's loss.
TEST(LoraModel, MergedForwardEqualsAdapted) {
  for (const char* type : {"internlm2", "llama"}) {
    for (bool rslora : {false, true}) {
      Adapted m(lora_config(type, 0.25, rslora));  // dropout: none outside training
      const data::MicroBatch batch = tiny_row(m.base.config().vocab_size);
      std::vector<double> adapted_tokens, merged_tokens;
      const double adapted = m.model->forward_loss(batch, &adapted_tokens).sum;
      Params<double> merged = m.params;
      const double s = m.base.config().lora.scale();
      const int64_t r = m.base.config().lora.rank;
      for (const LoraModule& mod : m.modules) {
        const double* A = m.adapter.ptr(mod.a_view);
        const double* B = m.adapter.ptr(mod.b_view);
        double* W = merged.ptr(mod.base_view);
        int64_t brow = 0;
        for (const auto& [first, count] : mod.rows)
          for (int64_t o = 0; o < count; ++o, ++brow)
            for (int64_t i = 0; i < mod.in; ++i) {
              double acc = 0;
              for (int64_t k = 0; k < r; ++k) acc += B[brow * r + k] * A[k * mod.in + i];
              W[(first + o) * mod.in + i] += s * acc;
            }
      }
      Decoder<double> plain(m.base, merged);
      const double direct = plain.forward_loss(batch, &merged_tokens).sum;
      EXPECT_NEAR(adapted, direct, 1e-11 * std::abs(direct)) << type << " rslora " << rslora;
      for (size_t i = 0; i < merged_tokens.size(); ++i)
        EXPECT_NEAR(adapted_tokens[i], merged_tokens[i], 1e-10) << i;
    }
  }
}

/// The adapters' gradients of one float step of the tiny model (base under `base_cc`); with
/// `adapter_cc` the adapters' GEMMs see that context (nullptr: fp32 adapters).
std::vector<float> float_adapter_grads(const ModelConfig& c, const ops::ComputeContext& base_cc,
                                       const ops::ComputeContext* adapter_cc) {
  const ParamTable base(c);
  const std::vector<LoraModule> modules = lora_modules(base, c.lora);
  const ParamTable table = lora_table(base, modules, c.lora.rank);
  Params<double> params64(base), adapter64(table);
  for (const auto& v : base.views()) {
    double* x = params64.data() + v.offset;
    randomize(x, v.numel, 11 + uint64_t(v.offset), 0.4);
    if (v.is_norm)
      for (int64_t i = 0; i < v.numel; ++i) x[i] += 1.0;
  }
  randomize(adapter64.data(), table.numel(), 5, 0.3);
  Params<float> params(base), grads(base), adapter(table), adapter_grads(table);
  for (int64_t i = 0; i < base.numel(); ++i) params.data()[i] = float(params64.data()[i]);
  for (int64_t i = 0; i < table.numel(); ++i) adapter.data()[i] = float(adapter64.data()[i]);
  auto state = std::make_shared<LoraState<float>>();
  state->config = c.lora;
  state->step = 3;
  state->training = true;
  state->params = &adapter;
  state->grads = &adapter_grads;
  state->compute = adapter_cc;
  ModelOps<float> ops = make_dense_ops<float>(base, base_cc);
  apply_lora<float>(ops, base, modules, table, state, [](int, int) { return LoraLinearSpec<float>{}; });
  Decoder<float> model(base, params, std::move(ops));
  model.forward_backward(tiny_row(c.vocab_size), grads, 1.0);
  return {adapter_grads.data(), adapter_grads.data() + table.numel()};
}

// Under bf16 compute the adapters' GEMMs take bf16 operands with fp32 accumulation (as
// torch.autocast runs PEFT's lora_A and lora_B): their gradients move off the fp32 adapters' by
// bf16's rounding carried through two layers, not more; under float32 the context changes no bit.
TEST(LoraModel, Bf16AdaptersRoundTheirOperandsOnly) {
  const testing::Bf16Here bf16_here;
  if (!bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const char* type : {"internlm2", "llama"}) {
    for (double dropout : {0.0, 0.25}) {
      const ModelConfig c = lora_config(type, dropout, false);
      const ops::ComputeContext bf16(ops::ComputeType::kBFloat16), fp32;
      const std::vector<float> exact = float_adapter_grads(c, bf16, nullptr);
      const std::vector<float> rounded = float_adapter_grads(c, bf16, &bf16);
      double diff = 0, norm = 0;
      for (size_t i = 0; i < exact.size(); ++i) {
        diff += (double(rounded[i]) - exact[i]) * (double(rounded[i]) - exact[i]);
        norm += double(exact[i]) * exact[i];
      }
      EXPECT_GT(diff, 0.0) << type << " dropout " << dropout;  // the bf16 path ran
      std::printf("%s dropout %.2f: relative distance %.4f\n", type, dropout, std::sqrt(diff / norm));
      EXPECT_LT(std::sqrt(diff / norm), 5e-2) << type << " dropout " << dropout;
      const std::vector<float> f32 = float_adapter_grads(c, fp32, nullptr);
      EXPECT_EQ(float_adapter_grads(c, fp32, &fp32), f32) << type << " dropout " << dropout;
    }
  }
}

TEST(LoraModel, InitAndDropoutMask) {
  ModelConfig c = lora_config("llama", 0.5, false);
  c.lora.rank = 4;
  const ParamTable base(c);
  const auto modules = lora_modules(base, c.lora);
  const ParamTable table = lora_table(base, modules, 4);
  const ParamView& a = table.view(modules[0].a_view);
  EXPECT_EQ(a.name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(table.view(modules[1].b_view).shape, (std::vector<int64_t>{modules[1].out, 4}));
  std::vector<double> A(size_t(a.numel));
  lora_init_tensor(A.data(), a, modules[0].a_view, 1);
  const double bound = 1.0 / std::sqrt(double(a.shape[1]));
  double lo = 1, hi = -1;
  for (double x : A) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.5 * bound);
  EXPECT_GT(hi, 0.5 * bound);
  std::vector<double> B(size_t(table.view(modules[0].b_view).numel), 1.0);
  lora_init_tensor(B.data(), table.view(modules[0].b_view), modules[0].b_view, 1);
  for (double x : B) EXPECT_EQ(x, 0.0);
  // The mask: a pure function of its arguments, about p dropped, different per step and module.
  const uint64_t k = lora_dropout_key(1, 2, 0, 0);
  int kept = 0, same_step = 0, same_module = 0;
  for (int64_t pos = 0; pos < 100; ++pos)
    for (int64_t f = 0; f < 100; ++f) {
      const bool keep = lora_keep(k, pos, f, 0.5);
      EXPECT_EQ(keep, lora_keep(lora_dropout_key(1, 2, 0, 0), pos, f, 0.5));
      kept += keep;
      same_step += keep == lora_keep(lora_dropout_key(1, 3, 0, 0), pos, f, 0.5);
      same_module += keep == lora_keep(lora_dropout_key(1, 2, 0, 1), pos, f, 0.5);
    }
  EXPECT_NEAR(kept, 5000, 300);
  EXPECT_NEAR(same_step, 5000, 300);
  EXPECT_NEAR(same_module, 5000, 300);
}

// The step's masks run through lora_dropout_row (row hash hoisted, integer comparison): it must
// drop exactly the elements lora_keep drops, also for a p equal to a draw (kept: draw ≥ p) or
// one ulp beside it, and scale the kept ones by 1/(1 − p), with or without accumulation.
TEST(LoraModel, DropoutRowIsLoraKeep) {
  const uint64_t key = lora_dropout_key(7, 3, 1, 2);
  const int64_t position = 41, col0 = 5, n = 300;
  const uint64_t draw = splitmix64(splitmix64(key + uint64_t(position)) + uint64_t(col0 + 17)) >> 11;
  const double at_draw = std::ldexp(double(draw), -53);
  const auto rows = static_cast<size_t>(n);
  std::vector<double> src(rows), out(rows), acc(rows, 1.0);
  for (int64_t j = 0; j < n; ++j) src[size_t(j)] = 0.25 + double(j);
  for (double p : {0.0, 0.05, 0.5, 0.9, at_draw, std::nextafter(at_draw, 0.0),
                   std::nextafter(at_draw, 1.0)}) {
    lora_dropout_row(out.data(), src.data(), n, key, position, col0, p, false);
    lora_dropout_row(acc.data(), src.data(), n, key, position, col0, p, true);
    int kept = 0;
    for (int64_t j = 0; j < n; ++j) {
      const bool keep = lora_keep(key, position, col0 + j, p);
      kept += keep;
      const double want = keep ? src[size_t(j)] * (1.0 / (1.0 - p)) : 0.0;
      ASSERT_EQ(out[size_t(j)], want) << "p " << p << " feature " << col0 + j;
      ASSERT_EQ(acc[size_t(j)], 1.0 + want) << "p " << p << " feature " << col0 + j;
      acc[size_t(j)] = 1.0;
    }
    if (p == 0.0) {
      EXPECT_EQ(kept, n);
    }
  }
  EXPECT_TRUE(lora_keep(key, position, col0 + 17, at_draw));
  EXPECT_FALSE(lora_keep(key, position, col0 + 17, std::nextafter(at_draw, 1.0)));
}

TEST(LoraModel, BadTargets) {
  testing::expect_error([] { lora_resolve_targets("llama", {"wqkv"}); }, {"'wqkv' is not a linear"});
  testing::expect_error([] { lora_resolve_targets("internlm2", {"q_proj"}); }, {"lora.targets"});
  testing::expect_error([] { lora_resolve_targets("llama", {"q_proj", "q_proj"}); }, {"twice"});
  EXPECT_EQ(lora_resolve_targets("internlm2", {"all-linear"}).size(), 5u);
}

}  // namespace
}  // namespace longtron::model
