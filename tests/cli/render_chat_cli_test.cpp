// A model's own chat template through the binary: render-chat prints exactly Jinja2's renders (the
// golden fixtures of scripts/chat_template_golden.py) and reports a refused conversation with its
// line; prepare --chat with a tokenizer_config.json stores the rendered conversations with the
// loss on the answers; generate --chat prompts with the template's generation prompt.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_fixture.h"
#include "data/chat_documents.h"
#include "data/open.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::english_document;
using longtron::testing::read_file;
using longtron::testing::run_command;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::tiny_model_toml;
using longtron::testing::write_file;
namespace ld = longtron::data;
namespace lt = longtron::text;

namespace {

const std::string kDir = std::string(LONGTRON_SOURCE_DIR) + "/tests/fixtures/chat_templates/";

TEST(RenderChatCli, PrintsJinja2sRenders) {
  std::map<std::string, std::vector<std::string>> golden;  // model -> texts without generation prompt
  std::istringstream renders(read_file(kDir + "renders.jsonl"));
  std::string line;
  while (std::getline(renders, line)) {
    const auto r = nlohmann::json::parse(line);
    if (!r["add_generation_prompt"].get<bool>() && r.contains("text"))
      golden[r["template"]].push_back(r["text"]);
  }
  for (const char* model : {"llama3", "qwen3", "deepseek_v3"}) {
    TempDir dir;
    const auto r = run_command("{ " + std::string(LONGTRON_BINARY) + " render-chat --chat-template " + kDir + model +
                               ".json --input " + kDir + "conversations.jsonl > " + (dir / "out.jsonl").string() + "; }");
    ASSERT_EQ(r.status, 0) << r.output;
    std::istringstream out(read_file(dir / "out.jsonl"));
    std::vector<std::string> texts;
    while (std::getline(out, line)) texts.push_back(nlohmann::json::parse(line)["text"]);
    EXPECT_EQ(texts, golden[model]) << model;
  }
  // Gemma 3 refuses two user messages in a row: the line, the template's message, exit status 1.
  const auto r = run_longtron("render-chat --chat-template " + kDir + "gemma3.json --input " + kDir +
                              "conversations.jsonl");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "conversations.jsonl, line 8")) << r.output;
  EXPECT_TRUE(contains(r.output, "Conversation roles must alternate")) << r.output;
  EXPECT_TRUE(contains(r.output, "7 of 8 conversations rendered")) << r.output;
}

// 16 conversations of two exchanges of generated English-like sentences.
std::string conversations_jsonl() {
  std::mt19937 gen(5);
  std::string out;
  for (int c = 0; c < 16; ++c) {
    nlohmann::json messages = nlohmann::json::array();
    if (c % 2 == 0) messages.push_back({{"role", "system"}, {"content", "answer briefly"}});
    for (int t = 0; t < 2; ++t) {
      messages.push_back({{"role", "user"}, {"content", english_document(gen, 1)}});
      std::string answer = " ";  // spaces around each answer: Llama 3's template trims them
      answer += english_document(gen, 1);
      answer += ' ';
      messages.push_back({{"role", "assistant"}, {"content", answer}});
    }
    out += nlohmann::json{{"messages", messages}}.dump() + "\n";
  }
  return out;
}

TEST(RenderChatCli, PrepareTrainGenerateWithAModelsTemplate) {
  TempDir dir;
  fs::create_directories(dir / "model");
  fs::copy_file(kDir + "llama3.json", dir / "model" / "tokenizer_config.json");
  write_file(dir / "chat.jsonl", conversations_jsonl());
  auto r = run_longtron("prepare --chat --chat-template " + (dir / "model").string() + " --input " +
                        (dir / "chat.jsonl").string() + " --output " + (dir / "data").string() +
                        " --train-tokenizer --vocab-size 400 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto tok = lt::Tokenizer::load(dir / "data" / "tokenizer.model");
  const int32_t begin = tok.piece_id("<|begin_of_text|>"), eot = tok.piece_id("<|eot_id|>");
  ASSERT_GE(begin, 0);  // the template's special tokens joined the trained vocabulary
  ASSERT_GE(eot, 0);
  // Stored ids equal the library's encoding; each starts with the template's BOS (no second one).
  const lt::ChatEncoder encoder(lt::load_chat_template((dir / "model").string()), tok);
  const auto conversations = lt::read_conversations(dir / "chat.jsonl");
  const ld::Dataset train = ld::open_dataset(dir / "data" / "train");
  ASSERT_EQ(train[0]->num_documents(), conversations.size());
  for (size_t d = 0; d < conversations.size(); ++d) {
    std::vector<int32_t> ids(train[0]->document_length(d));
    train[0]->read_tokens(d, 0, ids.size(), ids.data());
    const auto& c = conversations[d];
    EXPECT_EQ(ids, ld::to_stored_ids(encoder.encode(c.messages, c.where))) << c.where;
    EXPECT_EQ(ids[0], -begin);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), -begin), 1);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 2);  // the answers' end of turn carries loss
    EXPECT_EQ(std::count(ids.begin(), ids.end(), -eot), c.messages.size() - 2);  // the others do not
  }
  write_file(dir / "sft.toml", tiny_model_toml(32) + "[data]\ntrain_folder = \"" + (dir / "data" / "train").string() +
                                   "\"\nseq_len = 128\nmicro_bsz = 1\nsplit_documents = false\n"
                                   "[optimizer]\nlr = 1e-2\n[train]\ntotal_steps = 2\nnum_threads = 1\n"
                                   "checkpoint_dir = \"" + (dir / "ckpt").string() + "\"\n");
  r = run_longtron("train --config " + (dir / "sft.toml").string());
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron("generate --checkpoint " + (dir / "ckpt").string() + " --chat --chat-template " +
                   (dir / "model" / "tokenizer_config.json").string() +
                   " --prompt 'the state of the union' --max-new-tokens 3 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto prompt = encoder.encode_prompt({{lt::ChatMessage::Role::kUser, "the state of the union"}});
  EXPECT_EQ(prompt.front(), begin);
  EXPECT_EQ(prompt.back(), tok.encode("\n\n", false).back());  // "…assistant<|end_header_id|>\n\n"
  EXPECT_TRUE(contains(r.output, "generate: " + std::to_string(prompt.size()) + " prompt tokens")) << r.output;
}

}  // namespace
