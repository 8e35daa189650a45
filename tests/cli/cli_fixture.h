// Fixture pieces shared by the CLI tests: a generated English-like corpus and `longtron prepare`
// on it (the tokenizer is trained on the corpus itself, so the tests need no data files).
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace longtron::testing {

/// Whether `text` (a command's output) holds `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// One document of `sentences` sentences of 7 words drawn by `gen` from a fixed 15-word list, each
/// sentence ending in ". " (so the text ends with a space). Draws exactly 7·sentences numbers.
inline std::string english_document(std::mt19937& gen, int sentences) {
  static const char* const words[] = {"the", "state", "of", "union", "congress",
                                      "people", "nation", "peace", "war", "trade",
                                      "law", "citizens", "government", "treaty", "revenue"};
  std::string doc;
  for (int s = 0; s < sentences; ++s) {
    for (int w = 0; w < 7; ++w) doc += std::string(w ? " " : "") + words[gen() % 15];
    doc += ". ";
  }
  return doc;
}

/// The documents as .jsonl text: one {"text": doc} object per line.
inline std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string jsonl;
  for (const std::string& doc : docs) jsonl += nlohmann::json{{"text", doc}}.dump() + "\n";
  return jsonl;
}

/// Writes `jsonl` to dir/corpus.jsonl and runs `longtron prepare` into dir/data with a tokenizer
/// trained on it (vocab 400, one thread) and the given --valid-fraction; expects exit status 0.
inline void prepare_corpus(const TempDir& dir, const std::string& jsonl,
                           const std::string& valid_fraction) {
  write_file(dir / "corpus.jsonl", jsonl);
  const CommandResult r = run_longtron(
      "prepare --input " + (dir / "corpus.jsonl").string() + " --output " +
      (dir / "data").string() + " --train-tokenizer --vocab-size 400 --valid-fraction " +
      valid_fraction + " --threads 1");
  EXPECT_EQ(r.status, 0) << r.output;
}

/// The [model] table of the tiny test model (vocab 400, hidden 32, 2 layers, 4 heads, 2 kv heads).
inline std::string tiny_model_toml(int multiple_of) {
  return "[model]\nvocab_size = 400\nhidden_size = 32\nnum_layers = 2\nnum_attention_heads = 4\n"
         "num_kv_attention_heads = 2\nmultiple_of = " + std::to_string(multiple_of) + "\n";
}

/// Prepares 16 documents of generated English-like text into dir/data (vocab 400, 25% valid) and
/// writes dir/tiny.toml for a tiny model on it (6 steps, checkpoints in dir/ckpt, metrics in
/// dir/metrics.jsonl).
struct Prepared {
  TempDir dir;
  Prepared() {
    std::mt19937 gen(3);
    std::vector<std::string> docs;
    for (int d = 0; d < 16; ++d) docs.push_back(english_document(gen, 30));
    prepare_corpus(dir, jsonl_of(docs), "0.25");
    write_file(dir / "tiny.toml",
               tiny_model_toml(32) +
               "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
               "\"\nvalid_folder = \"" + (dir / "data" / "valid").string() +
               "\"\nseq_len = 64\nmicro_bsz = 2\n"
               "[optimizer]\nlr = 1e-2\n[train]\ntotal_steps = 6\nnum_threads = 1\n"
               "checkpoint_dir = \"" + (dir / "ckpt").string() + "\"\nmetrics_file = \"" +
               (dir / "metrics.jsonl").string() + "\"\n");
  }
  /// " --config DIR/tiny.toml", to append to a command.
  std::string config() const { return " --config " + (dir / "tiny.toml").string(); }
};

/// The folder `dir`/llama: the golden Llama fixture's weights (tests/fixtures/llama_golden) and its
/// config.json without eos_token_id, so that generation runs to --max-new-tokens.
inline std::filesystem::path golden_llama_without_eos(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path folder = dir / "llama";
  fs::create_directories(folder);
  const fs::path fixture = fs::path(LONGTRON_SOURCE_DIR) / "tests/fixtures/llama_golden";
  fs::copy_file(fixture / "model.safetensors", folder / "model.safetensors");
  nlohmann::json cfg = nlohmann::json::parse(read_file(fixture / "config.json"));
  cfg.erase("eos_token_id");
  write_file(folder / "config.json", cfg.dump(2));
  return folder;
}

/// `longtron ARGS` on `np` ranks under mpirun (one thread each, 120 s limit; as root and with more
/// ranks than cores, as the test machines need), stdout and stderr together.
inline CommandResult mpirun_longtron(int np, const std::string& args) {
  return run_command("OMP_NUM_THREADS=1 timeout 120 mpirun -np " + std::to_string(np) +
                     " --oversubscribe --allow-run-as-root --bind-to none " + LONGTRON_BINARY +
                     " " + args + " 2>&1");
}

/// step → loss of the training rows of a metrics file (JSON lines; validation rows skipped).
inline std::map<int64_t, double> losses(const std::filesystem::path& metrics) {
  std::map<int64_t, double> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

/// The largest |got − ref| / |ref| over the steps of `got`, each of which must be in `ref`.
inline double max_rel_error(const std::map<int64_t, double>& got,
                            const std::map<int64_t, double>& ref) {
  double e = 0;
  for (const auto& [step, loss] : got) {
    EXPECT_TRUE(ref.count(step)) << "step " << step;
    if (ref.count(step)) e = std::max(e, std::abs(loss - ref.at(step)) / std::abs(ref.at(step)));
  }
  return e;
}

/// max_rel_error of two runs that must have logged the same steps.
inline double max_rel_error_same_steps(const std::map<int64_t, double>& got,
                                       const std::map<int64_t, double>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  return max_rel_error(got, ref);
}

}  // namespace longtron::testing
