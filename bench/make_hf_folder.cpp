// Writes a Hugging Face folder of random weights for start-up measurements (docs/benchmarks.md,
// "Start-up"): config.json and one bf16 model.safetensors under the family's tensor names, shaped
// like Qwen2.5-0.5B by default (hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864,
// vocab 151936, tied embeddings, q/k/v biases: 494M parameters, 988 MB), or with `--family qwen3`
// like Qwen3-0.6B (hidden 1024, 28 layers, 16 heads of head_dim 128, 8 kv heads, intermediate
// 3072, vocab 151936, tied, q/k norms: 596M parameters). Not a test and never committed: write it
// to a scratch folder.
//
//   build/make_hf_folder OUT_DIR [--family qwen2|qwen3] [--hidden 896] [--layers 24] [--heads 14]
//       [--kv-heads 2] [--head-dim D] [--intermediate 4864] [--vocab 151936] [--untied] [--seed 1]
//
// Weights: approximately normal(0, 0.02) (the sum of four uniforms), norms 1, biases
// normal(0, 0.02) too; a fast counter-based generator (splitmix64), as only the shape matters.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/params.h"

namespace fs = std::filesystem;
namespace st = longtron::safetensors;
namespace model = longtron::model;

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: {} OUT_DIR [--family qwen2|qwen3] [--hidden H] [--layers L] "
               "[--heads A] [--kv-heads K] [--head-dim D] [--intermediate F] [--vocab V] "
               "[--untied] [--seed S]\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  // The family first: it sets the other options' defaults.
  const bool qwen3 =
      argc > 3 && std::string(argv[2]) == "--family" && std::string(argv[3]) == "qwen3";
  int64_t hidden = 896, layers = 24, heads = 14, kv = 2, inter = 4864, vocab = 151936, dim = 0;
  if (qwen3) hidden = 1024, layers = 28, heads = 16, kv = 8, inter = 3072, dim = 128;
  uint64_t seed = 1;
  bool tied = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&] {
      if (i + 1 >= argc) { fmt::print(stderr, "{} needs a value\n", a); std::exit(2); }
      return std::strtoll(argv[++i], nullptr, 10);
    };
    if (a == "--family") {
      const std::string f = i + 1 < argc ? argv[++i] : "";
      if (f != "qwen2" && f != "qwen3") {
        fmt::print(stderr, "--family qwen2 or qwen3\n");
        return 2;
      }
      if ((f == "qwen3") != qwen3 || i != 3) {
        fmt::print(stderr, "--family must come first, right after OUT_DIR\n");
        return 2;
      }
    } else if (a == "--hidden") hidden = next();
    else if (a == "--layers") layers = next();
    else if (a == "--heads") heads = next();
    else if (a == "--kv-heads") kv = next();
    else if (a == "--head-dim") dim = next();
    else if (a == "--intermediate") inter = next();
    else if (a == "--vocab") vocab = next();
    else if (a == "--seed") seed = static_cast<uint64_t>(next());
    else if (a == "--untied") tied = false;
    else { fmt::print(stderr, "unknown option {}\n", a); return 2; }
  }
  nlohmann::json hf = {
      {"architectures", {qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"}},
      {"model_type", qwen3 ? "qwen3" : "qwen2"},
      {"hidden_size", hidden}, {"num_hidden_layers", layers}, {"num_attention_heads", heads},
      {"num_key_value_heads", kv}, {"intermediate_size", inter}, {"vocab_size", vocab},
      {"tie_word_embeddings", tied}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0},
      {"max_position_embeddings", 32768}, {"max_window_layers", layers},
      {"sliding_window", 32768}, {"use_sliding_window", false}, {"hidden_act", "silu"},
      {"bos_token_id", 151643}, {"eos_token_id", 151643}, {"torch_dtype", "bfloat16"}};
  if (dim > 0) hf["head_dim"] = dim;
  if (qwen3) hf["attention_bias"] = false, hf["eos_token_id"] = 151645;
  fs::create_directories(out);
  {
    std::ofstream f(out / "config.json");
    f << hf.dump(2) << "\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const model::ModelConfig config = model::read_hf_config(out);
  const model::ParamTable layout(config);
  std::vector<std::vector<uint16_t>> data;
  std::vector<st::WriteTensor> tensors;
  const auto list = model::hf_tensors(layout);
  data.reserve(list.size());
  uint64_t counter = seed * 0x9E3779B97F4A7C15ull;
  for (const auto& t : list) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    auto& v = data.emplace_back(static_cast<size_t>(n));
    const bool norm = t.name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < n; ++i) {
      if (norm) { v[size_t(i)] = st::float_to_bf16(1.0f); continue; }
      const uint64_t r = model::splitmix64(counter++);
      double u = 0;  // four 16-bit uniforms: mean 2, variance 4/12
      for (int k = 0; k < 4; ++k) u += double((r >> (16 * k)) & 0xFFFF) / 65536.0;
      v[size_t(i)] = st::float_to_bf16(static_cast<float>((u - 2.0) * std::sqrt(3.0) * 0.02));
    }
    tensors.push_back({t.name, t.shape, st::DType::BF16, nullptr, v.data()});
  }
  st::write_file(out / "model.safetensors", tensors, {{"format", "pt"}});
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{}: {} parameters, {} tensors, model.safetensors {:.1f} MB ({:.1f} s)\n",
             out.string(), layout.numel(), tensors.size(),
             static_cast<double>(fs::file_size(out / "model.safetensors")) * 1e-6, s);
  return 0;
}
