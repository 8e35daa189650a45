// Start-up of a run that loads its weights (--init-from, --resume; eval and generate): nothing is
// drawn, no full-model buffer is allocated, each tensor of the file is decoded once straight into
// the engine's parameters, and the result is the one of the full load bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "core/zeroed_buffer.h"
#include "model/hf_config.h"
#include "model/params.h"
#include "modes/engine.h"
#include "parallel/layout.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/model_io.h"

namespace longtron {
namespace {
namespace fs = std::filesystem;
namespace st = safetensors;

// A small Llama (its q/k/v come from the rows of the engine's fused wqkv) with untied head.
model::ModelConfig small_llama() {
  model::ModelConfig c;
  c.type = "llama";
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;
  c.multiple_of = 16;
  return c;
}

// Writes `config` with init_params(seed) weights as a Hugging Face folder of `dtype` tensors.
void write_folder(const fs::path& dir, const model::ModelConfig& config, uint64_t seed,
                  st::DType dtype) {
  const model::ParamTable layout(config);
  model::Params<float> p(layout);
  model::init_params(p, seed);
  fs::create_directories(dir);
  model::write_hf_config(dir / "config.json", config);
  const train::HfTensors named = train::hf_named_tensors(p);
  std::vector<st::WriteTensor> tensors;
  for (const auto& t : named.tensors) tensors.push_back({t.name, t.shape, dtype, t.data, nullptr});
  st::write_file(dir / "model.safetensors", tensors);
}

parallel::Grid one_process() {
  return parallel::make_grid(comm::make_local_communicator(), parallel::Layout{});
}

bool same_bits(const model::Params<float>& a, const model::Params<float>& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)) == 0;
}

class LoadShards : public ::testing::TestWithParam<st::DType> {};

// The rule of a loading start-up: the engine allocates its parameters and gradients and nothing
// else (no random draw, no full copy), the file's tensor bytes are decoded exactly once, and the
// parameters equal those of the full load (load_hf_model) bit for bit.
TEST_P(LoadShards, InitFromAllocatesNoFullCopyAndDecodesEachTensorOnce) {
  testing::TempDir dir;
  const model::ModelConfig config = small_llama();
  write_folder(dir / "hf", config, 11, GetParam());
  const model::ParamTable layout(config);
  model::Params<float> reference(layout);
  train::load_hf_model(dir / "hf", reference);

  const parallel::Grid grid = one_process();
  const int64_t before = zeroed_bytes_allocated();
  parallel::ParallelEngine engine(config, grid, 0, parallel::ParallelEngine::Unfilled{});
  const uint64_t decoded = train::load_hf_shards(dir / "hf", engine.plan(), engine.params());
  const int64_t allocated = zeroed_bytes_allocated() - before;
  EXPECT_EQ(allocated, 2 * layout.numel() * int64_t(sizeof(float)))
      << "parameters and gradients only";
  const st::Reader reader(dir / "hf");
  EXPECT_EQ(decoded, reader.data_bytes()) << "every tensor byte decoded once";
  EXPECT_TRUE(same_bits(engine.params(), reference));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoadShards, ::testing::Values(st::DType::F32, st::DType::BF16),
                         [](const auto& info) { return std::string(st::dtype_name(info.param)); });

// eval and generate: load_model_dir without weights, then load_into_engine reads them into the
// engine's shards; the same parameters as the eager path, and no full copy.
TEST(LoadShards, LoadIntoEngineReadsPendingWeights) {
  testing::TempDir dir;
  const model::ModelConfig config = small_llama();
  write_folder(dir / "hf", config, 5, st::DType::BF16);
  train::LoadedModel eager = train::load_model_dir(dir / "hf");
  auto a = train::load_into_engine(eager, one_process());
  train::LoadedModel lazy = train::load_model_dir(dir / "hf", /*read_weights=*/false);
  EXPECT_TRUE(lazy.weights_pending);
  EXPECT_EQ(lazy.params, nullptr);
  const int64_t before = zeroed_bytes_allocated();
  auto b = train::load_into_engine(lazy, one_process());
  EXPECT_EQ(zeroed_bytes_allocated() - before, 2 * a->full_layout().numel() * int64_t(sizeof(float)));
  EXPECT_TRUE(same_bits(a->params(), b->params()));
}

// A random-init engine draws the numbers init_params draws for the full model (the one-process
// parameters), in place: parameters and gradients are all it allocates.
TEST(LoadShards, RandomInitDrawsInPlaceTheSameNumbers) {
  const model::ModelConfig config = small_llama();
  const model::ParamTable layout(config);
  model::Params<float> reference(layout);
  model::init_params(reference, 42);
  const int64_t before = zeroed_bytes_allocated();
  parallel::ParallelEngine engine(config, one_process(), 42);
  EXPECT_EQ(zeroed_bytes_allocated() - before, 2 * layout.numel() * int64_t(sizeof(float)));
  EXPECT_TRUE(same_bits(engine.params(), reference));
}

