// Chat templates: a three-turn conversation through each built-in template, with the expected ids
// and loss flags written by hand from the template text; messages, XTuner conversation and
// pre-tokenized rows giving the same packed rows; the errors a user meets.
//
// The tokenizer is trained here so every id is known by hand: its vocabulary is <unk> <s> </s>,
// the two ChatML markers, the 256 byte pieces <0x00>…<0xFF> (byte b = id 5 + b), then pieces of
// "z" only. No dummy prefix, identity normalization: text without "z" encodes byte by byte, except
// the space, which SentencePiece writes as the piece "▁" (id kSpace).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "data/chat_documents.h"
#include "data/internevo.h"
#include "data/memory_source.h"
#include "data/open.h"
#include "data/pretokenized.h"
#include "data/validate.h"
#include "expect_error.h"
#include "packing/pack.h"
#include "test_util.h"
#include "text/chat_template.h"

namespace longtron::text {
namespace {

// Chat documents through the dataset and packing layers: what the templates feed them.
using data::build_pack;
using data::Dataset;
using data::InternEvoWriter;
using data::kStoredLossZero;
using data::MemorySource;
using data::MicroBatch;
using data::open_dataset;
using data::open_pretokenized;
using data::PackConfig;
using data::to_stored_ids;
using data::validate_dataset;
using data::write_pretokenized;
using testing::expect_error;

class ZCorpus : public sentencepiece::SentenceIterator {
 public:
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> lines_{"zz zz", "zzz"};
  size_t i_ = 0;
};

Tokenizer byte_tokenizer(bool chatml_markers = true) {
  std::unordered_map<std::string, std::string> kw = {
      {"model_type", "bpe"},          {"vocab_size", "270"},
      {"byte_fallback", "true"},      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},  {"remove_extra_whitespaces", "false"},
      {"hard_vocab_limit", "false"},  {"character_coverage", "1"},
      {"minloglevel", "2"}};
  if (chatml_markers) kw["user_defined_symbols"] = "<|im_start|>,<|im_end|>";
  ZCorpus corpus;
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(kw, &corpus, &model);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return Tokenizer::from_serialized(model, "byte tokenizer");
}

constexpr int32_t kBos = 1, kEos = 2, kImStart = 3, kImEnd = 4, kSpace = 266;

/// Ids of text without special tokens: byte b -> 5 + b, space -> "▁".
std::vector<int32_t> bytes(const std::string& text) {
  std::vector<int32_t> ids;
  for (const unsigned char c : text) ids.push_back(c == ' ' ? kSpace : 5 + c);
  return ids;
}

/// The expected encoding, built piece by piece: `no` for tokens without loss, `yes` with.
struct Expected {
  std::vector<int32_t> ids;
  std::vector<char> loss;
  Expected& no(const std::vector<int32_t>& t) { return add(t, false); }
  Expected& yes(const std::vector<int32_t>& t) { return add(t, true); }
  Expected& add(const std::vector<int32_t>& t, bool l) {
    ids.insert(ids.end(), t.begin(), t.end());
    loss.insert(loss.end(), t.size(), l);
    return *this;
  }
};

// System "Be", then Hi -> Ok, Up -> No, Go -> So.
Conversation three_turns() {
  using R = ChatMessage::Role;
  return {{R::kSystem, "Be"}, {R::kUser, "Hi"},      {R::kAssistant, "Ok"}, {R::kUser, "Up"},
          {R::kAssistant, "No"}, {R::kUser, "Go"}, {R::kAssistant, "So"}};
}

// Labels of the packed row of one conversation: target of i is token i+1 when it carries loss.
std::vector<int32_t> expected_labels(const Expected& e, int64_t P) {
  std::vector<int32_t> labels(size_t(P), kIgnoreIndex);
  for (size_t i = 0; i + 1 < e.ids.size(); ++i)
    if (e.loss[i + 1]) labels[i] = e.ids[i + 1];
  return labels;
}

void check_golden(const std::string& name, const Expected& want) {
  SCOPED_TRACE(name);
  const Tokenizer tok = byte_tokenizer();
  ASSERT_EQ(tok.piece_id("▁"), kSpace);
  ASSERT_EQ(tok.piece_id("<|im_end|>"), kImEnd);
  const ChatEncoder encoder(load_chat_template(name), tok);
  const EncodedConversation got = encoder.encode(three_turns(), name);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.loss, want.loss);
  // Through storage and the packer: the -100 labels fall exactly where the template says.
  const int64_t P = int64_t(want.ids.size()) + 3;
  MemorySource source({to_stored_ids(got)});
  PackConfig pc;
  pc.seq_len = P;
  pc.micro_bsz = 1;
  const MicroBatch row = build_pack(source, {0}, pc)->row(0);
  EXPECT_EQ(std::vector<int32_t>(row.input_ids.begin(), row.input_ids.begin() + want.ids.size()),
            want.ids);
  EXPECT_EQ(row.labels, expected_labels(want, P));
}

