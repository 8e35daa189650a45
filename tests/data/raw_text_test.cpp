// Raw text readers of `prepare`: .jsonl, .json (object / array), .txt, folders in sorted order.
#include "data/raw_text.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace ld = longtron::data;
using longtron::testing::TempDir;
using longtron::testing::write_file;

TEST(RawText, EachFormatAndSortedFolder) {
  TempDir dir;
  std::filesystem::create_directories(dir / "z");
  write_file(dir / "b.jsonl", "{\"text\": \"one\", \"id\": 1}\n\n{\"text\": \"two\"}\n");
  write_file(dir / "a.json", "[{\"text\": \"three\"}, {\"text\": \"  \"}, {\"text\": \"four\"}]");
  write_file(dir / "c.json", "{\"year\": 1790, \"text\": \"five\"}");
  write_file(dir / "d.txt", "six\n\nseven\r\n");
  write_file(dir / "z" / "e.jsonl", "{\"text\": \"eight\"}");
  write_file(dir / "README.md", "ignored");
  const auto docs = ld::read_text_inputs({dir.path()});
  EXPECT_EQ(docs, (std::vector<std::string>{"three", "four", "one", "two", "five", "six", "seven",
                                            "eight"}));
  write_file(dir / "f.jsonl", "{\"body\": \"nine\"}\n");
  EXPECT_EQ(ld::read_text_documents(dir / "f.jsonl", "body"), (std::vector<std::string>{"nine"}));
}

TEST(RawText, ErrorsNameFileAndLine) {
  TempDir dir;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const longtron::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  write_file(dir / "a.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"x\"}\n");
  EXPECT_NE(message([&] { ld::read_text_documents(dir / "a.jsonl"); }).find("a.jsonl, line 2: no string field \"text\""),
            std::string::npos);
  write_file(dir / "b.jsonl", "{\"text\": \"ok\"}\n{broken\n");
  EXPECT_NE(message([&] { ld::read_text_documents(dir / "b.jsonl"); }).find("b.jsonl, line 2, byte 1: not valid JSON"),
            std::string::npos);
  write_file(dir / "c.json", "[{\"text\": \"ok\"}, {\"text\": 3}]");
  EXPECT_NE(message([&] { ld::read_text_documents(dir / "c.json"); }).find("c.json, element 1"),
            std::string::npos);
  write_file(dir / "e.txt", "fine\nalso \xc3\x28 bad\n");  // 0xC3 without its continuation byte
  EXPECT_NE(message([&] { ld::read_text_documents(dir / "e.txt"); }).find("e.txt, line 2, byte 5: not valid UTF-8"),
            std::string::npos);
  write_file(dir / "g.jsonl", "{\"text\": \"\xff\"}\n");
  EXPECT_NE(message([&] { ld::read_text_documents(dir / "g.jsonl"); }).find("g.jsonl, line 1"),
            std::string::npos);
  write_file(dir / "d.csv", "x");
  EXPECT_NE(message([&] { ld::list_text_files({dir / "d.csv"}); }).find("d.csv: not a text input"),
            std::string::npos);
  EXPECT_NE(message([&] { ld::list_text_files({dir / "missing"}); }).find("missing: no such file"),
            std::string::npos);
}
