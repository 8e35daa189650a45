// Finding which of many literal tokens (a tokenizer's added tokens: thousands for Gemma) starts at
// a position of a text, in time independent of their number: a first-byte filter, then one hash
// lookup per distinct token length, longest first.
#pragma once
#include <algorithm>
#include <bitset>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace longtron::text {

/// A set of non-empty tokens with a value each (e.g. a vocabulary id).
template <typename V>
class TokenMatcher {
 public:
  void add(const std::string& token, V value) {
    if (token.empty() || tokens_.count(token)) return;
    tokens_.emplace(token, value);
    first_.set(static_cast<unsigned char>(token[0]));
    if (std::find(lengths_.begin(), lengths_.end(), token.size()) == lengths_.end()) {
      lengths_.push_back(token.size());
      std::sort(lengths_.rbegin(), lengths_.rend());
    }
  }
  /// The longest token starting at text[at] (its text and value), or nullptr.
  const std::pair<const std::string, V>* match(std::string_view text, size_t at) const {
    if (at >= text.size() || !first_.test(static_cast<unsigned char>(text[at]))) return nullptr;
    for (const size_t n : lengths_) {
      if (n > text.size() - at) continue;
      const auto it = tokens_.find(std::string(text.substr(at, n)));
      if (it != tokens_.end()) return &*it;
    }
    return nullptr;
  }
  /// Whether a token ends exactly at text[at - 1].
  bool ends_at(std::string_view text, size_t at) const {
    for (const size_t n : lengths_)
      if (n <= at && tokens_.count(std::string(text.substr(at - n, n)))) return true;
    return false;
  }
  bool empty() const { return tokens_.empty(); }

 private:
  std::unordered_map<std::string, V> tokens_;
  std::bitset<256> first_;
  std::vector<size_t> lengths_;  // longest first
};

}  // namespace longtron::text
