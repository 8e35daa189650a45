// The components of the Hugging Face tokenizer.json reader (text/hf_tokenizer.h), one file per
// kind as in Hugging Face's tokenizers crate (tokenizers/src): normalizers, pre-tokenizers,
// decoders, and the split behaviours they share. Internal to data/.
#pragma once
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/shorten.h"
#include "text/unicode_text.h"

namespace longtron::text::hf {

using nlohmann::json;
using unicode::Regex;

constexpr int64_t kMaxId = 2147483646;  // ids are int32 and id + 1 must fit too

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// A piece of text on its way through normalizer and pre-tokenizers. `origin`: it starts at byte 0
// of the original text (Metaspace's prepend_scheme "first" looks at that).
struct Piece {
  std::string text;
  bool origin = false;
};

// ---------------------------------------------------------------------------------------------
// JSON access with errors that name the file and the component.

struct Reader {
  std::string name;  // the file

  // `where` and `what` may quote tokens of the file, of any length: they are cut to a line.
  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail("{}: {}: {}", name, shorten(where, 200), shorten(what, 400));
  }
  const json& field(const json& j, const char* key, const std::string& where) const {
    if (!j.is_object() || !j.contains(key)) bad(where, fmt::format("missing \"{}\"", key));
    return j[key];
  }
  std::string string(const json& j, const char* key, const std::string& where) const {
    const json& v = field(j, key, where);
    if (!v.is_string()) bad(where, fmt::format("\"{}\" is not a string", key));
    return v.get<std::string>();
  }
  bool boolean(const json& j, const char* key, bool fallback, const std::string& where) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) bad(where, fmt::format("\"{}\" is not true or false", key));
    return j[key].get<bool>();
  }
  int64_t integer(const json& v, const std::string& where) const {
    if (!v.is_number_integer()) bad(where, fmt::format("{} is not an integer id", v.dump()));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > kMaxId)
      bad(where, fmt::format("id {} is out of range [0, {}]", v.dump(), kMaxId));
    return id;
  }
  std::string type(const json& j, const std::string& where) const {
    return string(j, "type", where);
  }
  // {"Regex": "..."} or {"String": "..."} as a compiled pattern.
  Regex pattern(const json& j, const std::string& where) const {
    const json& p = field(j, "pattern", where);
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
      return Regex(p["Regex"].get<std::string>(), fmt::format("{}: {}", name, where));
    if (p.is_object() && p.contains("String") && p["String"].is_string())
      return Regex::literal(p["String"].get<std::string>(), fmt::format("{}: {}", name, where));
    bad(where, "\"pattern\" is not {\"Regex\": ...} or {\"String\": ...}");
  }
};

// ---------------------------------------------------------------------------------------------
// Split behaviours (tokenizers/src/tokenizer/normalizer.rs, NormalizedString::split):
// hf_text_split.cpp.

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// Splits every piece by `regex` with `behavior`, dropping empty pieces (PreTokenizedString::split).
void split_pieces(std::vector<Piece>& pieces, const Regex& regex, Behavior behavior, bool invert);
/// A "behavior" value of the file; anything else is an Error naming `where`.
Behavior parse_behavior(const Reader& r, const std::string& s, const std::string& where);
/// Error naming `where` when a normalizer made a `before`-byte text `after` bytes long, more than
/// 16 times longer (plus 4 KiB).
void check_growth(size_t before, size_t after, const std::string& where);
/// Every match of `regex` in `text` replaced by `content` (checked by check_growth).
void replace_all(std::string& text, const Regex& regex, const std::string& content);

// ---------------------------------------------------------------------------------------------
// Normalizers (tokenizers/src/normalizers): hf_normalizers.cpp.

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& text) const = 0;
};

/// The normalizer of `j` (NFC, Prepend, Replace, Sequence); another type is an Error.
std::unique_ptr<Normalizer> parse_normalizer(const Reader& r, const json& j);

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers (tokenizers/src/pre_tokenizers): hf_pre_tokenizers.cpp.

// GPT-2's byte-to-unicode table (tokenizers/src/pre_tokenizers/byte_level.rs, bytes_char).
struct ByteTable {
  std::array<std::string, 256> to_char;
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      unicode::append_utf8(to_char[b], c);
      to_byte[c] = static_cast<uint8_t>(b);
    }
  }
};
/// The one GPT-2 byte table.
const ByteTable& byte_table();

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

/// The pre-tokenizer of `j` (Split, ByteLevel, Metaspace, Digits, Sequence); another type is an
/// Error.
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Reader& r, const json& j);

// Metaspace's prepend_scheme (read by its pre-tokenizer and its decoder).
enum class Prepend { kAlways, kNever, kFirst };
Prepend parse_prepend_scheme(const Reader& r, const json& j, const std::string& where);
/// Metaspace's "replacement": exactly one character, else an Error.
std::string parse_replacement(const Reader& r, const json& j, const std::string& where);

// ---------------------------------------------------------------------------------------------
// Decoders (tokenizers/src/decoders): a list of token strings in, a list out, joined at the end;
// hf_decoders.cpp.

using Tokens = std::vector<std::string>;

struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(Tokens& tokens) const = 0;
};

/// The decoder of `j` (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence);
/// another type is an Error.
std::unique_ptr<Decoder> parse_decoder(const Reader& r, const json& j);

}  // namespace longtron::text::hf
