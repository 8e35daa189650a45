// The memory plan: its activation count is the model's own workspace, ZeRO-1 and the layouts
// shard what they should, a run that cannot fit is refused naming the key, and a failed
// allocation names its phase.
#include "train/memory_plan.h"

#include <gtest/gtest.h>

#include <numeric>

#include "bf16_here.h"
#include "core/error.h"
#include "core/phase.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "model/params.h"
#include "ops/precision.h"
#include "train/config.h"

using namespace longtron;

namespace {

train::TrainConfig tiny(const std::vector<std::string>& overrides = {}) {
  return train::parse_config(
      "[model]\nvocab_size = 96\nhidden_size = 32\nnum_layers = 3\nnum_attention_heads = 4\n"
      "num_kv_attention_heads = 2\nmultiple_of = 32\n"
      "[data]\ntrain_folder = \"/nonexistent\"\nseq_len = 40\nmicro_bsz = 3\n"
      "[train]\ntotal_steps = 1\n",
      "tiny.toml", overrides);
}

double item(const std::vector<train::MemoryItem>& items, const std::string& prefix) {
  for (const auto& i : items)
    if (i.name.rfind(prefix, 0) == 0) return i.bytes;
  ADD_FAILURE() << "no item " << prefix;
  return -1;
}

// The plan's activation line is exactly the arena the model allocates for a packed row of
// micro_bsz × seq_len tokens, with and without recomputation, in float32 and (where the CPU has
// native bf16) in bfloat16, whose saved tensors take half the bytes.
TEST(MemoryPlan, ActivationsAreTheModelsWorkspace) {
  double fp32_bytes = 0;
  const longtron::testing::Bf16Here bf16_here;
  // Qwen3: the q/k norms' saves too (model::QkNorm).
  for (const std::string type : {"internlm2", "qwen3"})
  for (const bool bf16 : {false, true}) {
    for (const bool recompute : {false, true}) {
      if (bf16 && !bf16_here.runs()) GTEST_SKIP() << "no AVX-512 on this CPU";
      const train::TrainConfig c =
          tiny({std::string("model.checkpoint=") + (recompute ? "true" : "false"),
                "model.type=\"" + type + "\""});
      train::MemoryPlanInputs in;
      in.bf16 = bf16;
      const train::MemoryPlan plan = train::plan_memory(c, in);
      const model::ParamTable layout(c.model);
      model::Params<float> params(layout), grads(layout);
      model::init_params(params, 1);
      const ops::ComputeContext precision(bf16 ? ops::ComputeType::kBFloat16
                                               : ops::ComputeType::kFloat32);
      model::Decoder<float> m(layout, params, model::make_dense_ops<float>(layout, precision));
      data::MicroBatch b;
      const int32_t P = 120;
      for (int32_t i = 0; i < P; ++i) {
        b.input_ids.push_back(1 + i % 90);
        b.labels.push_back(1 + (i + 1) % 90);
        b.indexes.push_back(i % 50);
    }
    b.cu_seqlens = {0, 50, 100, P};
    b.max_seqlen = 50;
    m.forward_backward(b, grads, 1.0);
    EXPECT_EQ(item(plan.step, "activations"), static_cast<double>(m.workspace_bytes()))
        << type << " checkpoint " << recompute << " bf16 " << bf16;
    if (!recompute && !bf16) fp32_bytes = item(plan.step, "activations");
    if (!recompute && bf16) {
      EXPECT_LT(item(plan.step, "activations"), 0.8 * fp32_bytes);
    }
    EXPECT_EQ(plan.params_local, layout.numel());
    EXPECT_EQ(item(plan.resident, "parameters"), 4.0 * static_cast<double>(layout.numel()));
    }
  }
}

// ZeRO-1 over 4 data-parallel ranks keeps a quarter of the AdamW state; ISP over a weight group
// of 2 keeps about half the parameters; Megatron TP over 2 splits the matrices.
TEST(MemoryPlan, LayoutsShardWhatTheyShould) {
  train::MemoryPlanInputs one, four;
  four.world_size = 4;
  const auto p1 = train::plan_memory(tiny(), one);
  const auto p4 = train::plan_memory(tiny({"parallel.zero1.size=-1"}), four);
  EXPECT_NEAR(item(p4.resident, "AdamW"), item(p1.resident, "AdamW") / 4, 16);
  EXPECT_NE(p4.layout.find("zero1 4"), std::string::npos) << p4.layout;
  EXPECT_EQ(p4.tokens_per_step, 4 * p1.tokens_per_step);

  train::MemoryPlanInputs two;
  two.world_size = 2;
  const auto isp = train::plan_memory(
      tiny({"parallel.tensor={size = 2, mode = \"isp\"}", "parallel.weight.size=2"}), two);
  EXPECT_LT(isp.params_local, p1.params_full * 0.55);
  EXPECT_GT(isp.params_local, p1.params_full * 0.45);
  EXPECT_EQ(isp.layout.rfind("isp", 0), 0u) << isp.layout;
  const auto mtp = train::plan_memory(tiny({"parallel.tensor=2"}), two);
  EXPECT_LT(mtp.params_local, p1.params_full * 0.6);
  // Sequence parallel splits the residual stream: fewer activation bytes than MTP.
  const auto fsp = train::plan_memory(tiny({"parallel.tensor={size = 2, mode = \"fsp\"}"}), two);
  EXPECT_LT(item(fsp.step, "activations"), item(mtp.step, "activations"));
  // A layout that does not fit the world is the engine's error, naming the key.
  train::MemoryPlanInputs three;
  three.world_size = 3;
  try {
    train::plan_memory(tiny({"parallel.tensor=2"}), three);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tensor"), std::string::npos) << e.what();
  }
}

// LoRA's gradient line is the adapters as a rank holds them: whole in one process, rank 0's row
// shards under ISP (shard_range over the weight group: 3 rows of A as 2 + 1), split like their
// linears under 2D tensor parallel.
TEST(MemoryPlan, LoraAdaptersAsEachRankHoldsThem) {
  const std::vector<std::string> lora = {"lora.rank=3"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), lora.begin(), lora.end());
    return tiny(more);
  };
  train::MemoryPlanInputs one, two;
  two.world_size = 2;
  const train::TrainConfig c = with({});
  const model::ParamTable full(c.model);
  const model::ParamTable adapters =
      model::lora_table(full, model::lora_modules(full, c.model.lora), 3);
  double shard0 = 0;
  for (const auto& v : adapters.views())
    shard0 += double((v.shape[0] + 1) / 2 * v.shape[1]) * 4;  // rank 0 holds the larger half
  EXPECT_EQ(item(train::plan_memory(c, one).resident, "gradients"), double(adapters.numel()) * 4);
  const auto isp = train::plan_memory(
      with({"parallel.tensor={size = 2, mode = \"isp\"}", "parallel.weight.size=2"}), two);
  EXPECT_EQ(item(isp.resident, "gradients"), shard0);
  const auto tp2d = train::plan_memory(with({"parallel.tensor_2d={x = 2, y = 1}"}), two);
  EXPECT_LT(item(tp2d.resident, "gradients"), double(adapters.numel()) * 4);
  EXPECT_GT(item(tp2d.resident, "gradients"), double(adapters.numel()) * 4 / 2);
}

