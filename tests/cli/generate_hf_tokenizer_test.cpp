// `longtron generate --prompt` on a Hugging Face folder whose tokenizer is a tokenizer.json: the
// prompt is encoded with it and the answer decoded with it, giving the same tokens as
// `--prompt-ids` with the prompt's ids.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "cli_fixture.h"

namespace fs = std::filesystem;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::write_file;
using nlohmann::json;

TEST(GenerateHfTokenizer, PromptTextInTextOut) {
  TempDir dir;
  const fs::path folder = longtron::testing::golden_llama_without_eos(dir.path());
  ASSERT_EQ(json::parse(read_file(folder / "config.json"))["vocab_size"], 32);
  // One token per character: 26 letters and six more, ids 0..31, no merges.
  const std::string chars = "abcdefghijklmnopqrstuvwxyz ,.!?'";
  json vocab = json::object();
  for (size_t i = 0; i < chars.size(); ++i) vocab[std::string(1, chars[i])] = i;
  const json tokenizer = {{"added_tokens", json::array()}, {"normalizer", nullptr},
                          {"pre_tokenizer", nullptr}, {"post_processor", nullptr},
                          {"decoder", {{"type", "Fuse"}}},
                          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  write_file(folder / "tokenizer.json", tokenizer.dump());
  write_file(folder / "tokenizer_config.json", "{}");

  const auto text = run_longtron("generate --checkpoint " + folder.string() +
                                 " --prompt \"hello\" --max-new-tokens 5");
  ASSERT_EQ(text.status, 0) << text.output;
  const auto ids = run_longtron("generate --checkpoint " + folder.string() +
                                " --prompt-ids 7,4,11,11,14 --max-new-tokens 5");
  ASSERT_EQ(ids.status, 0) << ids.output;
  const auto first_line = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  std::string spelled;  // the ids' characters
  std::istringstream list(first_line(ids.output));
  for (std::string id; std::getline(list, id, ',');) spelled += chars.at(std::stoul(id));
  EXPECT_EQ(spelled.substr(0, 5), "hello");
  EXPECT_EQ(spelled.size(), 10u);
  EXPECT_EQ(first_line(text.output), spelled);
}
