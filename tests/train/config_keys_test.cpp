// The key table (train/config_keys.h) against the parser: every listed key parses, every parsed key
// is listed, the listed defaults are the parser's, and docs/configuration.md is the generated page.
#include "train/config_keys.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "train/config.h"

using longtron::Error;
using longtron::train::config_keys;
using longtron::train::ConfigNeeds;
using longtron::train::parse_config;

namespace {

const ConfigNeeds kNothingRequired{false, false, false};

nlohmann::json parsed(const std::string& text, const std::vector<std::string>& sets = {}) {
  return to_json(parse_config(text, "test.toml", sets, kNothingRequired));
}

/// A valid sample of each type, for keys without a written default.
std::string sample(const std::string& type) {
  if (type == "integer") return "1";
  if (type == "float") return "1e-4";
  if (type == "boolean") return "false";
  if (type == "path") return "\"x\"";
  if (type == "number or fraction") return "\"8/3\"";
  if (type == "array of 2 numbers") return "[1.0, 0.5]";
  return "\"none\"";
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::set<std::string>& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) flatten(v, key, out);
    else out.insert(key);
  }
}

TEST(ConfigKeys, EveryListedKeyParsesWithItsDefaultOrASample) {
  for (const auto& k : config_keys()) {
    const std::string value = k.value.empty() ? sample(k.type) : k.value;
    EXPECT_NO_THROW(parsed("", {k.key + "=" + value})) << k.key << " = " << value;
  }
}

TEST(ConfigKeys, EveryParsedKeyIsListedOnce) {
  std::set<std::string> listed;
  for (const auto& k : config_keys()) EXPECT_TRUE(listed.insert(k.key).second) << "twice: " << k.key;
  std::set<std::string> in_json;  // to_json shows every key the parser binds (tensor_2d once given)
  flatten(parsed("", {"parallel.tensor_2d.x=1"}), "", in_json);
  EXPECT_EQ(in_json, listed) << "src/train/config_keys.cpp and to_json/parse_config disagree";
}

TEST(ConfigKeys, DefaultTomlParsesToTheParserDefaults) {
  const std::string toml = longtron::train::default_config_toml();
  EXPECT_EQ(parsed(toml), parsed("")) << toml;
  for (const auto& k : config_keys()) EXPECT_NE(toml.find(k.key.substr(k.key.rfind('.') + 1)), std::string::npos);
}

TEST(ConfigKeys, UnknownKeyIsStillAnErrorNamingIt) {
  try {
    parsed("[data]\nseq_lenn = 4\n");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.seq_lenn: unknown key"), std::string::npos) << e.what();
  }
}

TEST(ConfigKeys, CommittedDocsPageIsTheGeneratedOne) {
  const std::string path = std::string(LONGTRON_SOURCE_DIR) + "/docs/configuration.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << " is missing: run `build/longtron config --markdown > "
                         << "docs/configuration.md` (or `cmake --build build --target config_docs`)";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(text.str() == longtron::train::config_markdown())
      << "docs/configuration.md is out of date with src/train/config_keys.cpp: regenerate it with "
         "`build/longtron config --markdown > docs/configuration.md` (or `cmake --build build "
         "--target config_docs`)";
}

}  // namespace
