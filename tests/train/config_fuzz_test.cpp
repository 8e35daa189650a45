// Fuzz test of the TOML config loader: the shipped configs get seeded random mutations
// (fuzz_util.h: truncations, bit flips, edge-case numbers, 100,000-deep brackets, ...). Each case
// must end in a clean longtron error naming the file, or in a config; and when the mutation did
// not change the TOML document itself (toml++ parses it to the same table: a comment, spacing),
// the config must be the original one. Never a crash, a hang, or another exception type.
#include <gtest/gtest.h>

#include <toml++/toml.h>

#include "core/error.h"
#include "fuzz_util.h"
#include "test_util.h"
#include "train/config.h"

namespace fs = std::filesystem;
using longtron::Error;
using longtron::testing::expect_clean_error;
using longtron::testing::FuzzTally;
using longtron::testing::Mutation;
using longtron::testing::Mutator;
using longtron::testing::read_file;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

// The TOML document of `text`, or nullopt when it is not valid TOML.
std::optional<toml::table> parse_toml(const std::string& text) {
  try {
    return toml::parse(text);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

}  // namespace

TEST(ConfigFuzz, MutatedConfigsAreRefusedOrReadAsWritten) {
  TempDir dir(longtron::testing::fuzz_temp_base());
  Mutator rng(99);
  FuzzTally tally{"toml config"};
  const auto path = dir / "c.toml";
  struct Base {
    std::string text;
    toml::table table;
    nlohmann::json config;
  };
  std::vector<Base> bases;
  for (const char* name : {"tiny.toml", "small.toml", "long.toml", "demo.toml"}) {
    const std::string text = read_file(fs::path(LONGTRON_SOURCE_DIR) / "configs" / name);
    write_file(path, text);
    bases.push_back({text, *parse_toml(text), longtron::train::to_json(longtron::train::load_config(path))});
  }
  int unchanged = 0;
  for (int c = 0; c < 2400; ++c) {
    const Base& base = bases[rng.below(bases.size())];
    const Mutation m = rng.mutate(base.text);
    write_file(path, m.bytes);
    const auto table = parse_toml(m.bytes);
    const bool same_document = table && *table == base.table;
    unchanged += same_document;
    try {
      const auto config = longtron::train::to_json(longtron::train::load_config(path));
      if (same_document) {
        EXPECT_EQ(config, base.config) << m.kind << " at " << m.offset;
      }
      ++tally.reads;
    } catch (const Error& e) {
      EXPECT_FALSE(same_document) << m.kind << " at " << m.offset << ": " << e.what();
      expect_clean_error(e, path.string(), m);
      ++tally.errors;
    }
  }
  std::printf("[fuzz] toml config: %d cases left the TOML document unchanged\n", unchanged);
  EXPECT_GE(tally.cases(), 2000);
}
