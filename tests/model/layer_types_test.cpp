// The sliding layers from config.json's layer_types, or from Gemma 3's older
// sliding_window_pattern (Transformers' Gemma3TextConfig: "sliding_attention" if (i + 1) %
// pattern else "full_attention").
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/layer_types.h"

namespace longtron::model {
namespace {

TEST(LayerTypes, ReadsEachLayersType) {
  const std::vector<std::string> types = {"sliding_attention", "full_attention",
                                          "sliding_attention"};
  EXPECT_EQ(window_layers_from_types(types, 3, "config.json"),
            (std::vector<bool>{true, false, true}));
}

TEST(LayerTypes, RefusesAWrongCountOrAnUnknownType) {
  EXPECT_THROW(window_layers_from_types({"full_attention"}, 2, "config.json"), Error);
  try {
    window_layers_from_types({"full_attention", "chunked_attention"}, 2, "config.json");
    FAIL() << "accepted chunked_attention";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types[1] is \"chunked_attention\""),
              std::string::npos)
        << e.what();
  }
}

// Gemma 3 1B: 26 layers, pattern 6: layers 5, 11, 17 and 23 full, the other 22 sliding.
TEST(LayerTypes, PatternMakesEveryNthLayerFull) {
  const std::vector<bool> w = window_layers_from_pattern(6, 26, "config.json");
  ASSERT_EQ(w.size(), 26u);
  for (int64_t i = 0; i < 26; ++i) EXPECT_EQ(w[size_t(i)], (i + 1) % 6 != 0) << i;
  EXPECT_EQ(std::count(w.begin(), w.end(), false), 4);
  EXPECT_EQ(window_layers_from_pattern(1, 3, "c"), (std::vector<bool>{false, false, false}));
  EXPECT_THROW(window_layers_from_pattern(0, 3, "c"), Error);
}

}  // namespace
}  // namespace longtron::model
