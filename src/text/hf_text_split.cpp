// Split behaviours of the tokenizer.json reader (see hf_components.h).
#include "text/hf_components.h"

#include <algorithm>

namespace longtron::text::hf {

struct Span {
  size_t begin, end;
  bool flag;  // a match; after the behaviour: to be removed
};

// Matches of `regex` as spans covering all of `text` (Pattern::find_matches, then Invert).
std::vector<Span> cover(const Regex& regex, std::string_view text, bool invert) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, invert}};
  size_t prev = 0;
  for (const auto& [b, e] : regex.find_all(text)) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

std::vector<Span> apply_behavior(const std::vector<Span>& matches, Behavior behavior) {
  std::vector<Span> out;
  bool previous = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& m : matches) out.push_back({m.begin, m.end, false});
      return out;
    case Behavior::kRemoved:
      return matches;
    case Behavior::kContiguous:
      for (const auto& m : matches) {
        if (m.flag == previous && !out.empty()) out.back().end = m.end;
        else out.push_back({m.begin, m.end, false});
        previous = m.flag;
      }
      return out;
    case Behavior::kMergedWithPrevious:
      for (const auto& m : matches) {
        if (m.flag && !previous && !out.empty()) out.back().end = m.end;
        else out.push_back({m.begin, m.end, false});
        previous = m.flag;
      }
      return out;
    case Behavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous && !out.empty()) out.back().begin = it->begin;
        else out.push_back({it->begin, it->end, false});
        previous = it->flag;
      }
      std::reverse(out.begin(), out.end());
      return out;
  }
  return out;
}

// Splits every piece by `regex` with `behavior`, dropping empty pieces (PreTokenizedString::split).
void split_pieces(std::vector<Piece>& pieces, const Regex& regex, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) {
    for (const auto& s : apply_behavior(cover(regex, piece.text, invert), behavior)) {
      if (s.flag || s.end == s.begin) continue;
      out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.origin && s.begin == 0});
    }
  }
  pieces = std::move(out);
}

Behavior parse_behavior(const Reader& r, const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  r.bad(where, fmt::format("unknown split behavior \"{}\"", s));
}

// A normalizer may not make a text more than this many times longer (plus 4 KiB): a Sequence of
// 40 Replace "e" -> "ee" would grow it 2^40-fold until memory ran out.
constexpr size_t kMaxNormalizedGrowth = 16;

void check_growth(size_t before, size_t after, const std::string& where) {
  check(after <= kMaxNormalizedGrowth * before + 4096,
        "{}: makes a {}-byte text {} bytes long (more than {} times longer)", where, before,
        after, kMaxNormalizedGrowth);
}

void replace_all(std::string& text, const Regex& regex, const std::string& content) {
  const auto matches = regex.find_all(text);
  if (matches.empty()) return;
  size_t removed = 0;
  for (const auto& [b, e] : matches) removed += e - b;
  check_growth(text.size(), text.size() - removed + matches.size() * content.size(), "Replace");
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  text = std::move(out);
}

}  // namespace longtron::text::hf