// 2D-Attention (hp1 x cp4) holds ring attention's K/V blocks where Ulysses over the same 4 ranks
// holds its all-to-all staging; at head size 1 there is no all-to-all and so no staging. The
// gathered weights are the same in both. The layout line names the split.
TEST(MemoryPlan, ContextParallelHoldsTheRingNotTheStaging) {
  train::MemoryPlanInputs four;
  four.world_size = 4;
  const std::string isp = "parallel.tensor={size = 4, mode = \"isp\"}";
  const auto ulysses = train::plan_memory(tiny({isp, "parallel.weight.size=4"}), four);
  const auto cp = train::plan_memory(
      tiny({isp, "parallel.weight.size=4", "parallel.sequence_2D.enable=true",
            "parallel.sequence_2D.context_size=4"}),
      four);
  EXPECT_NE(cp.layout.find("2D-Attention head 1 x context 4 (zigzag)"), std::string::npos)
      << cp.layout;
  // P = 120 tokens, 30 a rank; q/k/v features 64 (4 + 2 × 2 heads of 8); Ulysses over 4 ranks
  // holds 1 q and 1 (repeated) kv head a rank: split [30, 64] and packed [30, 4 × 3 × 8], twice.
  const double staging = 30.0 * (64 + 4 * 3 * 8) * 2;
  // The ring: 6 blocks and the 2 dK/dV sums in flight, each 30 rows of K and V (2 kv heads of 8).
  const double ring = 8 * 30.0 * (2 * 2 * 8);
  EXPECT_DOUBLE_EQ(item(cp.step, "layout buffers") - item(ulysses.step, "layout buffers"),
                   (ring - staging) * 4);
}

// The start-up GEMM timing packs its n × n fp32 B (16 MiB at n = 2048, the largest packed B kept):
// counted in the timing's phase and, since the buffer is kept at the largest B seen, in the step.
TEST(MemoryPlan, TheTimingsPackedBStaysForTheRun) {
  train::MemoryPlanInputs timing, small;
  small.sgemm_size = 8;
  const auto p = train::plan_memory(tiny(), timing);
  const auto q = train::plan_memory(tiny(), small);
  const double n2 = 2048.0 * 2048.0 * 4;
  EXPECT_EQ(item(p.transient, "start-up: sgemm timing"), 4 * n2);
  EXPECT_EQ(item(p.step, "GEMM packed B operands"), n2);
  EXPECT_LT(item(q.step, "GEMM packed B operands"), n2 / 8);  // the tiny model's own
}