// A block of a tensor (one rank's shard) decodes only its rows and columns, the same values as
// the whole tensor's; a block outside the tensor is an error naming it.
TEST(LoadShards, ReadBlockMatchesTheWholeTensor) {
  testing::TempDir dir;
  std::vector<float> m(6 * 5);
  for (size_t i = 0; i < m.size(); ++i) m[i] = 0.25f * float(i) - 3.0f;
  st::write_file(dir / "t.safetensors", {{"m", {6, 5}, st::DType::BF16, m.data(), nullptr}});
  const st::File f(dir / "t.safetensors");
  std::vector<float> block(3 * 2);
  f.read_block("m", 2, 3, 1, 2, block.data());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 2; ++c) EXPECT_EQ(block[size_t(r * 2 + c)], m[size_t((2 + r) * 5 + 1 + c)]);
  EXPECT_EQ(f.bytes_decoded(), 6u * 2u);
  EXPECT_THROW(f.read_block("m", 4, 3, 0, 5, block.data()), Error);
}

// A non-finite element is reported with its index in the whole tensor, also from a block.
TEST(LoadShards, ReadBlockNamesANonFiniteElement) {
  testing::TempDir dir;
  std::vector<float> m(4 * 4, 1.0f);
  m[2 * 4 + 3] = std::numeric_limits<float>::infinity();
  st::write_file(dir / "t.safetensors", {{"m", {4, 4}, st::DType::BF16, m.data(), nullptr}});
  const st::File f(dir / "t.safetensors");
  std::vector<float> block(2 * 2);
  EXPECT_NO_THROW(f.read_block("m", 0, 2, 2, 2, block.data()));
  try {
    f.read_block("m", 2, 2, 2, 2, block.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("element 11 is inf"), std::string::npos) << e.what();
  }
}

// A tensor of more than 2^20 values is decoded in chunks on the compute threads: the same values
// as one read of the whole tensor, and of two non-finite elements the first is reported.
TEST(LoadShards, LargeTensorsDecodeInChunksLikeOneRead) {
  testing::TempDir dir;
  model::ModelConfig config = small_llama();
  config.vocab_size = 40000;  // embedding and head: 1.28M values each, two chunks
  write_folder(dir / "hf", config, 9, st::DType::BF16);
  const model::ParamTable layout(config);
  model::Params<float> loaded(layout);
  train::load_hf_model(dir / "hf", loaded);
  const st::Reader reader(dir / "hf");
  const std::vector<float> whole = reader.file_of("model.embed_tokens.weight").read_floats("model.embed_tokens.weight");
  ASSERT_EQ(int64_t(whole.size()), layout.view(layout.tok_embeddings).numel);
  EXPECT_EQ(std::memcmp(whole.data(), loaded.ptr(layout.tok_embeddings), whole.size() * 4), 0);

  model::Params<float> bad(layout);
  model::init_params(bad, 9);
  const int64_t first = 500000, second = 1250000;  // in the first chunk and in the second
  bad.ptr(layout.tok_embeddings)[second] = std::numeric_limits<float>::quiet_NaN();
  bad.ptr(layout.tok_embeddings)[first] = std::numeric_limits<float>::infinity();
  const train::HfTensors named = train::hf_named_tensors(bad);
  std::vector<st::WriteTensor> tensors;
  for (const auto& t : named.tensors) tensors.push_back({t.name, t.shape, st::DType::F32, t.data, nullptr});
  fs::create_directories(dir / "bad");
  model::write_hf_config(dir / "bad" / "config.json", config);
  st::write_file(dir / "bad" / "model.safetensors", tensors);
  try {
    train::load_hf_model(dir / "bad", loaded);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("element 500000 is inf"), std::string::npos) << e.what();
  }
}

// Not on a terminal, a progress report is its start and end lines only, however many updates.
TEST(LoadShards, ProgressOffATerminalPrintsStartAndEndOnly) {
  ::testing::internal::CaptureStderr();
  {
    Progress p("loading x", 3000000, "bytes");
    for (int i = 0; i <= 3000; ++i) p.update(i * 1000);
    p.finish();
    Progress quiet("rank 1", 10, "", /*enabled=*/false);
    quiet.update(5);
    quiet.finish();
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_EQ(out.rfind("loading x: 3.0 MB\n", 0), 0u) << out;
  EXPECT_NE(out.find("loading x: done in "), std::string::npos) << out;
}

}  // namespace
}  // namespace longtron
