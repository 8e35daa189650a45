// `longtron prepare` and `longtron check-data` end to end: outputs, the seeded valid split, and
// every bad input giving one clear error, a non-zero exit and nothing left behind.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

#include "cli_fixture.h"
#include "data/internevo.h"
#include "data/megatron.h"
#include "data/npy.h"
#include "data/open.h"
#include "packing/shuffle.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using longtron::testing::contains;
namespace ld = longtron::data;
namespace lt = longtron::text;
using longtron::testing::english_document;
using longtron::testing::jsonl_of;
using longtron::testing::read_file;
using longtron::testing::run_longtron;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

// 12 documents of generated English-like text, as .jsonl.
std::vector<std::string> write_corpus(const fs::path& file) {
  std::mt19937 gen(3);
  std::vector<std::string> docs;
  for (int d = 0; d < 12; ++d) {
    docs.push_back(english_document(gen, 30 + d * 5));
    docs.back().pop_back();  // no trailing space
  }
  write_file(file, jsonl_of(docs));
  return docs;
}

std::vector<int32_t> read_doc(const ld::DocumentSource& source, size_t i) {
  std::vector<int32_t> out(source.document_length(i));
  source.read_tokens(i, 0, out.size(), out.data());
  return out;
}

// Nothing named like `name` (the output or its temporary) is left in `folder`.
bool nothing_left(const fs::path& folder, const std::string& name) {
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().filename().string().rfind(name, 0) == 0) return false;
  return true;
}

}  // namespace

