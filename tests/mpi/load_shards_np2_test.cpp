// Loading a Hugging Face folder straight into each rank's shards (train::load_hf_shards, the
// start-up of --init-from and --resume) under the 2-rank layouts: the parameters equal the slices
// of the full load bit for bit, and a rank whose tensors are split decodes only its part.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/hf_config.h"
#include "model/params.h"
#include "modes/engine.h"
#include "mpi_test_main.h"
#include "parallel/layout.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace longtron::testing {
namespace {
namespace fs = std::filesystem;
namespace st = safetensors;
using parallel::TensorMode;

// A Llama whose q/k/v come from rows of the engine's fused wqkv, kv heads divisible by 2 ranks,
// with biases on q/k/v (split with their rows) and an untied head.
model::ModelConfig model_config(bool tied) {
  model::ModelConfig c;
  c.type = tied ? "qwen2" : "llama";
  c.qkv_bias = tied;
  c.tie_word_embeddings = tied;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;
  c.multiple_of = 16;
  return c;
}

parallel::Layout layout(int tp, TensorMode mode, int weight = 1) {
  parallel::Layout l;
  l.tensor_size = tp;
  l.tensor_mode = mode;
  l.weight_size = weight;
  return l;
}

void check_layout(const std::string& name, const parallel::Layout& l, bool tied) {
  SCOPED_TRACE(name + (tied ? " (qwen2, tied)" : " (llama)"));
  const model::ModelConfig config = model_config(tied);
  TempDir dir;  // each rank writes the same folder into its own
  {
    const model::ParamTable full(config);
    model::Params<float> p(full);
    model::init_params(p, 3);
    model::write_hf_config(dir / "config.json", config);
    const train::HfTensors named = train::hf_named_tensors(p);
    std::vector<st::WriteTensor> tensors;
    for (const auto& t : named.tensors)
      tensors.push_back({t.name, t.shape, st::DType::BF16, t.data, nullptr});
    st::write_file(dir / "model.safetensors", tensors);
  }
  const parallel::Grid grid = parallel::make_grid(world(), l);
  parallel::ParallelEngine engine(config, grid, 0, parallel::ParallelEngine::Unfilled{});
  const uint64_t decoded = train::load_hf_shards(dir.path(), engine.plan(), engine.params());
  // The reference: the whole folder into a full buffer, then this rank's slices.
  model::Params<float> full(engine.full_layout()), expected(engine.local_layout());
  train::load_hf_model(dir.path(), full);
  engine.scatter_full(expected, full);
  ASSERT_EQ(engine.params().numel(), expected.numel());
  EXPECT_EQ(std::memcmp(engine.params().data(), expected.data(),
                        size_t(expected.numel()) * sizeof(float)), 0);
  const uint64_t file_bytes = st::Reader(dir.path()).data_bytes();
  if (l.is_isp() && l.weight_size == 1)
    EXPECT_EQ(decoded, file_bytes) << "ISP without weight parallelism replicates every weight";
  else
    EXPECT_LT(decoded, file_bytes) << "a split layout reads only this rank's part";
  EXPECT_GT(decoded, 0u);
}

TEST(LoadShardsNp2, EveryLayoutGetsTheSlicesOfTheFullLoad) {
  ASSERT_EQ(world()->size(), 2);
  for (bool tied : {false, true}) {
    check_layout("tp2 mtp", layout(2, TensorMode::kMtp), tied);
    check_layout("tp2 msp", layout(2, TensorMode::kMsp), tied);
    check_layout("tp2 fsp", layout(2, TensorMode::kFsp), tied);
    check_layout("isp t2 w2", layout(2, TensorMode::kIsp, 2), tied);
    check_layout("isp t2 w1", layout(2, TensorMode::kIsp, 1), tied);
  }
}

}  // namespace
}  // namespace longtron::testing
