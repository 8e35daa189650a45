#include "data/unicode_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <cctype>

#include "core/error.h"
#include "core/shorten.h"

namespace longtron::data::unicode {

namespace {

// Length of the well-formed prefix of the sequence at s[i] (Unicode Table 3-7), and whether it is
// complete: `ok` true with the full length, or false with the length of the maximal subpart.
size_t sequence_at(std::string_view s, size_t i, bool* ok) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *ok = true;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
  else if (b0 == 0xE0) need = 2, lo = 0xA0;
  else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) need = 2;
  else if (b0 == 0xED) need = 2, hi = 0x9F;
  else if (b0 == 0xF0) need = 3, lo = 0x90;
  else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
  else if (b0 == 0xF4) need = 3, hi = 0x8F;
  else {
    *ok = false;
    return 1;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *ok = false;
      return k;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *ok = false;
      return k;
    }
  }
  return need + 1;
}

}  // namespace

size_t invalid_utf8_at(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    bool ok;
    const size_t n = sequence_at(text, i, &ok);
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool ok;
    const size_t n = sequence_at(bytes, i, &ok);
    if (ok) out.append(bytes.substr(i, n));
    else out += "\xEF\xBF\xBD";
    i += n;
  }
  return out;
}

char32_t decode_at(std::string_view s, size_t at, size_t* length) {
  const auto b0 = static_cast<unsigned char>(s[at]);
  auto cont = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[at + k]) & 0x3F); };
  if (b0 < 0x80) return *length = 1, b0;
  if (b0 < 0xE0) return *length = 2, ((b0 & 0x1F) << 6) | cont(1);
  if (b0 < 0xF0) return *length = 3, ((b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
  return *length = 4, ((b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool is_alphanumeric(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  if (u_isUAlphabetic(u)) return true;
  const int8_t type = u_charType(u);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  check(U_SUCCESS(status), "NFC: ICU has no NFC data ({})", u_errorName(status));
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (normalizer->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
  normalizer->normalizeUTF8(0, piece, sink, nullptr, status);
  check(U_SUCCESS(status), "NFC: ICU failed ({})", u_errorName(status));
  return out;
}

// ---- Regex ----

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Oniguruma's \s (Unicode) also matches U+0085, PCRE2's (UCP: Z and \t\n\v\f\r) does not.
std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (e == 'S' && !in_class) out += "[^\\s\\x{85}]";
      else out += {c, e};
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Scratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  Scratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~Scratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  const std::string translated = onig_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail("{}: regex {} does not compile: {} at offset {}", where, shorten(pattern, 200),
         reinterpret_cast<const char*>(message), offset);
  }
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if it fails
  code_ = std::move(code);
}

Regex Regex::literal(const std::string& literal, const std::string& where) {
  std::string escaped;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) escaped += '\\';
    escaped += c;
  }
  return Regex(escaped, where);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  Scratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK,
                               s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      fail("{}: regex matching failed: {}", where_, reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t b = ov[0], e = ov[1];
    if (b == e && have_last && last_match_end == e) {  // Oniguruma's FindMatches: step one char
      size_t len = 1;
      if (last_end < text.size()) decode_at(text, last_end, &len);
      last_end += len;
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    out.emplace_back(b, e);
  }
  return out;
}

}  // namespace longtron::data::unicode
