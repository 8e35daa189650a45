// Preference training end to end through the binary: prepare --preference on TRL's three formats
// (the ids against the library's tokenizer and chat encoder), a bad line named by file and line,
// then train on the pairs with the reward metrics on the step line and in metrics.jsonl.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_fixture.h"
#include "data/preference_pairs.h"
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
using nlohmann::json;

namespace {

json message(const char* role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

/// A ChatML tokenizer trained on a few conversations (its vocabulary holds the markers).
struct Tokenizer {
  TempDir dir;
  fs::path model;
  Tokenizer() {
    std::mt19937 gen(3);
    std::string chats;
    for (int c = 0; c < 16; ++c)
      chats += json{{"messages", {message("user", english_document(gen, 1)),
                                  message("assistant", english_document(gen, 2))}}}.dump() + "\n";
    write_file(dir / "chat.jsonl", chats);
    const auto r = run_longtron("prepare --chat --chat-template chatml --input " +
                                (dir / "chat.jsonl").string() + " --output " +
                                (dir / "tok").string() + " --train-tokenizer --vocab-size 400 --threads 1");
    EXPECT_EQ(r.status, 0) << r.output;
    model = dir / "tok" / "tokenizer.model";
  }
};

TEST(PreferenceCli, PrepareReadsTrlsThreeFormats) {
  Tokenizer t;
  const std::string q = "the state of the union", a = "peace and trade", b = "war of law";
  const json prompt = {message("user", q)};
  write_file(t.dir / "pairs.jsonl",
             json{{"prompt", q}, {"chosen", a}, {"rejected", b}}.dump() + "\n" +
                 json{{"prompt", prompt},
                      {"chosen", {message("assistant", a)}},
                      {"rejected", {message("assistant", b)}}}.dump() + "\n" +
                 json{{"chosen", {message("user", q), message("assistant", a)}},
                      {"rejected", {message("user", q), message("assistant", b)}}}.dump() + "\n");
  const auto r = run_longtron("prepare --preference --chat-template chatml --tokenizer " +
                              t.model.string() + " --input " + (t.dir / "pairs.jsonl").string() +
                              " --output " + (t.dir / "data").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(t.dir / "data" / "dataset.json"))["pairs"], 3);
  const auto pairs = ld::open_preference_pairs(t.dir / "data" / "train" / "pairs.jsonl");
  ASSERT_EQ(pairs->num_pairs(), 3u);
  const auto tok = lt::Tokenizer::load(t.model);
  // Plain text as TRL's DPO data step: BOS + prompt, each answer + EOS, tokenized apart.
  std::vector<int32_t> want = {tok.bos_id()};
  for (int32_t id : tok.encode(q, false)) want.push_back(id);
  EXPECT_EQ(pairs->pair(0).prompt, want);
  want = tok.encode(a, false);
  want.push_back(tok.eos_id());
  EXPECT_EQ(pairs->pair(0).chosen, want);
  // Conversations through the template: the prompt with the generation prefix, then the rest.
  const lt::ChatEncoder encoder(lt::load_chat_template("chatml"), tok);
  const lt::Conversation conv = {{lt::ChatMessage::Role::kUser, q}};
  EXPECT_EQ(pairs->pair(1).prompt, encoder.encode_prompt(conv));
  lt::Conversation whole = conv;
  whole.push_back({lt::ChatMessage::Role::kAssistant, b});
  const auto ids = encoder.encode(whole, "x").ids;
  EXPECT_EQ(pairs->pair(1).rejected,
            std::vector<int32_t>(ids.begin() + long(pairs->pair(1).prompt.size()), ids.end()));
  // The implicit prompt is the shared leading message: the same pair as the explicit form.
  EXPECT_EQ(pairs->pair(2).prompt, pairs->pair(1).prompt);
  EXPECT_EQ(pairs->pair(2).chosen, pairs->pair(1).chosen);
  EXPECT_EQ(pairs->pair(2).rejected, pairs->pair(1).rejected);
}

TEST(PreferenceCli, BadLinesNameFileAndLine) {
  Tokenizer t;
  write_file(t.dir / "pairs.jsonl", json{{"prompt", "a"}, {"chosen", "b"}, {"rejected", "c"}}.dump() +
                                        "\n" + json{{"prompt", "a"}, {"chosen", "b"}}.dump() + "\n");
  auto r = run_longtron("prepare --preference --tokenizer " + t.model.string() + " --input " +
                        (t.dir / "pairs.jsonl").string() + " --output " + (t.dir / "out").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "pairs.jsonl, line 2") && contains(r.output, "\"rejected\""))
      << r.output;
  EXPECT_FALSE(fs::exists(t.dir / "out"));
  write_file(t.dir / "pairs.jsonl",
             json{{"prompt", {message("user", "a")}}, {"chosen", {message("assistant", "b")}},
                  {"rejected", {message("assistant", "c")}}}.dump() + "\n");
  r = run_longtron("prepare --preference --tokenizer " + t.model.string() + " --input " +
                   (t.dir / "pairs.jsonl").string() + " --output " + (t.dir / "out").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "line 1") && contains(r.output, "--chat-template")) << r.output;
}

