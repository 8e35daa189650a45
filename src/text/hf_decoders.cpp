// Decoders of the tokenizer.json reader (see hf_components.h).
#include "text/hf_components.h"

#include <algorithm>

namespace longtron::text::hf {

struct ByteLevelDecoder : Decoder {
  void apply(Tokens& tokens) const override {
    const auto& to_byte = byte_table().to_byte;
    std::string bytes;
    for (const auto& t : tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        size_t n = 0;
        const auto it = to_byte.find(unicode::decode_at(t, i, &n));
        if (it == to_byte.end()) all = false;
        else mapped += static_cast<char>(it->second);
        i += n;
      }
      bytes += all ? mapped : t;
    }
    tokens = {unicode::utf8_lossy(bytes)};
  }
};

struct MetaspaceDecoder : Decoder {
  std::string replacement;
  Prepend prepend = Prepend::kAlways;
  void apply(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement.size(), replacement) == 0) {
          if (!(i == 0 && prepend != Prepend::kNever)) out += ' ';
          at += replacement.size();
        } else {
          size_t n = 0;
          unicode::decode_at(t, at, &n);
          out.append(t, at, n);
          at += n;
        }
      }
      tokens[i] = std::move(out);
    }
  }
};

int byte_token(const std::string& t) {  // "<0x0A>" -> 10, else -1
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
            : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                        : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

struct ByteFallbackDecoder : Decoder {
  void apply(Tokens& tokens) const override {
    Tokens out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (unicode::invalid_utf8_at(bytes) == std::string::npos) out.push_back(bytes);
      else
        for (size_t k = 0; k < bytes.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      bytes.clear();
    };
    for (auto& t : tokens) {
      const int b = byte_token(t);
      if (b >= 0) {
        bytes += static_cast<char>(b);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

struct FuseDecoder : Decoder {
  void apply(Tokens& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens = {all};
  }
};

struct StripDecoder : Decoder {
  char32_t content = ' ';
  size_t start = 0, stop = 0;
  void apply(Tokens& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
      std::vector<char32_t> cps;
      for (size_t at = 0; at < t.size();) {
        size_t n = 0;
        cps.push_back(unicode::decode_at(t, at, &n));
        chars.emplace_back(at, n);
        at += n;
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start, cps.size()); ++i) {
        if (cps[i] != content) break;
        start_cut = i + 1;
      }
      size_t stop_cut = cps.size();
      for (size_t i = 0; i < stop && i < cps.size(); ++i) {
        const size_t index = cps.size() - i - 1;
        if (cps[index] != content) break;
        stop_cut = index;
      }
      if (start_cut >= stop_cut) {
        t.clear();
        continue;
      }
      const size_t b = chars[start_cut].first;
      const size_t e = stop_cut == cps.size() ? t.size() : chars[stop_cut].first;
      t = t.substr(b, e - b);
    }
  }
};

struct ReplaceDecoder : Decoder {
  Regex regex;
  std::string content;
  ReplaceDecoder(Regex r, std::string c) : regex(std::move(r)), content(std::move(c)) {}
  void apply(Tokens& tokens) const override {
    for (auto& t : tokens) replace_all(t, regex, content);
  }
};

struct SequenceDecoder : Decoder {
  std::vector<std::unique_ptr<Decoder>> steps;
  void apply(Tokens& tokens) const override {
    for (const auto& s : steps) s->apply(tokens);
  }
};

std::unique_ptr<Decoder> parse_decoder(const Reader& r, const json& j) {
  const std::string type = r.type(j, "decoder");
  const std::string where = "decoder " + type;
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = parse_replacement(r, j, where);
    d->prepend = parse_prepend_scheme(r, j, where);
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    const std::string c = r.string(j, "content", where);
    size_t n = 0;
    if (c.empty() || (d->content = unicode::decode_at(c, 0, &n), n != c.size()))
      r.bad(where, "\"content\" is not one character");
    const json& start = r.field(j, "start", where);
    const json& stop = r.field(j, "stop", where);
    if (!start.is_number_unsigned() || !stop.is_number_unsigned())
      r.bad(where, "\"start\" and \"stop\" must be counts");
    d->start = start.get<size_t>();
    d->stop = stop.get<size_t>();
    return d;
  }
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(r.pattern(j, where), r.string(j, "content", where));
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDecoder>();
    const json& list = r.field(j, "decoders", where);
    if (!list.is_array()) r.bad(where, "\"decoders\" is not a list");
    for (const auto& item : list) d->steps.push_back(parse_decoder(r, item));
    return d;
  }
  r.bad("decoder", fmt::format("\"{}\" is not supported (longtron reads ByteLevel, Metaspace, "
                               "ByteFallback, Fuse, Strip, Replace and Sequence)", type));
}

}  // namespace longtron::text::hf
