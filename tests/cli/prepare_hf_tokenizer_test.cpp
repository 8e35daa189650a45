// `longtron prepare --tokenizer` with a Hugging Face model folder (tokenizer.json +
// tokenizer_config.json): the ids Hugging Face's library gives (tests/text/hf_tokenizer/golden.json)
// between the template's BOS and the config's EOS, the tokenizer files copied beside the data, and
// a broken tokenizer.json refused naming the file.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace fs = std::filesystem;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::write_file;
using nlohmann::json;

namespace {
const fs::path kFixtures = fs::path(LONGTRON_SOURCE_DIR) / "tests/text/hf_tokenizer";
}

TEST(PrepareHfTokenizer, FolderWithTokenizerJsonGivesHuggingFaceIdsWithBosAndEos) {
  TempDir dir;
  const fs::path model = dir / "model";
  fs::create_directories(model);
  const std::string tokenizer = read_file(kFixtures / "sentencepiece_bpe.tokenizer.json");
  const std::string config = R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})";
  write_file(model / "tokenizer.json", tokenizer);
  write_file(model / "tokenizer_config.json", config);
  const json texts = json::parse(read_file(kFixtures / "texts.json"));
  const json golden = json::parse(read_file(kFixtures / "golden.json"))["sentencepiece_bpe.tokenizer.json"];
  const std::vector<size_t> picked = {0, 6, 9, 12};  // plain, CRLF, emoji, special tokens in text
  std::string input;
  for (const size_t i : picked) input += json{{"text", texts[i]}}.dump() + "\n";
  write_file(dir / "docs.jsonl", input);

  const auto r = run_longtron("prepare --input " + (dir / "docs.jsonl").string() + " --output " +
                              (dir / "out").string() + " --tokenizer " + model.string() +
                              " --format internevo --threads 2");
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream bin(dir / "out/train/tokens.bin");
  std::string line;
  for (const size_t i : picked) {
    ASSERT_TRUE(std::getline(bin, line));
    std::vector<int32_t> want{1};
    for (const auto& id : golden[i]["ids"]) want.push_back(id.get<int32_t>());
    want.push_back(2);
    EXPECT_EQ(json::parse(line)["tokens"].get<std::vector<int32_t>>(), want) << "text " << i;
  }
  const json info = json::parse(read_file(dir / "out/dataset.json"));
  EXPECT_EQ(info["bos_id"], 1);
  EXPECT_EQ(info["eos_id"], 2);
  EXPECT_EQ(info["tokenizer"], "tokenizer.json");
  EXPECT_EQ(read_file(dir / "out/tokenizer.json"), tokenizer);
  EXPECT_EQ(read_file(dir / "out/tokenizer_config.json"), config);
  EXPECT_FALSE(fs::exists(dir / "out/tokenizer.model"));
}

TEST(PrepareHfTokenizer, BrokenTokenizerJsonIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string tokenizer = read_file(kFixtures / "gpt2.tokenizer.json");
  write_file(dir / "tokenizer.json", tokenizer.substr(0, tokenizer.size() - 100));
  write_file(dir / "docs.jsonl", "{\"text\": \"hello\"}\n");
  const auto r = run_longtron("prepare --input " + (dir / "docs.jsonl").string() + " --output " +
                              (dir / "out").string() + " --tokenizer " + (dir / "tokenizer.json").string());
  EXPECT_NE(r.status, 0);
  // "<file>, byte N: not a tokenizer.json: ..." (the JSON reader names the byte where it stopped).
  EXPECT_NE(r.output.find((dir / "tokenizer.json").string() + ", byte "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": not a tokenizer.json"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// Llama 3's and Qwen2's vocabularies give id 0 to "!": an answer holding it carries loss on id 0,
// which InternEvo's .bin cannot mark, so `prepare --chat` writes a pre-tokenized .jsonl with
// labels (and an explicit --format internevo is refused), and training reads it.
TEST(PrepareHfTokenizer, ChatAnswerWithIdZeroIsWrittenAsJsonlWithLabels) {
  TempDir dir;
  const fs::path model = dir / "model";
  fs::create_directories(model);
  json tok = json::parse(read_file(kFixtures / "gpt2.tokenizer.json"));
  json& vocab = tok["model"]["vocab"];
  std::string zero;
  for (const auto& [piece, id] : vocab.items())
    if (id == 0) zero = piece;
  const int32_t bang = vocab["!"].get<int32_t>();
  vocab[zero] = bang;  // "!" takes id 0, as in byte-level vocabularies ordered from "!"
  vocab["!"] = 0;
  int32_t next = static_cast<int32_t>(vocab.size());
  for (const auto& t : tok["added_tokens"]) next = std::max(next, t["id"].get<int32_t>() + 1);
  for (const char* special : {"<|im_start|>", "<|im_end|>"})
    tok["added_tokens"].push_back({{"id", next++}, {"content", special}, {"single_word", false},
                                   {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                   {"special", true}});
  write_file(model / "tokenizer.json", tok.dump());
  write_file(model / "tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  std::string chat;
  for (int i = 0; i < 4; ++i)
    chat += R"({"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello!"}]})" "\n";
  write_file(dir / "chat.jsonl", chat);
  const std::string prepare = "prepare --chat --chat-template chatml --input " +
                              (dir / "chat.jsonl").string() + " --tokenizer " + model.string() +
                              " --threads 1 --output ";
  auto r = run_longtron(prepare + (dir / "out").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("pre-tokenized .jsonl"), std::string::npos) << r.output;
  std::ifstream rows(dir / "out/train/tokens.jsonl");
  std::string line;
  int answers_with_zero = 0;
  while (std::getline(rows, line)) {
    const json row = json::parse(line);
    const auto ids = row["input_ids"].get<std::vector<int32_t>>();
    const auto labels = row["labels"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == 0 && labels[i] == 0) ++answers_with_zero;
  }
  EXPECT_EQ(answers_with_zero, 4);
  EXPECT_EQ(json::parse(read_file(dir / "out/dataset.json"))["format"], "jsonl");

  r = run_longtron(prepare + (dir / "bin").string() + " --format internevo");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("id 0"), std::string::npos) << r.output;
}