// The attention kernels run over groups of whole documents of 4 × model.chunk_tokens queries
// (64 here): a longer document is a group of its own, up to data.seq_len (400 here).
TEST(MemoryPlan, TheLongestDocumentSizesTheAttentionGroup) {
  const auto config = tiny({"model.checkpoint=true", "model.chunk_tokens=16", "data.seq_len=400"});
  train::MemoryPlanInputs unknown, longest;
  longest.longest_document = 1000;
  const auto groups = train::plan_memory(config, unknown);
  const auto document = train::plan_memory(config, longest);
  EXPECT_GT(item(document.step, "attention workspace"), item(groups.step, "attention workspace"));
  const auto named = [](const train::MemoryPlan& p) {
    for (const auto& i : p.step)
      if (i.name.rfind("attention workspace", 0) == 0) return i.name;
    return std::string();
  };
  EXPECT_EQ(named(groups), "attention workspace (groups of 64 tokens)");
  EXPECT_EQ(named(document), "attention workspace (groups of 64 tokens, the longest document 400)");
}

// A billion-token row is refused with the breakdown and the key; a run that fits is not.
TEST(MemoryPlan, RefusesWhatCannotFitNamingTheKey) {
  const auto huge = train::plan_memory(tiny({"data.seq_len=1000000000"}), {});
  EXPECT_GT(huge.peak_bytes, 1e12);
  try {
    train::check_memory(huge, 8.0 * (1 << 30));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data.seq_len"), std::string::npos) << m;
    EXPECT_NE(m.find("activations"), std::string::npos) << m;
    EXPECT_NE(m.find("8.0 GiB"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(train::check_memory(train::plan_memory(tiny(), {}), 8.0 * (1 << 30)));
  EXPECT_NO_THROW(train::check_memory(huge, 0));  // unknown: no check
  EXPECT_GT(train::available_memory_bytes(1), 0);
  EXPECT_NEAR(train::available_memory_bytes(4), train::available_memory_bytes(1) / 4,
              train::available_memory_bytes(1) * 0.05);
}

// --resume loads this rank's moments at start-up (straight into its shards); a checkpoint folder adds the save's full copies.
TEST(MemoryPlan, ResumeAndSaveTransients) {
  train::MemoryPlanInputs small, resume;
  small.sgemm_size = resume.sgemm_size = 8;  // so the tiny model's phases decide the peak
  resume.resume = true;
  const auto p = train::plan_memory(tiny(), resume);
  const double full = 4.0 * static_cast<double>(p.params_full);
  EXPECT_EQ(item(p.transient, "start-up: checkpoint load"), 2 * full);  // one rank: local = full
  const auto saved = train::plan_memory(tiny({"train.checkpoint_dir=\"/tmp/x\""}), small);
  EXPECT_EQ(item(saved.transient, "checkpoint save"), 5 * full);
  EXPECT_EQ(saved.peak_phase, "checkpoint save");
  EXPECT_GT(saved.peak_bytes, train::plan_memory(tiny(), small).peak_bytes);
}

// The end-of-run line reads the measured peak against the plan in words: a peak over the plan
// is "above" it by a share of the plan.
TEST(MemoryPlan, ComparesThePeakToThePlanInWords) {
  const double mib = 1024.0 * 1024.0;
  EXPECT_EQ(train::compare_to_plan(867.7 * mib, 844.3 * mib), "3% above the plan (844.3 MiB)");
  EXPECT_EQ(train::compare_to_plan(704.0 * mib, 800.0 * mib), "12% below the plan (800.0 MiB)");
  EXPECT_EQ(train::compare_to_plan(800.5 * mib, 800.0 * mib), "at the plan (800.0 MiB)");
}

TEST(MemoryPlan, OutOfMemoryNamesThePhase) {
  EXPECT_EQ(out_of_memory_message(), "out of memory (a memory allocation failed)");
  {
    Phase outer("training step 3");
    {
      Phase inner("saving the checkpoint of step 3");
      EXPECT_NE(out_of_memory_message().find("while saving the checkpoint of step 3"),
                std::string::npos);
    }
    EXPECT_NE(out_of_memory_message().find("while training step 3"), std::string::npos);
  }
  EXPECT_EQ(current_phase(), "");
  // Left by an exception, a phase keeps its name for the handler that catches it.
  try {
    Phase p("allocating the workspace");
    throw std::bad_alloc();
  } catch (const std::bad_alloc&) {
    EXPECT_EQ(out_of_memory_message(),
              "out of memory while allocating the workspace (a memory allocation failed)");
  }
}

}  // namespace