TEST(PrepareCli, TrainsTokenizerSplitsAndRoundTrips) {
  TempDir dir;
  const auto docs = write_corpus(dir / "corpus.jsonl");
  const auto r = run_longtron("prepare --input " + (dir / "corpus.jsonl").string() + " --output " +
                              (dir / "out").string() +
                              " --train-tokenizer --vocab-size 400 --valid-fraction 0.25 --seed 7 "
                              "--format internevo --threads 2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "12 documents (9 train, 3 valid)")) << r.output;
  EXPECT_TRUE(contains(r.output, "tokens/s")) << r.output;
  const auto info = nlohmann::json::parse(read_file(dir / "out" / "dataset.json"));
  EXPECT_EQ(info["documents"], 12);
  EXPECT_EQ(info["vocab_size"], 400);
  EXPECT_EQ(info["bos_id"], 1);
  EXPECT_EQ(info["eos_id"], 2);
  EXPECT_EQ(info["train"]["documents"], 9);
  EXPECT_EQ(info["valid"]["documents"], 3);
  EXPECT_EQ(info["tokens"].get<int64_t>(),
            info["train"]["tokens"].get<int64_t>() + info["valid"]["tokens"].get<int64_t>());

  // valid/ holds the first 3 of numpy_permutation(12, 7), in corpus order; train/ the rest.
  auto held = ld::numpy_permutation(12, 7);
  held.resize(3);
  std::sort(held.begin(), held.end());
  const auto tokenizer = lt::Tokenizer::load(dir / "out" / "tokenizer.model");
  const auto valid = ld::open_dataset(dir / "out" / "valid");
  const auto train = ld::open_dataset(dir / "out" / "train");
  ASSERT_EQ(valid.at(0)->num_documents(), 3u);
  ASSERT_EQ(train.at(0)->num_documents(), 9u);
  for (size_t i = 0; i < 3; ++i) {
    const auto ids = read_doc(*valid[0], i);
    EXPECT_EQ(ids.front(), 1);
    EXPECT_EQ(ids.back(), 2);
    EXPECT_EQ(tokenizer.decode(ids), docs[held[i]]);
  }
  for (size_t i = 0, t = 0; i < 12; ++i) {
    if (std::binary_search(held.begin(), held.end(), static_cast<int64_t>(i))) continue;
    EXPECT_EQ(tokenizer.decode(read_doc(*train[0], t++)), docs[i]);
  }

  // The same tokenizer, Megatron format, no BOS/EOS, no split: same ids without the ends.
  const auto m = run_longtron("prepare --input " + (dir / "corpus.jsonl").string() + " --output " +
                              (dir / "meg").string() + "/ --tokenizer " +
                              (dir / "out" / "tokenizer.model").string() + " --no-bos-eos");
  ASSERT_EQ(m.status, 0) << m.output;
  const auto meg = ld::open_dataset(dir / "meg" / "train");
  EXPECT_EQ(meg.at(0)->path(), dir / "meg" / "train" / "tokens.bin");
  ASSERT_EQ(meg[0]->num_documents(), 12u);
  EXPECT_EQ(read_doc(*meg[0], 0), tokenizer.encode(docs[0], false));
  EXPECT_FALSE(fs::exists(dir / "meg" / "valid"));
  EXPECT_TRUE(nothing_left(dir / "meg", ".tmp"));  // "--output meg/" worked like "meg"
  EXPECT_TRUE(nothing_left(dir.path(), "meg.tmp"));
  const auto check = run_longtron("check-data " + (dir / "meg" / "train").string());
  EXPECT_EQ(check.status, 0) << check.output;
  EXPECT_TRUE(contains(check.output, "12 documents")) << check.output;
}

// The progress lines count bytes of text and say so (the rate is tokens); counts of one are
// singular ("1 thread", "1 input").
TEST(PrepareCli, ProgressUnitsAndPlurals) {
  TempDir dir;
  write_corpus(dir / "corpus.jsonl");
  const auto r = run_longtron("prepare --input " + (dir / "corpus.jsonl").string() + " --output " +
                              (dir / "out").string() + " --train-tokenizer --vocab-size 400 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "12 documents from 1 input\n")) << r.output;
  // Off a terminal: the start line (the amount of text) and the end line (rates) only.
  EXPECT_TRUE(contains(r.output, "\ntokenize: ") && contains(r.output, "tokenize: done in ") &&
              contains(r.output, " MB/s) 12 documents, ") && contains(r.output, " tokens/s"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "(100%)")) << r.output;
  EXPECT_TRUE(contains(r.output, " on 1 thread;")) << r.output;
  EXPECT_FALSE(contains(r.output, "1 threads") || contains(r.output, "input(s)")) << r.output;
  const auto c = run_longtron("check-data " + (dir / "out" / "train").string());
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_TRUE(contains(c.output, ": 1 file, 12 documents, ")) << c.output;
}

// A write that fails names its cause: under a 2 KiB file-size limit (SIGXFSZ ignored, so the
// write returns EFBIG) prepare stops with "write failed (File too large)" and leaves nothing.
TEST(PrepareCli, WriteFailureNamesTheCause) {
  TempDir dir;
  write_corpus(dir / "corpus.jsonl");
  const auto r = longtron::testing::run_command(
      "trap '' XFSZ; ulimit -f 2; " + std::string(LONGTRON_BINARY) + " prepare --input " +
      (dir / "corpus.jsonl").string() + " --output " + (dir / "out").string() +
      " --train-tokenizer --vocab-size 400 --format internevo --threads 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "write failed (File too large)")) << r.output;
  EXPECT_TRUE(nothing_left(dir.path(), "out"));
}

// SentencePiece's trainer takes at most 128 threads: more (a big machine's default or --threads)
// train with 128 rather than failing; a negative count is refused.
TEST(PrepareCli, ThreadCounts) {
  TempDir dir;
  write_corpus(dir / "corpus.jsonl");
  const std::string base = "prepare --input " + (dir / "corpus.jsonl").string() +
                           " --train-tokenizer --vocab-size 400 --output ";
  auto r = run_longtron(base + (dir / "many").string() + " --threads 200");
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_longtron(base + (dir / "neg").string() + " --threads -3");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--threads must be in [1, 4096]")) << r.output;
  EXPECT_TRUE(nothing_left(dir.path(), "neg"));
}

TEST(PrepareCli, BadTextInputLeavesNothing) {
  TempDir dir;
  write_file(dir / "a.jsonl", "{\"text\": \"hello there\"}\n{\"body\": \"x\"}\n");
  auto r = run_longtron("prepare --input " + (dir / "a.jsonl").string() + " --output " +
                        (dir / "out").string() + " --train-tokenizer --vocab-size 300");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, (dir / "a.jsonl").string() + ", line 2: no string field \"text\""))
      << r.output;
  EXPECT_TRUE(nothing_left(dir.path(), "out"));

  r = run_longtron("prepare --input " + (dir / "missing.json").string() + " --output " +
                   (dir / "out").string() + " --train-tokenizer --vocab-size 300");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "missing.json: no such file")) << r.output;

  write_file(dir / "b.txt", "some text\n");
  write_file(dir / "bad.model", "garbage");
  r = run_longtron("prepare --input " + (dir / "b.txt").string() + " --output " +
                   (dir / "out").string() + " --tokenizer " + (dir / "bad.model").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "bad.model: not a SentencePiece model")) << r.output;
  EXPECT_TRUE(nothing_left(dir.path(), "out"));

  r = run_longtron("prepare --input " + (dir / "b.txt").string() + " --output " + (dir / "out").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--tokenizer MODEL or --train-tokenizer")) << r.output;

  // A document the tokenizer maps to nothing (control characters, normalised away) with
  // --no-bos-eos: named by its place in the inputs, not by the temporary output file.
  write_file(dir / "c.txt", "hello world\n\x01\x02\x03\n");
  r = run_longtron("prepare --input " + (dir / "c.txt").string() + " --output " +
                   (dir / "out").string() + " --train-tokenizer --vocab-size 270 --no-bos-eos");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "document 2 of the inputs")) << r.output;
  EXPECT_TRUE(contains(r.output, "encodes to no tokens")) << r.output;
  EXPECT_FALSE(contains(r.output, ".tmp")) << r.output;
  EXPECT_TRUE(nothing_left(dir.path(), "out"));

  // A folder that is not a prepared dataset is never replaced.
  fs::create_directories(dir / "keep");
  write_file(dir / "keep" / "mine.txt", "precious");
  r = run_longtron("prepare --input " + (dir / "b.txt").string() + " --output " +
                   (dir / "keep").string() + " --train-tokenizer --vocab-size 300");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(read_file(dir / "keep" / "mine.txt"), "precious");
}

