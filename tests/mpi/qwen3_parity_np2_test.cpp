// Qwen3 (per-head q/k norms) on 2 ranks against one process: data parallel, every Megatron mode
// (with and without recomputation), ISP with weight sharding, 2D-Attention's context split, and
// 2D tensor parallel x2×y1 and x1×y2, and LoRA (see qwen3_parity.h).
#include "qwen3_parity.h"

#include <string>
#include <tuple>
#include <utility>

namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(Qwen3Np2, QkNormsChangeTheReference) { expect_qk_norms_matter(qwen3_model()); }

TEST(Qwen3Np2, Dp2) {
  ParityCase c{"qwen3 dp2", layout(1, TensorMode::kMtp, 1)};
  c.model = qwen3_model();
  check_parity(c);
}

TEST(Qwen3Np2, Tp2EveryMegatronMode) {
  for (auto [name, mode] : {std::pair{"qwen3 tp2 mtp", TensorMode::kMtp},
                            std::pair{"qwen3 tp2 msp", TensorMode::kMsp},
                            std::pair{"qwen3 tp2 fsp", TensorMode::kFsp}}) {
    ParityCase c{name, layout(2, mode)};
    c.model = qwen3_model();
    check_parity(c);
  }
}

TEST(Qwen3Np2, Tp2MspCheckpointedTied) {
  ParityCase c{"qwen3 tp2 msp ckpt tied", layout(2, TensorMode::kMsp)};
  c.model = qwen3_model();
  c.model.checkpoint = true;
  c.model.tie_word_embeddings = true;
  check_parity(c);
}

TEST(Qwen3Np2, IspWeight2) {
  IspCase c{"qwen3 isp2 w2", isp(2, 2)};
  c.model = qwen3_model();
  check_isp_parity(c);
  c.name += " ckpt";
  c.model.checkpoint = true;
  check_isp_parity(c);
}

TEST(Qwen3Np2, Cp2Zigzag) {
  IspCase c{"qwen3 cp2 zigzag", seq2d(2, 2, 1, "zigzag")};
  c.model = qwen3_model();
  check_isp_parity(c);
}

// use_sliding_window with max_window_layers 1: layer 0 full, layer 1 a window of 3 (shorter than
// most documents), under 2D-Attention's context split in each balance and under Megatron.
TEST(Qwen3Np2, SlidingLayer1OnlyUnderContextAndTensorParallel) {
  model::ModelConfig m = qwen3_model();
  m.sliding_window = 3;
  m.window_layers = {false, true};
  IspCase full{"qwen3 window", seq2d(2, 2, 1, "zigzag")};
  full.model = m;
  const RunResult windowed = isp_reference(full);
  full.model.window_layers = {false, false};
  EXPECT_NE(isp_reference(full).losses[0], windowed.losses[0]) << "the window changes nothing";
  for (const char* b : kBalances) {
    IspCase c{std::string("qwen3 window layer 1 cp2 ") + b, seq2d(2, 2, 1, b)};
    c.model = m;
    check_isp_parity(c);
  }
  ParityCase t{"qwen3 window layer 1 tp2 msp", layout(2, TensorMode::kMsp)};
  t.model = m;
  check_parity(t);
}

TEST(Qwen3Np2, TwoD) {
  for (auto [name, x, y] :
       {std::tuple{"qwen3 2d x2 y1", 2, 1}, std::tuple{"qwen3 2d x1 y2", 1, 2}}) {
    ParityCase c{name, layout_2d(x, y)};
    c.model = qwen3_model();
    check_parity(c);
  }
}

// LoRA on Qwen3: the q/k norms stay frozen with the base under Megatron, ISP and 2D.
TEST(Qwen3Np2, LoraMsp2Isp2And2D) {
  check_lora_parity(lora_case("qwen3 lora msp2", layout(2, TensorMode::kMsp), "qwen3"));
  check_lora_parity(lora_case("qwen3 lora isp2 w2", lora_isp(2, 2), "qwen3"));
  check_lora_parity(lora_case("qwen3 lora 2d x1 y2", lora_2d(1, 2), "qwen3"));
}

}  // namespace
}  // namespace longtron::testing
