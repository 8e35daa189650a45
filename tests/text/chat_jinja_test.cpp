// A model's own Jinja chat template as --chat-template: loading (model folder, tokenizer_config.json,
// .jinja file, list-form templates, AddedToken special tokens), the loss mask found in the rendered
// text of the real Llama 3, Qwen3, Gemma 3 and DeepSeek-V3 templates (fixtures made by
// scripts/chat_template_golden.py), and the token ids of a rendered conversation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "expect_error.h"
#include "test_util.h"
#include "text/chat_jinja.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace longtron::text {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_file;
using R = ChatMessage::Role;

const std::string kDir = std::string(LONGTRON_SOURCE_DIR) + "/tests/fixtures/chat_templates/";
const std::vector<std::string> kModels = {"llama3", "qwen3", "gemma3", "deepseek_v3"};

std::vector<NamedConversation> fixture_conversations() { return read_conversations(kDir + "conversations.jsonl"); }

// The loss-carrying segments of a conversation, joined run by run.
std::vector<std::string> loss_runs(const std::vector<ChatSegment>& segments) {
  std::vector<std::string> runs;
  bool in_run = false;
  for (const auto& s : segments) {
    if (s.loss && in_run) runs.back() += s.text;
    else if (s.loss) runs.push_back(s.text);
    in_run = s.loss;
  }
  return runs;
}

// Ids of text pieces: a piece that is a vocabulary token is its id, any other is encoded.
std::vector<int32_t> ids_of(const Tokenizer& tok, std::initializer_list<std::string> parts) {
  std::vector<int32_t> ids;
  for (const auto& p : parts) {
    if (tok.piece_id(p) >= 0 && p.front() == '<') {
      ids.push_back(tok.piece_id(p));
      continue;
    }
    for (int32_t id : tok.encode(p, false)) ids.push_back(id);
  }
  return ids;
}

TEST(ChatJinja, EndOfTurnOfEachModel) {
  const std::vector<std::string> expected = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>",
                                             "<｜end▁of▁sentence｜>"};
  for (size_t i = 0; i < kModels.size(); ++i) {
    const ChatTemplate t = load_chat_template(kDir + kModels[i] + ".json");
    ASSERT_TRUE(t.jinja) << kModels[i];
    EXPECT_EQ(t.end_of_turn, expected[i]) << kModels[i];
  }
}

TEST(ChatJinja, SegmentsRebuildTheRenderAndEndEachAnswerAtItsTurnEnd) {
  const auto conversations = fixture_conversations();
  for (const auto& model : kModels) {
    const ChatTemplate t = load_chat_template(kDir + model + ".json");
    for (const auto& c : conversations) {
      SCOPED_TRACE(model + ": " + c.where);
      std::vector<ChatSegment> segments;
      try {
        segments = chat_segments(t, c.messages, false, c.where);
      } catch (const Error& e) {  // only Gemma's refusal of two user messages in a row
        EXPECT_EQ(model, "gemma3");
        EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos) << e.what();
        continue;
      }
      std::string joined;
      for (const auto& s : segments) joined += s.text;
      EXPECT_EQ(joined, chat_text(t, c.messages));
      size_t answers = 0;
      for (const auto& m : c.messages) answers += m.role == R::kAssistant;
      const auto runs = loss_runs(segments);
      ASSERT_EQ(runs.size(), answers);
      for (const auto& run : runs) {
        ASSERT_GE(run.size(), t.end_of_turn.size());
        EXPECT_EQ(run.substr(run.size() - t.end_of_turn.size()), t.end_of_turn) << run;
      }
    }
  }
}