TEST(ChatTemplate, GoldenInternLM2) {
  Expected e;
  e.no({kBos, kImStart}).no(bytes("system\nBe")).no({kImEnd}).no(bytes("\n"));
  for (const auto& [user, answer] : {std::pair{"Hi", "Ok"}, {"Up", "No"}, {"Go", "So"}}) {
    e.no({kImStart}).no(bytes(std::string("user\n") + user)).no({kImEnd}).no(bytes("\n"));
    e.no({kImStart}).no(bytes("assistant\n")).yes(bytes(answer)).yes({kImEnd}).no(bytes("\n"));
  }
  check_golden("internlm2", e);
}

TEST(ChatTemplate, GoldenChatML) {
  Expected e;  // as internlm2 without the leading <s>
  e.no({kImStart}).no(bytes("system\nBe")).no({kImEnd}).no(bytes("\n"));
  for (const auto& [user, answer] : {std::pair{"Hi", "Ok"}, {"Up", "No"}, {"Go", "So"}}) {
    e.no({kImStart}).no(bytes(std::string("user\n") + user)).no({kImEnd}).no(bytes("\n"));
    e.no({kImStart}).no(bytes("assistant\n")).yes(bytes(answer)).yes({kImEnd}).no(bytes("\n"));
  }
  check_golden("chatml", e);
}

TEST(ChatTemplate, GoldenLlama2) {
  Expected e;  // the system block opens the first [INST]; every exchange is <s>…</s>
  e.no({kBos}).no(bytes("[INST] <<SYS>>\nBe\n<</SYS>>\n\nHi [/INST]")).yes(bytes("Ok")).yes({kEos});
  e.no({kBos}).no(bytes("[INST] Up [/INST]")).yes(bytes("No")).yes({kEos});
  e.no({kBos}).no(bytes("[INST] Go [/INST]")).yes(bytes("So")).yes({kEos});
  check_golden("llama2", e);
}

TEST(ChatTemplate, GoldenMistral) {
  Expected e;  // one <s>; the system text and a blank line open the first [INST]
  e.no({kBos}).no(bytes("[INST] Be\n\nHi [/INST]")).yes(bytes("Ok")).yes({kEos});
  e.no(bytes("[INST] Up [/INST]")).yes(bytes("No")).yes({kEos});
  e.no(bytes("[INST] Go [/INST]")).yes(bytes("So")).yes({kEos});
  check_golden("mistral", e);
}

// The hand-written arrays above, spelled out once as plain numbers for the shortest template.
TEST(ChatTemplate, GoldenChatMLOneTurnAsNumbers) {
  const Tokenizer tok = byte_tokenizer();
  const ChatEncoder encoder(load_chat_template("chatml"), tok);
  const auto got = encoder.encode({{ChatMessage::Role::kUser, "Hi"}, {ChatMessage::Role::kAssistant, "Ok"}}, "t");
  // <|im_start|> u s e r \n H i <|im_end|> \n <|im_start|> a s s i s t a n t \n O k <|im_end|> \n
  const std::vector<int32_t> ids = {3, 122, 120, 106, 119, 15, 77, 110, 4, 15, 3, 102, 120, 120,
                                    110, 120, 121, 102, 115, 121, 15, 84, 112, 4, 15};
  const std::vector<char> loss = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0};
  EXPECT_EQ(got.ids, ids);
  EXPECT_EQ(got.loss, loss);
  // Stored: loss tokens positive, the rest negated.
  const auto stored = to_stored_ids(got);
  EXPECT_EQ(stored[20], -15);
  EXPECT_EQ(stored[21], 84);
  EXPECT_EQ(stored[23], 4);
  EXPECT_EQ(stored[24], -15);
}

