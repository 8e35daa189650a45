// Never a non-finite checkpoint: an update that would make the weights non-finite is skipped, a
// run that applied no update ends with an error and writes nothing, corrupt optimizer state is
// refused on --resume, eval of weights whose loss is not finite fails, and export writes no NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "cli_fixture.h"
#include "test_util.h"

namespace fs = std::filesystem;
using longtron::testing::CommandResult;
using longtron::testing::contains;
using longtron::testing::Prepared;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::write_file;

namespace {

// Applies `edit` to every float32 of the tensors of `file` (a safetensors file) whose name starts
// with `prefix`, in place.
void edit_floats(const fs::path& file, const std::string& prefix,
                 const std::function<void(float&, size_t)>& edit) {
  std::string bytes = read_file(file);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_size));
  size_t index = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__" || name.rfind(prefix, 0) != 0 || entry["dtype"] != "F32") continue;
    const size_t begin = 8 + header_size + entry["data_offsets"][0].get<size_t>();
    const size_t end = 8 + header_size + entry["data_offsets"][1].get<size_t>();
    for (size_t at = begin; at < end; at += 4) {
      float v;
      std::memcpy(&v, bytes.data() + at, 4);
      edit(v, index++);
      std::memcpy(bytes.data() + at, &v, 4);
    }
  }
  ASSERT_GT(index, 0u) << file << ": no tensor " << prefix;
  write_file(file, bytes);
}

}  // namespace

TEST(NonFinite, AnUpdateThatWouldMakeWeightsNonFiniteIsSkippedAndNothingIsSaved) {
  Prepared p;
  // lr 1e39 is inf in float: the first update would turn every weight into inf or NaN.
  const CommandResult r =
      run_longtron("train" + p.config() + " --set optimizer.lr=1e39 --set train.total_steps=2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "step 1: the update would make weights non-finite")) << r.output;
  EXPECT_TRUE(contains(r.output, "none of the 2 steps of this run applied an update")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / "step_2")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / "step_1")) << r.output;
}

TEST(NonFinite, CorruptOptimizerStateIsRefusedOnResume) {
  Prepared p;
  CommandResult r = run_longtron("train" + p.config() + " --set train.total_steps=2");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path step = p.dir / "ckpt" / "step_2";
  const fs::path saved = p.dir / "optimizer.safetensors";
  fs::copy_file(step / "optimizer.safetensors", saved);
  // A negative second moment (sqrt of it is NaN), then a non-finite first moment.
  edit_floats(step / "optimizer.safetensors", "exp_avg_sq.", [](float& v, size_t i) {
    if (i == 3) v = -1.0f;
  });
  r = run_longtron("train" + p.config() + " --set train.total_steps=4 --resume " + step.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "optimizer.safetensors: exp_avg_sq.") &&
              contains(r.output, "holds -1 at element") &&
              contains(r.output, "second moments must be finite and >= 0"))
      << r.output;
  fs::copy_file(saved, step / "optimizer.safetensors", fs::copy_options::overwrite_existing);
  edit_floats(step / "optimizer.safetensors", "exp_avg.", [](float& v, size_t i) {
    if (i == 0) v = INFINITY;
  });
  r = run_longtron("train" + p.config() + " --set train.total_steps=4 --resume " + step.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "exp_avg.") && contains(r.output, "is inf (not finite"))
      << r.output;  // the safetensors reader refuses non-finite floats itself
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / "step_4")) << r.output;
}

TEST(NonFinite, EvalOfHugeWeightsFailsAndExportRefusesNaN) {
  Prepared p;
  CommandResult r = run_longtron("train" + p.config() + " --set train.total_steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path step = p.dir / "ckpt" / "step_1";
  const std::string data = (p.dir / "data" / "valid").string();
  r = run_longtron("eval --checkpoint " + step.string() + " --data " + data);
  ASSERT_EQ(r.status, 0) << r.output;
  edit_floats(step / "model.safetensors", "", [](float& v, size_t) { v *= 1e30f; });
  r = run_longtron("eval --checkpoint " + step.string() + " --data " + data);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "eval: the loss of") && contains(r.output, "non-finite"))
      << r.output;
  edit_floats(step / "model.safetensors", "", [](float& v, size_t i) { v = i == 7 ? NAN : 0.0f; });
  r = run_longtron("export --checkpoint " + step.string() + " --output " +
                   (p.dir / "hf").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "element 7 is nan (not finite")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "hf"));
}

// Under ZeRO-1 over two data-parallel ranks each rank checks only its slice of the flat buffer:
// a first moment made huge in the head (the end of the buffer, rank 1's slice) makes only rank 1's
// update non-finite. The verdict must be agreed: both ranks skip (no rank waits in an all-gather
// the other never enters), and the run ends with the error.
TEST(NonFinite, ZeroOneRanksAgreeOnASkippedUpdate) {
  Prepared p;
  CommandResult r = run_longtron("train" + p.config() + " --set train.total_steps=2");
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path step = p.dir / "ckpt" / "step_2";
  const std::string head = contains(read_file(step / "optimizer.safetensors"), "exp_avg.output.weight")
                               ? "exp_avg.output.weight"
                               : "exp_avg.lm_head.weight";
  edit_floats(step / "optimizer.safetensors", head, [](float& v, size_t) { v = 3e38f; });
  r = longtron::testing::mpirun_longtron(
      2, "train" + p.config() + " --set train.total_steps=3 --set data.valid_folder= --resume " +
             step.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "step 3: the update would make weights non-finite")) << r.output;
  EXPECT_TRUE(contains(r.output, "none of the 1 steps of this run applied an update")) << r.output;
  EXPECT_FALSE(fs::exists(p.dir / "ckpt" / "step_3"));
}