TEST(CheckDataCli, EachBadTokenizedInputNamesFileAndOffset) {
  TempDir dir;
  const std::vector<std::vector<int32_t>> docs = {{1, 5, 9, 2}, {1, 7, 2}, {1, 3, 3, 3, 2}};
  auto run_check = [&](const fs::path& path, const std::string& extra = "") {
    return run_longtron("check-data " + path.string() + " " + extra);
  };
  auto megatron = [&](const fs::path& folder) {
    fs::create_directories(folder);
    ld::MegatronWriter writer(folder / "t", ld::MegatronDtype::kUint16);
    for (const auto& d : docs) writer.add_document(d.data(), d.size());
    writer.finish();
  };
  auto internevo = [&](const fs::path& folder, const std::vector<std::vector<int32_t>>& content) {
    fs::create_directories(folder);
    ld::InternEvoWriter writer(folder / "t.bin");
    for (const auto& d : content) writer.add_document(d.data(), d.size());
    writer.finish();
  };

  megatron(dir / "ok");
  EXPECT_EQ(run_check(dir / "ok", "--vocab-size 10").status, 0);
  for (const char* bad : {"0", "-5"}) {  // a mistake, not "no vocabulary check"
    auto r = run_check(dir / "ok", std::string("--vocab-size ") + bad);
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(contains(r.output, std::string("--vocab-size must be > 0, got ") + bad)) << r.output;
  }
  // Token id >= vocabulary.
  auto r = run_check(dir / "ok", "--vocab-size 9");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, (dir / "ok" / "t.bin").string() + ": document 0, token 2: id 9"))
      << r.output;

  // Truncated .idx.
  megatron(dir / "trunc");
  const std::string idx = read_file(dir / "trunc" / "t.idx");
  write_file(dir / "trunc" / "t.idx", idx.substr(0, idx.size() - 9));
  r = run_check(dir / "trunc");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, (dir / "trunc" / "t.idx").string() + ": truncated")) << r.output;
  EXPECT_TRUE(contains(r.output, "byte offset 34")) << r.output;

  // Wrong magic.
  megatron(dir / "magic");
  write_file(dir / "magic" / "t.idx", "NOTMAGIC!" + idx.substr(9));
  r = run_check(dir / "magic");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, (dir / "magic" / "t.idx").string() + ": byte offset 0: wrong magic"))
      << r.output;

  // .meta disagreeing with .bin.
  internevo(dir / "meta", docs);
  ld::write_npy_int_matrix(dir / "meta" / "t.bin.meta", {0, 4, 25, 3, 47, 6}, 3, 2);
  r = run_check(dir / "meta");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, (dir / "meta" / "t.bin").string() + ": line 3 (byte offset 47): 5 tokens"))
      << r.output;

  // A JSON line that is not {"tokens": [...]}.
  fs::create_directories(dir / "json");
  write_file(dir / "json" / "t.bin", "{\"tokens\": [1, 2]}\n[1, 2, 3]\n");
  r = run_check(dir / "json");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, (dir / "json" / "t.bin").string() + ": line 2 (byte offset 19)"))
      << r.output;

  // An empty document.
  internevo(dir / "empty", {{1, 2}, {}});
  r = run_check(dir / "empty");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, (dir / "empty" / "t.bin").string() + ": document 1 is empty"))
      << r.output;

  // Unreadable: a dataset path that is a folder named like a data file, and a missing path.
  fs::create_directories(dir / "weird" / "t.bin");
  r = run_check(dir / "weird" / "t.bin");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "no documents")) << r.output;
  r = run_check(dir / "nowhere");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "nowhere: no such file")) << r.output;
  EXPECT_FALSE(contains(r.output, "internal error"));
}
