// Hugging Face tokenizer.json: ids and decoded text of small hand-made tokenizers (one per set of
// components, tests/text/hf_tokenizer/make_fixtures.py) against golden.json, which Hugging
// Face's own library wrote (scripts/hf_tokenizer_golden.js); refusals of bad files; the Tokenizer
// facade's BOS/EOS rules from tokenizer_config.json.
#include "text/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "expect_error.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace lt = longtron::text;
namespace fs = std::filesystem;
using longtron::testing::expect_error;
using nlohmann::json;

namespace {

const fs::path kDir = fs::path(LONGTRON_SOURCE_DIR) / "tests/text/hf_tokenizer";

json read_json(const fs::path& p) { return json::parse(longtron::testing::read_file(p)); }

std::string fixture(const std::string& name) {
  return longtron::testing::read_file(kDir / (name + ".tokenizer.json"));
}

// A small valid tokenizer.json to break in the refusal tests.
json small() {
  return json::parse(R"({
    "added_tokens": [{"id": 4, "content": "<s>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "<s>": 4},
              "merges": ["a b"]}})");
}

}  // namespace

TEST(HfTokenizer, IdsAndDecodingMatchHuggingFace) {
  const json texts = read_json(kDir / "texts.json");
  const json golden = read_json(kDir / "golden.json");
  ASSERT_GE(golden.size(), 11u);
  for (const auto& [file, cases] : golden.items()) {
    SCOPED_TRACE(file);
    const auto tok = lt::HfTokenizer::load(kDir / file);
    ASSERT_EQ(cases.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      SCOPED_TRACE(i);
      const std::string text = texts[i].get<std::string>();
      const auto ids = tok.encode(text);
      EXPECT_EQ(ids, cases[i]["ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(tok.decode(ids), cases[i]["decoded"].get<std::string>());
    }
  }
}

TEST(HfTokenizer, BothMergeFormatsGiveTheSameIds) {
  json pairs = small();
  pairs["model"]["merges"] = json::parse(R"([["a", "b"]])");
  const auto a = lt::HfTokenizer::from_json(small().dump(), "strings.json");
  const auto b = lt::HfTokenizer::from_json(pairs.dump(), "pairs.json");
  EXPECT_EQ(a.encode("abcab<s>a"), (std::vector<int32_t>{2, 3, 2, 4, 0}));
  EXPECT_EQ(b.encode("abcab<s>a"), a.encode("abcab<s>a"));
  EXPECT_EQ(a.vocab_size(), 5);
  EXPECT_EQ(a.token_id("<s>"), 4);
  EXPECT_EQ(a.token_id("zz"), -1);
  EXPECT_TRUE(a.is_special(4));
  EXPECT_FALSE(a.is_special(2));
}

TEST(HfTokenizer, RefusesBadFilesNamingFileAndReason) {
  const std::string text = small().dump();
  expect_error([&] { lt::HfTokenizer::from_json(text.substr(0, text.size() / 2), "cut.json"); },
               {"cut.json", "not a tokenizer.json"});
  json j = small();
  j["model"]["type"] = "WordPiece";
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "wp.json"); }, {"wp.json", "WordPiece", "BPE"});
  j = small();
  j["model"]["merges"] = json::array({"a z"});
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "m.json"); },
               {"m.json", "merge 0", "\"z\"", "not in the vocabulary"});
  j = small();
  j["model"]["merges"] = json::array({"b a"});  // "ba" is not a token
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "m.json"); }, {"m.json", "makes \"ba\""});
  j = small();
  j["model"]["vocab"]["d"] = -1;
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "ids.json"); }, {"ids.json", "out of range"});
  j = small();
  j["added_tokens"][0]["id"] = 4294967296LL;
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "ids.json"); }, {"ids.json", "out of range"});
  j = small();
  j["model"]["vocab"]["d"] = 1;
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "dup.json"); }, {"dup.json", "id 1"});
  // An id far beyond the vocabulary's size is refused before a table of that many entries is made.
  j = small();
  j["model"]["vocab"]["d"] = 2000000000;
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "sparse.json"); },
               {"sparse.json", "2000000000", "dense"});
  j = small();
  j["added_tokens"][0]["id"] = 1999999999;
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "sparse.json"); }, {"sparse.json", "dense"});
  j = small();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(a"},
                                       "behavior": "Isolated", "invert": false})");
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "re.json"); },
               {"re.json", "pre_tokenizer Split", "(a", "does not compile"});
  for (const auto& [key, type] : {std::pair{"normalizer", "Lowercase"}, {"pre_tokenizer", "Whitespace"},
                                  {"decoder", "WordPiece"}, {"post_processor", "Bogus"}}) {
    j = small();
    j[key] = {{"type", type}};
    expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "c.json"); }, {"c.json", key, type, "not supported"});
  }
  // A message quotes at most a line of an untrusted token or pattern, however long it is.
  for (int which = 0; which < 3; ++which) {
    j = small();
    const std::string huge(100000, 'q');
    if (which == 0) j["added_tokens"][0]["content"] = huge, j["added_tokens"][0]["lstrip"] = "yes";
    if (which == 1) j["model"]["merges"] = json::array({huge});
    if (which == 2)
      j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(" + huge}}}, {"behavior", "Isolated"},
                            {"invert", false}};
    try {
      lt::HfTokenizer::from_json(j.dump(), "long.json");
      ADD_FAILURE() << "no error for case " << which;
    } catch (const std::exception& e) {
      EXPECT_LT(std::string(e.what()).size(), 1000u) << which;
      EXPECT_NE(std::string(e.what()).find("long.json"), std::string::npos);
    }
  }
  // Normalizers that grow the text without bound (40 doublings) fail when encoding, not by
  // exhausting memory.
  j = small();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int i = 0; i < 40; ++i)
    j["normalizer"]["normalizers"].push_back({{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "aa"}});
  const auto doubling = lt::HfTokenizer::from_json(j.dump(), "grow.json");
  expect_error([&] { doubling.encode("ab ab"); }, {"grow.json", "Sequence", "times longer"});
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", std::string(100, 'a')}};
  const auto widening = lt::HfTokenizer::from_json(j.dump(), "grow.json");
  expect_error([&] { widening.encode(std::string(1000, 'a')); }, {"Replace", "times longer"});
  j = small();
  j["model"]["dropout"] = 0.1;
  expect_error([&] { lt::HfTokenizer::from_json(j.dump(), "d.json"); }, {"d.json", "dropout"});
  const auto tok = lt::HfTokenizer::from_json(small().dump(), "s.json");
  expect_error([&] { tok.encode("ab\xff"); }, {"s.json", "not valid UTF-8", "byte 2"});
}

