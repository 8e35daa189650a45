// Supervised fine-tuning end to end through the binary: prepare --chat (with a trained tokenizer
// that gains the template's special tokens, and refused with one that lacks them), the stored ids
// against the library encoder, inspect --no-split-documents, train on the chat rows, eval and
// generate --chat from the checkpoint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "cli_fixture.h"
#include "data/chat_documents.h"
#include "data/open.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
using longtron::testing::english_document;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::tiny_model_toml;
using longtron::testing::write_file;
namespace ld = longtron::data;
namespace lt = longtron::text;

namespace {

// 24 conversations of two exchanges of generated English-like sentences, as messages .jsonl.
std::string conversations_jsonl() {
  std::mt19937 gen(11);
  std::string out;
  for (int c = 0; c < 24; ++c) {
    nlohmann::json messages = nlohmann::json::array();
    if (c % 3 == 0) messages.push_back({{"role", "system"}, {"content", "answer briefly"}});
    for (int t = 0; t < 2; ++t) {
      messages.push_back({{"role", "user"}, {"content", english_document(gen, 1)}});
      messages.push_back({{"role", "assistant"}, {"content", english_document(gen, 2)}});
    }
    out += nlohmann::json{{"messages", messages}}.dump() + "\n";
  }
  return out;
}

struct ChatPrepared {
  TempDir dir;
  longtron::testing::CommandResult prepared;
  ChatPrepared() {
    write_file(dir / "chat.jsonl", conversations_jsonl());
    prepared = run_longtron("prepare --chat --chat-template chatml --input " +
                            (dir / "chat.jsonl").string() + " --output " + (dir / "data").string() +
                            " --train-tokenizer --vocab-size 400 --valid-fraction 0.25 --threads 1");
  }
};

TEST(SftCli, PrepareChatStoresNoLossTokensNegative) {
  ChatPrepared p;
  ASSERT_EQ(p.prepared.status, 0) << p.prepared.output;
  const auto info = nlohmann::json::parse(read_file(p.dir / "data" / "dataset.json"));
  EXPECT_EQ(info["chat_template"], "chatml");
  EXPECT_EQ(info["format"], "internevo");
  EXPECT_FALSE(info["bos_eos"].get<bool>());
  const auto tok = lt::Tokenizer::load(p.dir / "data" / "tokenizer.model");
  EXPECT_GE(tok.piece_id("<|im_start|>"), 0);  // added to the trained vocabulary
  EXPECT_GE(tok.piece_id("<|im_end|>"), 0);
  // The stored ids equal the library's encoding of the same conversations with that tokenizer.
  const auto conversations = lt::read_conversations(p.dir / "chat.jsonl");
  const lt::ChatEncoder encoder(lt::load_chat_template("chatml"), tok);
  std::vector<std::vector<int32_t>> all;
  for (const auto& c : conversations) all.push_back(ld::to_stored_ids(encoder.encode(c.messages, c.where)));
  const ld::Dataset train = ld::open_dataset(p.dir / "data" / "train");
  ASSERT_EQ(train.size(), 1u);
  ASSERT_EQ(train[0]->num_documents(), 18u);
  size_t matched = 0, negatives = 0, positives = 0;
  for (size_t d = 0; d < train[0]->num_documents(); ++d) {
    std::vector<int32_t> ids(train[0]->document_length(d));
    train[0]->read_tokens(d, 0, ids.size(), ids.data());
    for (const auto& a : all) matched += (a == ids);
    for (int32_t id : ids) (id < 0 ? negatives : positives) += 1;
  }
  EXPECT_EQ(matched, 18u);
  EXPECT_GT(negatives, 0u);
  EXPECT_GT(positives, 0u);
}

TEST(SftCli, PrepareChatRefusals) {
  TempDir dir;
  write_file(dir / "chat.jsonl", conversations_jsonl());
  // A tokenizer without the ChatML markers: the run is refused, naming the token.
  auto r = run_longtron("prepare --chat --chat-template llama2 --input " + (dir / "chat.jsonl").string() +
                        " --output " + (dir / "l2").string() +
                        " --train-tokenizer --vocab-size 400 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_longtron("prepare --chat --chat-template chatml --input " + (dir / "chat.jsonl").string() +
                   " --output " + (dir / "out").string() + " --tokenizer " +
                   (dir / "l2" / "tokenizer.model").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "<|im_start|>")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
  r = run_longtron("prepare --chat --chat-template chatml --format megatron --input " +
                   (dir / "chat.jsonl").string() + " --output " + (dir / "out").string() +
                   " --train-tokenizer --vocab-size 400");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "megatron")) << r.output;
  r = run_longtron("prepare --chat --input " + (dir / "chat.jsonl").string() + " --output " +
                   (dir / "out").string() + " --train-tokenizer --vocab-size 400");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--chat-template")) << r.output;
}

