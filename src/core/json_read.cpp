#include "core/json_read.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/io_error.h"
#include "core/shorten.h"

namespace longtron {

namespace {

// One pass over the bytes, strings respected: the first NUL byte, or the first '[' / '{' that
// opens level max_depth + 1. Whatever else is wrong is left to the parser, which then never
// meets a value deeper than max_depth.
bool prescan(std::string_view text, int max_depth, JsonProblem* problem) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') {
      if (problem) *problem = {"a NUL byte, which JSON does not allow (anything after it would be lost)", i};
      return false;
    }
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        if (problem)
          *problem = {fmt::format("arrays and objects nested deeper than {} levels", max_depth), i};
        return false;
      }
    } else if (c == ']' || c == '}') {
      --depth;  // a stray closer is the parser's to report
    }
  }
  return true;
}

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1,
// column 5: " prefix (the byte offset is reported separately), cut to one short line (its
// "last read" part may quote a long token).
std::string parse_error_text(const char* what) {
  std::string_view text(what);
  if (text.starts_with("[json.exception.")) text.remove_prefix(std::min(text.size(), text.find("] ") + 2));
  const size_t column = text.find("column ");
  if (column != std::string_view::npos) {
    const size_t colon = text.find(": ", column);
    if (colon != std::string_view::npos) text.remove_prefix(colon + 2);
  }
  return shorten(text, 200);
}

}  // namespace

std::optional<nlohmann::json> try_parse_json(std::string_view text, JsonProblem* problem,
                                             int max_depth) {
  if (!prescan(text, max_depth, problem)) return std::nullopt;
  try {
    return nlohmann::json::parse(text.data(), text.data() + text.size());
  } catch (const nlohmann::json::parse_error& e) {
    if (problem) *problem = {parse_error_text(e.what()), e.byte > 0 ? e.byte - 1 : 0};
  } catch (const nlohmann::json::exception& e) {
    if (problem) *problem = {parse_error_text(e.what()), 0};
  }
  return std::nullopt;
}

nlohmann::json parse_json(std::string_view text, const std::string& where, int max_depth) {
  JsonProblem problem;
  auto value = try_parse_json(text, &problem, max_depth);
  if (!value) fail("{}, byte {}: not valid JSON: {}", where, problem.byte, problem.what);
  return std::move(*value);
}

nlohmann::json read_json_file(const std::filesystem::path& file, int max_depth) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  check(!in.bad(), "{}: read error ({})", file.string(), io_error_text());
  return parse_json(bytes.str(), file.string(), max_depth);
}

std::string json_excerpt(const nlohmann::json& value, size_t max) { return shorten(value.dump(), max); }

}  // namespace longtron