TEST(HfTokenizer, FacadeAddsTemplateBosAndConfigEos) {
  longtron::testing::TempDir dir;
  const std::string json_text = fixture("bytelevel_split");
  const auto hf = lt::HfTokenizer::from_json(json_text, "x");
  const int32_t begin = hf.token_id("<|begin|>"), end = hf.token_id("<|end|>");
  const auto body = hf.encode("Hello there");
  // EOS from an AddedToken object; BOS from the TemplateProcessing post-processor.
  const auto tok = lt::Tokenizer::from_hf_json(json_text, "t.json", R"({"eos_token": {"content": "<|end|>"}})");
  EXPECT_FALSE(tok.is_sentencepiece());
  EXPECT_EQ(tok.bos_id(), begin);
  EXPECT_EQ(tok.eos_id(), end);
  std::vector<int32_t> want{begin};
  want.insert(want.end(), body.begin(), body.end());
  want.push_back(end);
  EXPECT_EQ(tok.encode("Hello there"), want);
  EXPECT_EQ(tok.encode("Hello there", false), body);
  EXPECT_EQ(tok.decode(want), "Hello there");  // special tokens dropped
  EXPECT_EQ(tok.piece_id("<|end|>"), end);
  // add_bos_token false removes the template's BOS; no eos_token: nothing at the end.
  const auto no_bos = lt::Tokenizer::from_hf_json(json_text, "t.json", R"({"add_bos_token": false})");
  EXPECT_EQ(no_bos.bos_id(), -1);
  EXPECT_EQ(no_bos.eos_id(), -1);
  EXPECT_EQ(no_bos.encode("Hello there"), body);
  // add_bos_token true with a string bos_token on a file without a template.
  json plain = json::parse(json_text);
  plain["post_processor"] = nullptr;
  const auto with_bos = lt::Tokenizer::from_hf_json(
      plain.dump(), "t.json", R"({"add_bos_token": true, "bos_token": "<|end|>", "eos_token": "<|end|>"})");
  EXPECT_EQ(with_bos.encode("Hello there").front(), end);
  expect_error([&] { lt::Tokenizer::from_hf_json(json_text, "d/t.json", R"({"eos_token": "<nope>"})"); },
               {"tokenizer_config.json", "eos_token", "<nope>"});

  // A folder: tokenizer.json with tokenizer_config.json is preferred to tokenizer.model.
  longtron::testing::write_file(dir.path() / "tokenizer.json", json_text);
  longtron::testing::write_file(dir.path() / "tokenizer.model", "not read");
  EXPECT_EQ(lt::find_tokenizer_file(dir.path()), dir.path() / "tokenizer.model");
  longtron::testing::write_file(dir.path() / "tokenizer_config.json", R"({"eos_token": "<|end|>"})");
  EXPECT_EQ(lt::find_tokenizer_file(dir.path()), dir.path() / "tokenizer.json");
  const auto loaded = lt::Tokenizer::load(dir.path());
  EXPECT_EQ(loaded.eos_id(), end);
  EXPECT_EQ(lt::Tokenizer::load(dir.path() / "tokenizer_config.json").eos_id(), end);
  const auto files = loaded.files();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].first, "tokenizer.json");
  EXPECT_EQ(files[1].first, "tokenizer_config.json");
  EXPECT_EQ(lt::tokenizer_file_set(dir.path() / "tokenizer.json").size(), 2u);
}

TEST(HfTokenizer, ParallelEncodingEqualsSerial) {
  const auto tok = lt::Tokenizer::from_hf_json(fixture("gpt2"), "gpt2.json");
  const json texts = read_json(kDir / "texts.json");
  std::vector<std::string> docs;
  for (int round = 0; round < 4; ++round)
    for (const auto& t : texts) docs.push_back(t.get<std::string>());
  const auto all = tok.encode_all(docs, false, 2);
  ASSERT_EQ(all.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(all[i], tok.encode(docs[i], false));
}
