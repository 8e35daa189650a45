// SentencePiece BPE training on a small generated corpus, then encode/decode.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "test_util.h"

namespace lt = longtron::text;

namespace {

// Sentences drawn from a small word list; one document is a single very long line so that
// training only works if the document is split (SentencePiece drops lines longer than its limit).
std::vector<std::string> corpus() {
  const char* words[] = {"the", "state", "of", "union", "congress", "people", "nation", "peace",
                         "war", "trade", "law", "citizens", "government", "treaty", "revenue"};
  std::mt19937 gen(1);
  std::vector<std::string> docs;
  for (int d = 0; d < 20; ++d) {
    std::string doc;
    const int sentences = d == 0 ? 600 : 20;
    for (int s = 0; s < sentences; ++s) {
      for (int w = 0; w < 8; ++w) doc += std::string(w ? " " : "") + words[gen() % 15];
      doc += ". ";
    }
    docs.push_back(doc);
  }
  return docs;
}

}  // namespace

TEST(Tokenizer, SplitForTrainingKeepsLinesShort) {
  const auto docs = corpus();
  ASSERT_GT(docs[0].size(), 20000u);
  const auto lines = lt::split_for_training(docs[0] + "\n\nSecond paragraph here.", 1000);
  ASSERT_GT(lines.size(), 20u);
  for (const auto& line : lines) {
    EXPECT_LT(line.size(), 1000u);
    EXPECT_FALSE(line.empty());
  }
  EXPECT_EQ(lines.back(), "Second paragraph here.");
  EXPECT_EQ(lines.front().back(), '.');  // cut at a sentence end
  const auto unbroken = lt::split_for_training(std::string(2500, 'a'), 1000);
  EXPECT_EQ(unbroken.size(), 3u);
}

TEST(Tokenizer, TrainEncodeDecodeRoundTrip) {
  const auto docs = corpus();
  lt::TokenizerTraining options;
  options.vocab_size = 400;
  options.threads = 2;
  const auto tokenizer = lt::train_bpe_tokenizer(docs, options);
  EXPECT_EQ(tokenizer.vocab_size(), 400);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  const std::string text = "the congress of the nation";
  const auto ids = tokenizer.encode(text);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_LT(ids.size(), 10u);  // whole words were learned (the long line was not dropped)
  EXPECT_EQ(tokenizer.decode(ids), text);
  EXPECT_EQ(tokenizer.encode(text, false).size(), ids.size() - 2);
  // Byte fallback: unseen characters still round-trip.
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("Ωmega €5")), "Ωmega €5");
  // Parallel encoding equals serial encoding, in document order.
  const auto all = tokenizer.encode_all(docs, true, 2);
  ASSERT_EQ(all.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(all[i], tokenizer.encode(docs[i]));
  // Saved bytes load back.
  longtron::testing::TempDir dir;
  longtron::testing::write_file(dir / "t.model", tokenizer.serialized());
  EXPECT_EQ(lt::Tokenizer::load(dir / "t.model").encode(text), ids);
}

TEST(Tokenizer, BadModelFile) {
  longtron::testing::TempDir dir;
  longtron::testing::write_file(dir / "bad.model", "not a model");
  EXPECT_THROW(lt::Tokenizer::load(dir / "bad.model"), longtron::Error);
  EXPECT_THROW(lt::Tokenizer::load(dir / "missing.model"), longtron::Error);
}
