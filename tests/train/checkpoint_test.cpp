// Checkpoints (docs/training.md): round trip, latest/resolve, and atomicity of a failing write.
#include "expect_error.h"
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <limits>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/hf_config.h"
#include "test_util.h"

using longtron::Error;
using longtron::testing::TempDir;
namespace fs = std::filesystem;
namespace tr = longtron::train;

namespace {

struct Fake {  // two "parameters" and their AdamW moments
  std::vector<float> w = {1, 2, 3, 4, 5, 6}, n = {0.5f, -0.25f};
  std::vector<float> mw = {.1f, .2f, .3f, .4f, .5f, .6f}, mn = {-1, 1};
  std::vector<float> vw = {1e-3f, 2e-3f, 3e-3f, 4e-3f, 5e-3f, 6e-3f}, vn = {7, 8};
  tr::CheckpointData data(int64_t step) const {
    tr::CheckpointData d;
    d.params = {{"model.layers.0.attention.wo.weight", {2, 3}, w.data()},
                {"model.norm.weight", {2}, n.data()}};
    d.adam_m = {{"model.layers.0.attention.wo.weight", {2, 3}, mw.data()}, {"model.norm.weight", {2}, mn.data()}};
    d.adam_v = {{"model.layers.0.attention.wo.weight", {2, 3}, vw.data()}, {"model.norm.weight", {2}, vn.data()}};
    d.adam_step = step;
    d.model.vocab_size = 10;
    d.model.hidden_size = 2;
    d.model.num_layers = 1;
    d.model.num_attention_heads = 1;
    d.model.num_kv_attention_heads = 1;
    d.state.step = step;
    d.state.config = {{"train", {{"total_steps", 9}}}};
    d.state.sampler = {{"epoch", 1}, {"position", 17}};
    d.state.rng = {{"seed", 5}, {"draws", 123456789012345}};
    return d;
  }
};

using longtron::testing::expect_error;

std::string latest(const fs::path& root) { return longtron::testing::read_file(root / "latest"); }

}  // namespace

TEST(Checkpoint, RoundTrip) {
  TempDir dir;
  const Fake f;
  const fs::path step = tr::save_checkpoint(dir / "ckpt", f.data(3));
  EXPECT_EQ(step, dir / "ckpt" / "step_3");
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "config.json", "state.json"})
    EXPECT_TRUE(fs::exists(step / file)) << file;
  EXPECT_EQ(latest(dir / "ckpt"), "step_3\n");
  EXPECT_EQ(tr::resolve_checkpoint(dir / "ckpt"), step);
  EXPECT_EQ(tr::resolve_checkpoint(step), step);

  std::vector<float> w(6), n(2), mw(6), mn(2), vw(6), vn(2);
  tr::load_model(step, {{"model.layers.0.attention.wo.weight", {2, 3}, w.data()},
                        {"model.norm.weight", {2}, n.data()}});
  EXPECT_EQ(w, f.w);
  EXPECT_EQ(n, f.n);
  const int64_t s = tr::load_optimizer(step, {{"model.layers.0.attention.wo.weight", {2, 3}, mw.data()},
                                              {"model.norm.weight", {2}, mn.data()}},
                                       {{"model.layers.0.attention.wo.weight", {2, 3}, vw.data()},
                                        {"model.norm.weight", {2}, vn.data()}});
  EXPECT_EQ(s, 3);
  EXPECT_EQ(mw, f.mw);
  EXPECT_EQ(vn, f.vn);
  const auto state = tr::read_checkpoint_state(step);
  EXPECT_EQ(state.step, 3);
  EXPECT_EQ(state.sampler["position"], 17);
  EXPECT_EQ(state.rng["draws"], 123456789012345);
  EXPECT_EQ(state.config["train"]["total_steps"], 9);
  EXPECT_EQ(longtron::model::read_hf_config(step).hidden_size, 2);
  // Optimizer tensors carry PyTorch's state names.
  longtron::safetensors::File opt(step / "optimizer.safetensors");
  EXPECT_TRUE(opt.contains("exp_avg.model.norm.weight"));
  EXPECT_TRUE(opt.contains("exp_avg_sq.model.norm.weight"));

  // A later step becomes latest; the earlier folder stays.
  tr::save_checkpoint(dir / "ckpt", f.data(7));
  EXPECT_EQ(latest(dir / "ckpt"), "step_7\n");
  EXPECT_EQ(tr::resolve_checkpoint(dir / "ckpt"), dir / "ckpt" / "step_7");
  EXPECT_TRUE(fs::exists(step / "state.json"));
}

TEST(Checkpoint, FailingWriteLeavesNoStepFolderAndLatestUnchanged) {
  TempDir dir;
  const Fake f;
  tr::save_checkpoint(dir.path(), f.data(1));
  auto bad = f.data(2);
  bad.adam_v[1].data = nullptr;  // fails after model.safetensors is already written
  expect_error([&] { tr::save_checkpoint(dir.path(), bad); }, {"adam_v", "model.norm.weight"});
  EXPECT_FALSE(fs::exists(dir / "step_2"));
  EXPECT_EQ(latest(dir.path()), "step_1\n");
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_TRUE(e.path().filename() == "step_1" || e.path().filename() == "latest") << e.path();
  // Mismatched layouts are refused before anything is written.
  auto mismatch = f.data(4);
  mismatch.adam_m.pop_back();
  expect_error([&] { tr::save_checkpoint(dir.path(), mismatch); }, {"adam_m", "1 tensors", "2"});
  EXPECT_FALSE(fs::exists(dir / "step_4"));
}

