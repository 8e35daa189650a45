// UTF-8 well-formedness, decoding and encoding (Unicode 15, section 3.9), without any library.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace longtron::unicode {

/// Offset of the first byte that does not start a well-formed UTF-8 sequence, npos if none.
size_t invalid_utf8_at(std::string_view text);
/// `bytes` as UTF-8 with every maximal ill-formed subpart replaced by U+FFFD (the rule of
/// Unicode 15 §3.9 that Rust's String::from_utf8_lossy follows).
std::string utf8_lossy(std::string_view bytes);
/// The code point starting at text[at] (valid UTF-8 assumed); `length` gets its byte count.
char32_t decode_at(std::string_view text, size_t at, size_t* length);
/// UTF-8 of one code point.
void append_utf8(std::string& out, char32_t c);

}  // namespace longtron::unicode
