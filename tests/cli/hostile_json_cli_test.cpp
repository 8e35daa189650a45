// Hostile JSON through the binary: a value nested 200,000 deep in config.json, a pre-tokenized
// row or state.json (nlohmann copies and dumps recursively: such a value overflowed the stack),
// and a NUL byte inside a .jsonl line (nlohmann's lexer took it for the end of the line and
// dropped what followed). Each must end in one short error naming the file, exit status 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_fixture.h"
#include "test_util.h"

namespace fs = std::filesystem;
using longtron::testing::CommandResult;
using longtron::testing::contains;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

const std::string kDeep = std::string(200000, '[') + std::string(200000, ']');

// Exit status 1 (an error, not a signal), the depth named, and a message of a few lines only
// (a 10,000-deep value used to be printed whole).
void expect_refused_deep(const CommandResult& r, const std::string& file) {
  EXPECT_EQ(r.status, 1) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, "nested deeper than 128")) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, file)) << r.output.substr(0, 2000);
  EXPECT_LT(r.output.size(), 2000u) << r.output.substr(0, 2000);
}

// A Llama folder (the golden fixture's weights) whose config.json has `key` = `value` added.
fs::path hf_folder(const TempDir& dir, const std::string& name, const std::string& key,
                   const std::string& value) {
  const fs::path fixture = fs::path(LONGTRON_SOURCE_DIR) / "tests/fixtures/llama_golden";
  const fs::path folder = dir / name;
  fs::create_directories(folder);
  fs::copy_file(fixture / "model.safetensors", folder / "model.safetensors");
  std::string config = read_file(fixture / "config.json");
  config.insert(config.find('{') + 1, "\n  \"" + key + "\": " + value + ",");
  write_file(folder / "config.json", config);
  return folder;
}

// Pre-tokenized rows for the golden model (vocab 32) and a config training on them.
void write_rows_and_config(const TempDir& dir) {
  std::string rows;
  for (int i = 0; i < 8; ++i) rows += R"({"input_ids": [1, 5, 6, 7, 8, 9, 10, 2]})" "\n";
  write_file(dir / "rows.jsonl", rows);
  write_file(dir / "ft.toml", "[data]\ntrain_folder = \"" + (dir / "rows.jsonl").string() +
                                  "\"\nseq_len = 8\nmicro_bsz = 1\n[train]\ntotal_steps = 1\n"
                                  "num_threads = 1\ncheckpoint_dir = \"" + (dir / "ckpt").string() +
                                  "\"\nmetrics_file = \"" + (dir / "m.jsonl").string() + "\"\n");
}

}  // namespace

TEST(HostileJson, DeepConfigJsonIsRefusedByEvalGenerateAndInitFrom) {
  TempDir dir;
  write_rows_and_config(dir);
  for (const std::string key : {"rope_scaling", "foo"}) {
    const fs::path hf = hf_folder(dir, "hf_" + key, key, kDeep);
    const std::string config = (hf / "config.json").string();
    expect_refused_deep(run_longtron("eval --checkpoint " + hf.string() + " --data " +
                                     (dir / "rows.jsonl").string() + " --seq-len 8 --micro-bsz 1"),
                        config);
    expect_refused_deep(run_longtron("generate --checkpoint " + hf.string() + " --prompt-ids 1,5"),
                        config);
    expect_refused_deep(run_longtron("train --config " + (dir / "ft.toml").string() +
                                     " --init-from " + hf.string() + " --overwrite"),
                        config);
  }
  // 10,000 levels were refused before, but with all 20 KB of the value in the message.
  const fs::path hf = hf_folder(dir, "hf_10k", "rope_scaling",
                                std::string(10000, '[') + std::string(10000, ']'));
  expect_refused_deep(run_longtron("generate --checkpoint " + hf.string() + " --prompt-ids 1,5"),
                      "config.json");
}

TEST(HostileJson, DeepLabelsAreRefusedByCheckDataAndInspect) {
  TempDir dir;
  const fs::path rows = dir / "rows.jsonl";
  write_file(rows, R"({"input_ids": [5, 6], "labels": [5, )" + kDeep + "]}\n");
  expect_refused_deep(run_longtron("check-data " + rows.string()), "rows.jsonl, line 1");
  expect_refused_deep(run_longtron("inspect --data " + rows.string() +
                                   " --seq-len 8 --micro-bsz 1 --micro-num 1"),
                      "rows.jsonl, line 1");
  // A label that is a shallow but long value is named by an excerpt, not whole.
  write_file(rows, R"({"input_ids": [5, 6], "labels": [5, [)" + std::string(20000, '7') + "]]}\n");
  const CommandResult r = run_longtron("check-data " + rows.string());
  EXPECT_EQ(r.status, 1) << r.output.substr(0, 2000);
  EXPECT_LT(r.output.size(), 1000u) << r.output.substr(0, 2000);
}

TEST(HostileJson, DeepStateJsonIsRefusedByResumeAndEval) {
  TempDir dir;
  write_rows_and_config(dir);
  const fs::path step = dir / "old" / "step_1";
  fs::create_directories(step);
  write_file(step / "state.json", R"({"step": 1, "extra": )" + kDeep + "}");
  const fs::path fixture = fs::path(LONGTRON_SOURCE_DIR) / "tests/fixtures/llama_golden";
  for (const char* file : {"config.json", "model.safetensors"}) fs::copy_file(fixture / file, step / file);
  expect_refused_deep(run_longtron("train --config " + (dir / "ft.toml").string() + " --resume " +
                                   step.string()),
                      "state.json");
  expect_refused_deep(run_longtron("eval --checkpoint " + step.string() + " --data " +
                                   (dir / "rows.jsonl").string()),
                      "state.json");
}

TEST(HostileJson, NulByteInAJsonlLineIsAnErrorAtItsOffset) {
  TempDir dir;
  const std::string nul(1, '\0');
  // Pre-tokenized rows: check-data and inspect.
  const fs::path rows = dir / "rows.jsonl";
  write_file(rows, R"({"input_ids": [1, 2]})" "\n" R"({"input_ids": [5, 6]})" + nul +
                       R"({"input_ids": [7, 8, 9]})" "\n");
  for (const std::string& command :
       {"check-data " + rows.string(),
        "inspect --data " + rows.string() + " --seq-len 8 --micro-bsz 1 --micro-num 1"}) {
    const CommandResult r = run_longtron(command);
    EXPECT_EQ(r.status, 1) << command << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "rows.jsonl, line 2, byte 21: not valid JSON: a NUL byte"))
        << command << "\n" << r.output;
  }
  // Conversations (prepare --chat) and raw text (prepare).
  const fs::path chat = dir / "chat.jsonl";
  const std::string conversation =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  write_file(chat, conversation + nul + conversation + "\n");
  CommandResult r = run_longtron("prepare --chat --chat-template chatml --input " + chat.string() +
                                 " --output " + (dir / "chat_out").string() +
                                 " --train-tokenizer --vocab-size 400 --threads 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "chat.jsonl, line 1, byte " + std::to_string(conversation.size()) +
                                     ": not valid JSON: a NUL byte"))
      << r.output;
  const fs::path text = dir / "text.jsonl";
  write_file(text, R"({"text": "one"})" "\n" R"({"text": "two"})" + nul + R"({"text": "three"})");
  r = run_longtron("prepare --input " + text.string() + " --output " + (dir / "text_out").string() +
                   " --train-tokenizer --vocab-size 400 --threads 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "text.jsonl, line 2, byte 15: not valid JSON: a NUL byte"))
      << r.output;
}
