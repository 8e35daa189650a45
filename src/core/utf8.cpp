#include "core/utf8.h"

#include <cstdint>

namespace longtron::unicode {

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

}  // namespace longtron::unicode
