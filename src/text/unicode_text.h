// Unicode properties, NFC (ICU) and Unicode regular expressions (PCRE2 with UTF and UCP) for the
// Hugging Face tokenizer (text/hf_tokenizer.h); the UTF-8 primitives are core/utf8.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"

namespace longtron::unicode {

/// Rust's char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t c);
/// Rust's char::is_alphanumeric (Alphabetic, or general category Nd, Nl, No).
bool is_alphanumeric(char32_t c);
/// `text` in Normalization Form C (ICU); ASCII text is returned as is.
std::string nfc(std::string_view text);

/// A compiled PCRE2 pattern with UTF, UCP and multi-line anchors, the meaning Oniguruma (which
/// Hugging Face's tokenizers use) gives Ruby-syntax patterns; `\s` also matches U+0085 as
/// Oniguruma's does. JIT-compiled where the platform allows. Matching is thread-safe.
class Regex {
 public:
  /// Throws Error "<where>: regex <pattern> does not compile: <reason> at offset N".
  Regex(const std::string& pattern, const std::string& where);
  /// A pattern that matches `literal` exactly.
  static Regex literal(const std::string& literal, const std::string& where);
  /// Non-overlapping matches [begin, end) left to right, as Oniguruma's find_iter steps over
  /// empty matches (an empty match right after the previous match is skipped by one character).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string where_;
};

}  // namespace longtron::unicode