TEST(ChatTemplate, GenerationPromptEndsWithAssistantPrefix) {
  const Tokenizer tok = byte_tokenizer();
  const ChatEncoder encoder(load_chat_template("internlm2"), tok);
  Expected e;
  e.no({kBos, kImStart}).no(bytes("user\nHi")).no({kImEnd}).no(bytes("\n"));
  e.no({kImStart}).no(bytes("assistant\n"));
  EXPECT_EQ(encoder.encode_prompt({{ChatMessage::Role::kUser, "Hi"}}), e.ids);
  EXPECT_EQ(encoder.end_of_turn_id(), kImEnd);
}

std::string messages_line() {
  return R"({"messages": [{"role": "system", "content": "Be"}, {"role": "user", "content": "Hi"},)"
         R"( {"role": "assistant", "content": "Ok"}, {"role": "user", "content": "Up"},)"
         R"( {"role": "assistant", "content": "No"}, {"role": "user", "content": "Go"},)"
         R"( {"role": "assistant", "content": "So"}]})";
}

std::string xtuner_line() {
  return R"({"conversation": [{"system": "Be", "input": "Hi", "output": "Ok"},)"
         R"( {"input": "Up", "output": "No"}, {"input": "Go", "output": "So"}]})";
}

// The same conversation as messages, as an XTuner conversation and pre-tokenized (HF labels
// written from the expected loss flags) gives the same stored ids and the same packed rows.
TEST(ChatTemplate, MessagesXTunerAndPretokenizedAgree) {
  testing::TempDir dir;
  testing::write_file(dir / "messages.jsonl", messages_line() + "\n");
  testing::write_file(dir / "xtuner.jsonl", "\n" + xtuner_line() + "\n");
  const auto a = read_conversations(dir / "messages.jsonl");
  const auto b = read_conversations(dir / "xtuner.jsonl");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].where, (dir / "xtuner.jsonl").string() + ", line 2");
  const Tokenizer tok = byte_tokenizer();
  const ChatEncoder encoder(load_chat_template("internlm2"), tok);
  const auto ea = encoder.encode(a[0].messages, a[0].where);
  const auto stored_a = to_stored_ids(ea);
  const auto stored_b = to_stored_ids(encoder.encode(b[0].messages, b[0].where));
  EXPECT_EQ(stored_a, stored_b);

  nlohmann::json row;
  row["input_ids"] = ea.ids;
  std::vector<int32_t> hf_labels;
  for (size_t i = 0; i < ea.ids.size(); ++i) hf_labels.push_back(ea.loss[i] ? ea.ids[i] : -100);
  row["labels"] = hf_labels;
  std::filesystem::create_directories(dir / "ds");
  testing::write_file(dir / "ds" / "sft.jsonl", row.dump() + "\n" + row.dump() + "\n");
  const Dataset ds = open_dataset(dir / "ds");
  ASSERT_EQ(ds.size(), 1u);
  ASSERT_EQ(ds[0]->num_documents(), 2u);
  std::vector<int32_t> stored_c(ds[0]->document_length(0));
  ds[0]->read_tokens(0, 0, stored_c.size(), stored_c.data());
  EXPECT_EQ(stored_c, stored_a);

  PackConfig pc;
  pc.seq_len = 40;
  pc.micro_bsz = 2;
  MemorySource mem({stored_a, stored_b});
  const auto from_chat = build_pack(mem, {0, 1}, pc);
  const auto from_jsonl = build_pack(*ds[0], {0, 1}, pc);
  ASSERT_EQ(from_chat->num_rows(), from_jsonl->num_rows());
  for (int64_t k = 0; k < from_chat->num_rows(); ++k) {
    const MicroBatch x = from_chat->row(k), y = from_jsonl->row(k);
    EXPECT_EQ(x.input_ids, y.input_ids);
    EXPECT_EQ(x.labels, y.labels);
    EXPECT_EQ(x.cu_seqlens, y.cu_seqlens);
  }
}