TEST(PreferenceCli, TrainReportsRewardsAndStartsAtLog2) {
  Tokenizer t;
  std::mt19937 gen(5);
  std::string lines;
  for (int i = 0; i < 48; ++i)
    lines += json{{"prompt", english_document(gen, 1)},
                  {"chosen", english_document(gen, 1)},
                  {"rejected", english_document(gen, 1)}}.dump() + "\n";
  write_file(t.dir / "pairs.jsonl", lines);
  auto r = run_longtron("prepare --preference --tokenizer " + t.model.string() + " --input " +
                        (t.dir / "pairs.jsonl").string() + " --output " + (t.dir / "data").string() +
                        " --valid-fraction 0.25");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const std::string loss : {"sigmoid", "orpo"}) {
    const fs::path metrics = t.dir / (loss + ".jsonl");
    write_file(t.dir / "dpo.toml",
               tiny_model_toml(32) + "[data]\ntrain_folder = \"" + (t.dir / "data" / "train").string() +
                   "\"\nvalid_folder = \"" + (t.dir / "data" / "valid").string() + "\"\nseq_len = 64\nmicro_bsz = 2\nmicro_num = 2\n[optimizer]\nlr = 1e-3\n"
                   "[train]\ntotal_steps = 3\nnum_threads = 1\nmetrics_file = \"" +
                   metrics.string() + "\"\ncheckpoint_dir = \"" + (t.dir / loss).string() +
                   "\"\n[preference]\nloss_type = \"" + loss + "\"\n");
    r = run_longtron("train --config " + (t.dir / "dpo.toml").string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "reward_accuracy")) << r.output;
    std::istringstream rows(read_file(metrics));
    std::string line;
    int n = 0;
    int valid = 0;
    while (std::getline(rows, line)) {
      const json j = json::parse(line);
      if (j.contains("valid_loss")) {  // held-out pairs: at step 0 and the end
        EXPECT_TRUE(j.contains("valid_reward_accuracy") && j.contains("valid_reward_margin")) << line;
        if (valid++ == 0 && loss == "sigmoid") {  // before any update: the reference itself
          EXPECT_NEAR(j["valid_loss"].get<double>(), std::log(2.0), 1e-6);
        }
        continue;
      }
      for (const char* key : {"rewards_chosen", "rewards_rejected", "reward_accuracy",
                              "reward_margin", "logps_chosen", "logps_rejected"})
        EXPECT_TRUE(j.contains(key) && j[key].is_number()) << key << " in " << line;
      // Step 1: the policy is its reference, so every log-ratio is 0 and DPO's loss is log 2.
      if (n++ == 0 && loss == "sigmoid") {
        EXPECT_NEAR(j["loss"].get<double>(), std::log(2.0), 1e-6);
        EXPECT_EQ(j["reward_margin"].get<double>(), 0.0);
      }
      EXPECT_LT(j["logps_chosen"].get<double>(), 0.0);
    }
    EXPECT_EQ(n, 3);
    EXPECT_EQ(valid, 2);
  }
  // eval scores documents: a folder of pairs is refused, not scored as sequences.
  r = run_longtron("eval --checkpoint " + (t.dir / "sigmoid").string() + " --data " +
                   (t.dir / "data" / "valid").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "holds preference pairs")) << r.output;
  // [preference] over a folder of documents is an error, not a silent language-model run.
  write_file(t.dir / "docs.toml",
             tiny_model_toml(32) + "[data]\ntrain_folder = \"" + (t.dir / "tok").string() +
                 "\"\nseq_len = 64\nmicro_bsz = 2\n[train]\ntotal_steps = 1\n"
                 "[preference]\nbeta = 0.2\n");
  r = run_longtron("train --config " + (t.dir / "docs.toml").string());
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "[preference] is set") && contains(r.output, "prepare --preference"))
      << r.output;
}

}  // namespace