// Without model.safetensors (a LoRA step folder) the params give only names and shapes: the
// trainer points them at a rank's shard of each adapter, whose values (and what lies past them)
// must not be read, and write_extra writes the adapter.
TEST(Checkpoint, WithoutModelTheParamsDataIsNotRead) {
  TempDir dir;
  const Fake f;
  auto d = f.data(5);
  const std::vector<float> unread(6, std::numeric_limits<float>::quiet_NaN());
  for (auto& p : d.params) p.data = unread.data();  // as a shard's garbage would read
  d.write_model = false;
  d.write_extra = [](const fs::path& tmp) { longtron::testing::write_file(tmp / "extra.txt", "x"); };
  const fs::path step = tr::save_checkpoint(dir.path(), d);
  EXPECT_FALSE(fs::exists(step / "model.safetensors"));
  EXPECT_TRUE(fs::exists(step / "optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(step / "extra.txt"));
  // The optimizer state is still checked.
  auto bad = d;
  const std::vector<float> nan_m(6, std::numeric_limits<float>::quiet_NaN());
  bad.adam_m[0].data = nan_m.data();
  bad.state.step = 6;
  expect_error([&] { tr::save_checkpoint(dir.path(), bad); }, {"adam_m", "wo.weight", "nan"});
  EXPECT_FALSE(fs::exists(dir / "step_6"));
}

TEST(Checkpoint, LoadErrorsNameTensorAndShapes) {
  TempDir dir;
  const Fake f;
  const fs::path step = tr::save_checkpoint(dir.path(), f.data(1));
  std::vector<float> buf(16);
  expect_error([&] {
    tr::load_model(step, {{"model.layers.0.attention.wo.weight", {3, 2}, buf.data()},
                          {"model.norm.weight", {2}, buf.data()}});
  }, {"model.safetensors", "model.layers.0.attention.wo.weight", "[2, 3]", "[3, 2]"});
  expect_error([&] { tr::load_model(step, {{"output.weight", {2}, buf.data()}}); },
               {"output.weight"});
  expect_error([&] { tr::load_model(step, {{"model.norm.weight", {2}, buf.data()}}); },
               {"model.layers.0.attention.wo.weight", "not a parameter"});
}

TEST(Checkpoint, ResolveErrors) {
  TempDir dir;
  expect_error([&] { tr::resolve_checkpoint(dir / "nope"); }, {"nope"});
  expect_error([&] { tr::resolve_checkpoint(dir.path()); }, {"latest", "state.json"});
  longtron::testing::write_file(dir / "latest", "step_9\n");
  expect_error([&] { tr::resolve_checkpoint(dir.path()); }, {"step_9", "not a complete checkpoint"});
  fs::create_directory(dir / "step_9");
  longtron::testing::write_file(dir / "step_9" / "state.json", "{\"stp\": 1}");
  expect_error([&] { tr::read_checkpoint_state(dir / "step_9"); }, {"state.json", "step"});
}

TEST(Checkpoint, WeightsOnlyAndShardedModelLoad) {
  TempDir dir;
  const Fake f;
  auto d = f.data(5);
  d.adam_m.clear();
  d.adam_v.clear();
  const fs::path step = tr::save_checkpoint(dir / "c", d);
  EXPECT_FALSE(fs::exists(step / "optimizer.safetensors"));
  // An HF-style sharded folder in bf16 loads through the same call.
  namespace st = longtron::safetensors;
  fs::create_directory(dir / "hf");
  st::write_sharded(dir / "hf", {{"model.layers.0.attention.wo.weight", {2, 3}, st::DType::BF16, f.w.data(), nullptr},
                                 {"model.norm.weight", {2}, st::DType::F16, f.n.data(), nullptr}}, 8);
  std::vector<float> w(6), n(2);
  tr::load_model(dir / "hf", {{"model.layers.0.attention.wo.weight", {2, 3}, w.data()},
                              {"model.norm.weight", {2}, n.data()}});
  EXPECT_EQ(w, f.w);  // small integers are exact in bf16
  EXPECT_EQ(n, f.n);
}

// A save removes step_N.tmp.PID / latest.tmp.PID leftovers of dead processes (a kill -9 during a
// save), keeps those of live ones and anything else; --overwrite's remove_checkpoints removes step
// folders and `latest` only.
TEST(Checkpoint, SaveRemovesLeftoversOfDeadProcesses) {
  TempDir dir;
  const Fake f;
  const fs::path root = dir / "ckpt";
  fs::create_directories(root);
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // reaped: the PID no longer names a process
  const std::string dead = std::to_string(child), live = std::to_string(getpid());
  for (const std::string& name : {"step_7.tmp." + dead, "latest.tmp." + dead, "step_8.tmp." + live,
                                 std::string("step_9.tmp.x"), "notes.tmp." + dead})
    fs::create_directories(root / name);
  tr::save_checkpoint(root, f.data(3));
  EXPECT_FALSE(fs::exists(root / ("step_7.tmp." + dead)));
  EXPECT_FALSE(fs::exists(root / ("latest.tmp." + dead)));
  for (const std::string& name : {"step_8.tmp." + live, std::string("step_9.tmp.x"), "notes.tmp." + dead})
    EXPECT_TRUE(fs::exists(root / name)) << name;
  EXPECT_TRUE(tr::remove_stale_temporaries(root).empty());
  EXPECT_TRUE(tr::remove_stale_temporaries(dir / "missing").empty());

  tr::remove_checkpoints(root);
  EXPECT_FALSE(fs::exists(root / "step_3"));
  EXPECT_FALSE(fs::exists(root / "latest"));
  EXPECT_TRUE(fs::exists(root / ("step_8.tmp." + live)));  // a live save is not ours to remove
  EXPECT_TRUE(fs::exists(root / "step_9.tmp.x"));
}