TEST(ChatTemplate, TemplateFileMatchesBuiltin) {
  testing::TempDir dir;
  testing::write_file(dir / "t.json", R"({"name": "mine", "system": "<|im_start|>system\n{content}<|im_end|>\n",
    "user": "<|im_start|>user\n{content}<|im_end|>\n",
    "assistant": "<|im_start|>assistant\n{content}<|im_end|>\n",
    "end_of_turn": "<|im_end|>", "special_tokens": ["<|im_start|>", "<|im_end|>"]})");
  const Tokenizer tok = byte_tokenizer();
  const auto mine = ChatEncoder(load_chat_template((dir / "t.json").string()), tok).encode(three_turns(), "t");
  const auto chatml = ChatEncoder(load_chat_template("chatml"), tok).encode(three_turns(), "t");
  EXPECT_EQ(mine.ids, chatml.ids);
  EXPECT_EQ(mine.loss, chatml.loss);

  testing::write_file(dir / "bad.json", R"({"user": "{content}", "assistant": "{content}</s>",
    "end_of_turn": "</s>", "special_tokens": ["</s>"], "colour": "red"})");
  expect_error([&] { load_chat_template((dir / "bad.json").string()); }, {"bad.json", "colour"});
  testing::write_file(dir / "bad2.json", R"({"user": "[INST]", "assistant": "{content}</s>",
    "end_of_turn": "</s>", "special_tokens": ["</s>"]})");
  expect_error([&] { load_chat_template((dir / "bad2.json").string()); }, {"\"user\"", "{content}"});
  testing::write_file(dir / "bad3.json", R"({"user": "{content}", "assistant": "{content}</s>",
    "end_of_turn": "<eot>", "special_tokens": ["</s>"]})");
  expect_error([&] { load_chat_template((dir / "bad3.json").string()); }, {"<eot>", "special_tokens"});
  expect_error([] { load_chat_template("vicuna"); }, {"vicuna", "internlm2, chatml, llama2, mistral"});
}

TEST(ChatTemplate, Errors) {
  // A special token that is no single id of the vocabulary is named.
  const Tokenizer plain = byte_tokenizer(/*chatml_markers=*/false);
  expect_error([&] { ChatEncoder(load_chat_template("chatml"), plain); }, {"<|im_start|>", "chatml"});
  const Tokenizer tok = byte_tokenizer();
  const ChatEncoder llama(load_chat_template("llama2"), tok);
  using R = ChatMessage::Role;
  expect_error([&] { llama.encode({{R::kUser, "a"}, {R::kSystem, "b"}}, "f.jsonl, line 9"); },
               {"f.jsonl, line 9", "system"});
  expect_error([&] { llama.encode({{R::kSystem, "a"}, {R::kAssistant, "b"}}, "c7"); },
               {"c7", "first user"});
  // A loss-carrying id 0 ("!" in Llama 3's and Qwen2's vocabularies) is kStoredLossZero, which
  // InternEvo's writer refuses; a no-loss 0 is stored as 0 (input 0, label -100).
  EXPECT_EQ(to_stored_ids({{5, 0}, {0, 1}}), (std::vector<int32_t>{-5, kStoredLossZero}));
  EXPECT_EQ(to_stored_ids({{5, 0}, {0, 0}}), (std::vector<int32_t>{-5, 0}));

  testing::TempDir dir;
  testing::write_file(dir / "c.jsonl", R"({"messages": [{"role": "robot", "content": "x"}]})" "\n");
  expect_error([&] { read_conversations(dir / "c.jsonl"); }, {"c.jsonl, line 1", "robot"});
  testing::write_file(dir / "d.jsonl", R"({"text": "hello"})" "\n");
  expect_error([&] { read_conversations(dir / "d.jsonl"); }, {"d.jsonl, line 1", "messages"});
}