TEST(SftCli, InspectTrainEvalGenerateChat) {
  ChatPrepared p;
  ASSERT_EQ(p.prepared.status, 0) << p.prepared.output;
  const auto tok = lt::Tokenizer::load(p.dir / "data" / "tokenizer.model");
  const int32_t im_start = tok.piece_id("<|im_start|>");
  // Every conversation is shorter than P = 256 here: without splitting, every row starts one.
  const std::string data = (p.dir / "data" / "train").string();
  for (const bool split : {false, true}) {
    const auto r = run_longtron("inspect --data " + data + " --seq-len 128 --micro-bsz 2 --micro-num 1 "
                                "--steps 6 --json" + (split ? "" : " --no-split-documents"));
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    bool all_start = true;
    for (const auto& step : j["steps"])
      for (const auto& mb : step["micro_batches"]) all_start &= mb["input_ids"][0] == im_start;
    EXPECT_EQ(all_start, !split) << "split_documents " << split;
  }
  write_file(p.dir / "sft.toml",
             tiny_model_toml(32) + "[data]\ntrain_folder = \"" + data + "\"\nvalid_folder = \"" +
                 (p.dir / "data" / "valid").string() +
                 "\"\nseq_len = 128\nmicro_bsz = 2\nsplit_documents = false\n"
                 "[optimizer]\nlr = 1e-2\n[train]\ntotal_steps = 4\nnum_threads = 1\n"
                 "checkpoint_dir = \"" + (p.dir / "ckpt").string() + "\"\n");
  auto r = run_longtron("train --config " + (p.dir / "sft.toml").string());
  ASSERT_EQ(r.status, 0) << r.output;
  // eval (split_documents = false from the checkpoint's config) scores exactly the answer
  // tokens of each held-out conversation: its stored ids > 0 after the first.
  r = run_longtron("eval --json --checkpoint " + (p.dir / "ckpt").string() + " --data " +
                   (p.dir / "data" / "valid").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto scored = nlohmann::json::parse(r.output.substr(0, r.output.find('\n')));
  const ld::Dataset valid = ld::open_dataset(p.dir / "data" / "valid");
  ASSERT_EQ(scored["documents"].size(), valid[0]->num_documents());
  for (size_t d = 0; d < valid[0]->num_documents(); ++d) {
    std::vector<int32_t> ids(valid[0]->document_length(d));
    valid[0]->read_tokens(d, 0, ids.size(), ids.data());
    int64_t answers = 0;
    for (size_t i = 1; i < ids.size(); ++i) answers += ids[i] > 0;
    EXPECT_EQ(scored["documents"][d]["tokens"].get<int64_t>(), answers) << "document " << d;
  }
  r = run_longtron("generate --checkpoint " + (p.dir / "ckpt").string() +
                   " --chat --chat-template chatml --prompt 'the state of the union' "
                   "--max-new-tokens 4 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  // The prompt is the template's: <|im_start|> user \n … <|im_end|> \n <|im_start|> assistant \n.
  const lt::ChatEncoder encoder(lt::load_chat_template("chatml"), tok);
  const auto prompt = encoder.encode_prompt({{lt::ChatMessage::Role::kUser, "the state of the union"}});
  EXPECT_TRUE(contains(r.output, "generate: " + std::to_string(prompt.size()) + " prompt tokens"))
      << r.output;
  r = run_longtron("generate --checkpoint " + (p.dir / "ckpt").string() + " --chat --prompt x");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--chat-template")) << r.output;
}

}  // namespace
