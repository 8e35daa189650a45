// Normalizers of the tokenizer.json reader (see hf_components.h).
#include "text/hf_components.h"

namespace longtron::text::hf {

struct NfcNormalizer : Normalizer {
  void apply(std::string& text) const override { text = unicode::nfc(text); }
};

struct PrependNormalizer : Normalizer {
  std::string prepend;
  void apply(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend);
  }
};

struct ReplaceNormalizer : Normalizer {
  Regex regex;
  std::string content;
  ReplaceNormalizer(Regex r, std::string c) : regex(std::move(r)), content(std::move(c)) {}
  void apply(std::string& text) const override { replace_all(text, regex, content); }
};

struct SequenceNormalizer : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> steps;
  void apply(std::string& text) const override {
    const size_t before = text.size();
    for (const auto& s : steps) {
      s->apply(text);
      check_growth(before, text.size(), "normalizer Sequence");
    }
  }
};

std::unique_ptr<Normalizer> parse_normalizer(const Reader& r, const json& j) {
  const std::string type = r.type(j, "normalizer");
  const std::string where = "normalizer " + type;
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prepend = r.string(j, "prepend", where);
    return n;
  }
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(r.pattern(j, where), r.string(j, "content", where));
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    const json& list = r.field(j, "normalizers", where);
    if (!list.is_array()) r.bad(where, "\"normalizers\" is not a list");
    for (const auto& item : list) n->steps.push_back(parse_normalizer(r, item));
    return n;
  }
  r.bad("normalizer", fmt::format("\"{}\" is not supported (longtron reads NFC, Prepend, Replace "
                                  "and Sequence)", type));
}

}  // namespace longtron::text::hf