TEST(Pretokenized, ShiftAndErrors) {
  testing::TempDir dir;
  testing::write_file(dir / "a.jsonl", R"({"input_ids": [7, 8, 9, 10], "labels": [-100, -100, 9, 10]})" "\n"
                                       R"({"input_ids": [4, 5]})" "\n");
  const auto src = open_pretokenized(dir / "a.jsonl");
  PackConfig pc;
  pc.seq_len = 8;
  pc.micro_bsz = 1;
  const MicroBatch row = build_pack(*src, {0, 1}, pc)->row(0);
  EXPECT_EQ(row.input_ids, (std::vector<int32_t>{7, 8, 9, 10, 4, 5, 0, 0}));
  // HF aligned labels shifted by one: position 1 predicts 9, position 2 predicts 10.
  EXPECT_EQ(row.labels, (std::vector<int32_t>{-100, 9, 10, -100, 5, -100, -100, -100}));

  std::filesystem::create_directories(dir / "ds");
  testing::write_file(dir / "ds" / "raw.jsonl", R"({"text": "hello"})" "\n");
  expect_error([&] { open_dataset(dir / "ds"); }, {"raw.jsonl", "input_ids", "prepare"});
  testing::write_file(dir / "b.jsonl", R"({"input_ids": [1, 2], "labels": [-100, 3]})" "\n");
  expect_error([&] { open_pretokenized(dir / "b.jsonl"); }, {"b.jsonl, line 1", "labels[1]"});
  testing::write_file(dir / "c.jsonl", R"({"input_ids": [1, 2], "labels": [-100]})" "\n");
  expect_error([&] { open_pretokenized(dir / "c.jsonl"); }, {"c.jsonl, line 1", "as long"});
}

// Token id 0 carrying loss (Hugging Face byte-level vocabularies give it to "!"): read from
// labels, packed as label 0, written back by write_pretokenized to the same rows, and refused by
// InternEvo's writer, whose stored 0 carries no loss.
TEST(Pretokenized, LossCarryingIdZero) {
  testing::TempDir dir;
  const std::string rows = R"({"input_ids": [3, 0, 5, 0], "labels": [-100, 0, -100, 0]})" "\n"
                           R"({"input_ids": [0, 6], "labels": [-100, 6]})" "\n";
  testing::write_file(dir / "z.jsonl", rows);
  const auto src = open_pretokenized(dir / "z.jsonl");
  std::vector<int32_t> first(4);
  src->read_tokens(0, 0, 4, first.data());
  EXPECT_EQ(first, (std::vector<int32_t>{-3, kStoredLossZero, -5, kStoredLossZero}));
  PackConfig pc;
  pc.seq_len = 8;
  pc.micro_bsz = 1;
  const MicroBatch row = build_pack(*src, {0, 1}, pc)->row(0);
  EXPECT_EQ(row.input_ids, (std::vector<int32_t>{3, 0, 5, 0, 0, 6, 0, 0}));
  EXPECT_EQ(row.labels, (std::vector<int32_t>{0, -100, 0, -100, 6, -100, -100, -100}));
  validate_dataset([&] { Dataset d; d.push_back(open_pretokenized(dir / "z.jsonl")); return d; }(), 7);

  std::vector<int32_t> second(2);
  src->read_tokens(1, 0, 2, second.data());
  write_pretokenized(dir / "w.jsonl", {&first, &second});
  EXPECT_EQ(testing::read_file(dir / "w.jsonl"), rows);

  InternEvoWriter writer(dir / "t.bin");
  expect_error([&] { writer.add_document(first.data(), first.size()); }, {"t.bin", "id 0", ".jsonl"});
}

}  // namespace
}  // namespace longtron::text