TEST(ChatJinja, LossFallsOnTheAnswerAsTheTemplateWroteIt) {
  const auto conversations = fixture_conversations();
  // Llama 3 trims each message: the answer's stripped text carries loss, through <|eot_id|>.
  const ChatTemplate llama = load_chat_template(kDir + "llama3.json");
  EXPECT_EQ(loss_runs(chat_segments(llama, conversations[4].messages, false, "c4")),
            (std::vector<std::string>{"spaced answer<|eot_id|>", "answer with newlines<|eot_id|>",
                                      "{'a': 1} {{ y }} %}<|eot_id|>", "done<|eot_id|>"}));
  // Qwen3 drops the reasoning of earlier turns and writes the last one's again: the answer after
  // </think> carries loss, through <|im_end|> but not the "\n" after it.
  const ChatTemplate qwen = load_chat_template(kDir + "qwen3.json");
  const auto segments = chat_segments(qwen, conversations[5].messages, false, "c5");
  EXPECT_EQ(loss_runs(segments), (std::vector<std::string>{"The answer.<|im_end|>", "Final.<|im_end|>"}));
  EXPECT_EQ(segments.back().text, "\n");
  EXPECT_FALSE(segments.back().loss);
  // DeepSeek-V3: verbatim answers, through <｜end▁of▁sentence｜>; the text starts with its BOS.
  const ChatTemplate deepseek = load_chat_template(kDir + "deepseek_v3.json");
  const auto ds = chat_segments(deepseek, conversations[3].messages, false, "c3");
  EXPECT_EQ(loss_runs(ds), (std::vector<std::string>{"Très bien, merci ! 👍<｜end▁of▁sentence｜>",
                                                     "Oui.\nDeux lignes.<｜end▁of▁sentence｜>"}));
  EXPECT_EQ(ds.front().text.rfind("<｜begin▁of▁sentence｜>", 0), 0u);
  // An answer that repeats the user's words is found after them, not in them.
  EXPECT_EQ(loss_runs(chat_segments(llama, {{R::kUser, "Yes"}, {R::kAssistant, "Yes"}}, false, "echo")),
            (std::vector<std::string>{"Yes<|eot_id|>"}));
  const auto echo = chat_segments(qwen, {{R::kUser, "Yes"}, {R::kAssistant, "Yes"}}, false, "echo");
  ASSERT_GE(echo.size(), 2u);
  EXPECT_EQ(echo[0].text, "<|im_start|>user\nYes<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_FALSE(echo[0].loss);
  // A generation prompt is one no-loss segment ending with the reply header.
  const auto prompt = chat_segments(llama, {{R::kUser, "Hi"}}, true, "prompt");
  ASSERT_EQ(prompt.size(), 1u);
  EXPECT_FALSE(prompt[0].loss);
  EXPECT_EQ(prompt[0].text, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// An empty answer's loss falls on the end-of-turn token of the assistant's turn, not on the end of
// the user's turn just before it (where an empty string also "occurs").
TEST(ChatJinja, EmptyAnswerEndsItsOwnTurn) {
  for (const std::string model : {"llama3", "qwen3"}) {
    const ChatTemplate t = load_chat_template(kDir + model + ".json");
    const auto segments = chat_segments(t, {{R::kUser, "Say yes"}, {R::kAssistant, ""}}, false, model);
    std::string before;
    for (const auto& s : segments) {
      if (s.loss) break;
      before += s.text;
    }
    const std::string header = model == "llama3" ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                                                 : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    EXPECT_TRUE(before.size() >= header.size() && before.compare(before.size() - header.size(), header.size(), header) == 0)
        << model << ": loss starts after " << before;
    EXPECT_EQ(loss_runs(segments), (std::vector<std::string>{model == "llama3" ? "<|eot_id|>" : "<|im_end|>"}))
        << model;
  }
}

// The names of a template list without "default" are quoted a line's worth, not whole.
// An answer that is also a word of the template's own headers ("assistant" in Llama 3's
// <|start_header_id|>assistant<|end_header_id|>), or only white space, carries loss where the
// answer is, not in the header or at the end of the user's turn.
TEST(ChatJinja, AnswerThatMatchesTheHeaderIsTakenFromTheAnswer) {
  const ChatTemplate llama = load_chat_template(kDir + "llama3.json");
  const auto segments = chat_segments(llama, {{R::kUser, "Hi"}, {R::kAssistant, "assistant"}}, false, "h");
  std::string before;
  for (const auto& s : segments) {
    if (s.loss) break;
    before += s.text;
  }
  EXPECT_EQ(before, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(loss_runs(segments), (std::vector<std::string>{"assistant<|eot_id|>"}));
  const ChatTemplate qwen = load_chat_template(kDir + "qwen3.json");
  const auto blank = chat_segments(qwen, {{R::kUser, "Hi"}, {R::kAssistant, "\n"}}, false, "b");
  ASSERT_FALSE(blank.empty());
  EXPECT_EQ(blank[0].text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(loss_runs(blank), (std::vector<std::string>{"<|im_end|>"}));
  // An answer equal to the question, where nothing special follows the question (DeepSeek-V3), or
  // to a system text merged into the user's turn (Gemma 3), was refused as not found.
  const ChatTemplate deepseek = load_chat_template(kDir + "deepseek_v3.json");
  EXPECT_EQ(loss_runs(chat_segments(deepseek, {{R::kUser, "yes"}, {R::kAssistant, "yes"}}, false, "d")),
            (std::vector<std::string>{"yes<｜end▁of▁sentence｜>"}));
  const ChatTemplate gemma = load_chat_template(kDir + "gemma3.json");
  EXPECT_EQ(loss_runs(chat_segments(gemma, {{R::kSystem, "Ok"}, {R::kUser, "Ok"}, {R::kAssistant, "Ok"}}, false, "g")),
            (std::vector<std::string>{"Ok<end_of_turn>"}));
}

TEST(ChatJinja, MissingDefaultTemplateMessageStaysShort) {
  TempDir dir;
  nlohmann::json list = nlohmann::json::array();
  for (int i = 0; i < 50; ++i) list.push_back({{"name", std::string(5000, 'n') + std::to_string(i)}, {"template", "x"}});
  write_file(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", list}}.dump());
  try {
    load_chat_template(dir.path().string());
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no entry named \"default\""), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), 2000u);
  }
}

TEST(ChatJinja, AnswerNotInTheRenderedTextIsRefused) {
  TempDir dir;
  write_file(dir / "tokenizer_config.json",
             nlohmann::json{{"chat_template", "{% for m in messages %}{{ m.content | upper }}<|im_end|>{% endfor %}"},
                            {"eos_token", "<|im_end|>"}}.dump());
  const ChatTemplate t = load_chat_template(dir.path().string());
  EXPECT_EQ(t.end_of_turn, "");  // the probe answer "Hello" is written "HELLO"
  expect_error([&] { chat_segments(t, {{R::kUser, "q"}, {R::kAssistant, "answer"}}, false, "chat.jsonl, line 7"); },
               {"chat.jsonl, line 7", "message 1", "not in the text"});
}

TEST(ChatJinja, LoadingFromFolderConfigAndJinjaFile) {
  TempDir dir;
  // List-form chat_template: the entry named "default"; AddedToken special tokens.
  nlohmann::json config = {
      {"chat_template", {{{"name", "tool_use"}, {"template", "TOOLS"}},
                         {{"name", "default"}, {"template", "{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
                                                            "{{ m.content }}{{ eos_token }}{% endfor %}"}}}},
      {"bos_token", {{"__type", "AddedToken"}, {"content", "<B>"}}},
      {"eos_token", {{"content", "<E>"}, {"special", true}}},
      {"added_tokens_decoder", {{"5", {{"content", "<X>"}, {"special", false}}}}}};
  write_file(dir / "tokenizer_config.json", config.dump());
  const Conversation c = {{R::kUser, "hi"}, {R::kAssistant, "yo"}};
  ChatTemplate t = load_chat_template((dir / "tokenizer_config.json").string());
  EXPECT_EQ(chat_text(t, c), "<B>[user]hi<E>[assistant]yo<E>");
  EXPECT_EQ(t.end_of_turn, "<E>");
  EXPECT_EQ(t.special_tokens, (std::vector<std::string>{"<B>", "<E>", "<X>"}));
  EXPECT_EQ(t.end_tokens, (std::vector<std::string>{"<B>", "<E>"}));
  // The folder: the same; with chat_template.jinja, that file wins (tokens still from the config).
  EXPECT_EQ(chat_text(load_chat_template(dir.path().string()), c), "<B>[user]hi<E>[assistant]yo<E>");
  write_file(dir / "chat_template.jinja", "{% for m in messages %}{{ m.content }}{{ eos_token }}\n{% endfor %}\n");
  EXPECT_EQ(chat_text(load_chat_template(dir.path().string()), c), "hi<E>\nyo<E>\n");
  EXPECT_EQ(chat_text(load_chat_template((dir / "chat_template.jinja").string()), c), "hi<E>\nyo<E>\n");
  // Errors: no default entry; a folder with neither file; a syntax error names the line.
  config["chat_template"] = {{{"name", "rag"}, {"template", "x"}}};
  write_file(dir / "other.json", config.dump());
  expect_error([&] { load_chat_template((dir / "other.json").string()); }, {"other.json", "default", "rag"});
  TempDir empty;
  expect_error([&] { load_chat_template(empty.path().string()); }, {"neither chat_template.jinja"});
  write_file(dir / "bad.jinja", "ok\n{% for m in messages %}\n{{ m.content }\n{% endfor %}");
  expect_error([&] { load_chat_template((dir / "bad.jinja").string()); }, {"bad.jinja", "template line 3"});
  // JSON without "chat_template" keeps the literal template-file format.
  write_file(dir / "literal.json", R"({"user": "U:{content}\n", "assistant": "A:{content}</s>\n",
                                       "end_of_turn": "</s>", "special_tokens": ["</s>"]})");
  EXPECT_FALSE(load_chat_template((dir / "literal.json").string()).jinja);
}

TEST(ChatJinja, EncodesEachSpecialTokenAsOneIdAndNoSecondBos) {
  const auto conversations = fixture_conversations();
  const ChatTemplate qwen = load_chat_template(kDir + "qwen3.json");
  std::vector<std::string> texts;
  for (const auto& c : conversations) texts.push_back(chat_text(qwen, c.messages));
  TokenizerTraining training;
  training.vocab_size = 400;
  training.threads = 1;
  training.keep_whitespace = true;
  training.user_defined_symbols = {"<|im_start|>", "<|im_end|>", "<think>", "</think>"};
  const Tokenizer tok = train_bpe_tokenizer(texts, training);
  const ChatEncoder encoder(qwen, tok);
  const int32_t im_start = tok.piece_id("<|im_start|>"), im_end = tok.piece_id("<|im_end|>");
  EXPECT_EQ(encoder.end_of_turn_id(), im_end);
  const auto& c = conversations[5].messages;
  const auto encoded = encoder.encode(c, "c5");
  ASSERT_EQ(encoded.ids.size(), encoded.loss.size());
  EXPECT_EQ(encoded.ids[0], im_start);  // Qwen3's template writes no BOS, and none is added
  // Expected: each segment split at the four added tokens, the rest encoded as plain text.
  std::vector<int32_t> ids;
  std::vector<char> loss;
  for (const auto& segment : chat_segments(qwen, c, false, "c5")) {
    size_t at = 0, chunk = 0;
    auto flush = [&](size_t end) {
      if (end <= chunk) return;
      for (int32_t id : tok.encode(segment.text.substr(chunk, end - chunk), false)) ids.push_back(id), loss.push_back(segment.loss);
    };
    while (at < segment.text.size()) {
      bool hit = false;
      for (const auto& token : training.user_defined_symbols)
        if (segment.text.compare(at, token.size(), token) == 0) {
          flush(at);
          ids.push_back(tok.piece_id(token));
          loss.push_back(segment.loss);
          at += token.size();
          chunk = at;
          hit = true;
          break;
        }
      if (!hit) ++at;
    }
    flush(segment.text.size());
  }
  EXPECT_EQ(encoded.ids, ids);
  EXPECT_EQ(encoded.loss, loss);
  // Exactly the two answers' <|im_end|> carry loss among the five of the conversation.
  int ends = 0, ends_with_loss = 0;
  for (size_t i = 0; i < ids.size(); ++i) ends += ids[i] == im_end, ends_with_loss += ids[i] == im_end && loss[i];
  EXPECT_EQ(ends, 5);
  EXPECT_EQ(ends_with_loss, 2);
  // The generation prompt ends with "<|im_start|>assistant\n".
  const auto prompt = encoder.encode_prompt({{R::kUser, "Hi"}});
  EXPECT_EQ(prompt, ids_of(tok, {"<|im_start|>", "user\nHi", "<|im_end|>", "\n", "<|im_start|>", "assistant\n"}));
  EXPECT_EQ(encoder.stop_ids(), std::vector<int32_t>{im_end});  // end of turn = eos_token here
  // A special token the template writes that the vocabulary lacks is refused, naming it.
  const ChatEncoder deepseek(load_chat_template(kDir + "deepseek_v3.json"), tok);
  expect_error([&] { deepseek.encode(c, "c5"); }, {"c5", "<｜begin▁of▁sentence｜>", "not a single id"});
}

}  // namespace
}  // namespace longtron::text
