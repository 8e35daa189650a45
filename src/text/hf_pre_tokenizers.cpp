// Pre-tokenizers of the tokenizer.json reader (see hf_components.h).
#include "text/hf_components.h"

#include <optional>

namespace longtron::text::hf {

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

struct SplitPreTokenizer : PreTokenizer {
  Regex regex;
  Behavior behavior;
  bool invert;
  SplitPreTokenizer(Regex r, Behavior b, bool i) : regex(std::move(r)), behavior(b), invert(i) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, regex, behavior, invert);
  }
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelPreTokenizer : PreTokenizer {
  bool add_prefix_space = true;
  std::optional<Regex> regex;  // GPT-2's split, when use_regex
  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space)
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text = ' ' + p.text;
    if (regex) split_pieces(pieces, *regex, Behavior::kIsolated, false);
    const auto& table = byte_table().to_char;
    for (auto& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (const char c : p.text) mapped += table[static_cast<unsigned char>(c)];
      p.text = std::move(mapped);
    }
  }
};

Prepend parse_prepend_scheme(const Reader& r, const json& j, const std::string& where) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = r.string(j, "prepend_scheme", where);
    if (s == "always") return Prepend::kAlways;
    if (s == "never") return Prepend::kNever;
    if (s == "first") return Prepend::kFirst;
    r.bad(where, fmt::format("unknown prepend_scheme \"{}\"", s));
  }
  return r.boolean(j, "add_prefix_space", true, where) ? Prepend::kAlways : Prepend::kNever;
}

std::string parse_replacement(const Reader& r, const json& j, const std::string& where) {
  const std::string s = r.string(j, "replacement", where);
  size_t length = 0;
  if (s.empty() || unicode::invalid_utf8_at(s) != std::string::npos ||
      (unicode::decode_at(s, 0, &length), length != s.size()))
    r.bad(where, "\"replacement\" is not one character");
  return s;
}

struct MetaspacePreTokenizer : PreTokenizer {
  std::string replacement;
  Prepend prepend = Prepend::kAlways;
  bool split = true;
  std::optional<Regex> space, rep;
  void apply(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      replace_all(p.text, *space, replacement);
      const bool starts = p.text.compare(0, replacement.size(), replacement) == 0;
      if (!starts && (prepend == Prepend::kAlways || (prepend == Prepend::kFirst && p.origin)))
        p.text.insert(0, replacement);
    }
    if (split) split_pieces(pieces, *rep, Behavior::kMergedWithNext, false);
  }
};

struct DigitsPreTokenizer : PreTokenizer {
  bool individual = false;
  Regex digit{"\\p{N}", "Digits"};
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, digit, individual ? Behavior::kIsolated : Behavior::kContiguous, false);
  }
};

struct SequencePreTokenizer : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps) s->apply(pieces);
  }
};

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Reader& r, const json& j) {
  const std::string type = r.type(j, "pre_tokenizer");
  const std::string where = "pre_tokenizer " + type;
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        r.pattern(j, where), parse_behavior(r, r.string(j, "behavior", where), where),
        r.boolean(j, "invert", false, where));
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = r.boolean(j, "add_prefix_space", true, where);
    if (r.boolean(j, "use_regex", true, where)) p->regex.emplace(kGpt2Pattern, r.name + ": " + where);
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = parse_replacement(r, j, where);
    p->prepend = parse_prepend_scheme(r, j, where);
    p->split = r.boolean(j, "split", true, where);
    p->space.emplace(Regex::literal(" ", where));
    p->rep.emplace(Regex::literal(p->replacement, where));
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = r.boolean(j, "individual_digits", false, where);
    return p;
  }
  if (type == "Sequence") {
    auto p = std::make_unique<SequencePreTokenizer>();
    const json& list = r.field(j, "pretokenizers", where);
    if (!list.is_array()) r.bad(where, "\"pretokenizers\" is not a list");
    for (const auto& item : list) p->steps.push_back(parse_pre_tokenizer(r, item));
    return p;
  }
  r.bad("pre_tokenizer", fmt::format("\"{}\" is not supported (longtron reads Split, ByteLevel, "
                                     "Metaspace, Digits and Sequence)", type));
}

}  // namespace longtron::text::hf
