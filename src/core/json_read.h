// Reading untrusted JSON (config.json, state.json, dataset.json, safetensors index files, every
// .jsonl line): one parse with the nesting depth bounded and every byte the grammar allows
// checked, so that no later recursive walk (a copy, dump() or destruction of the value) can run
// out of stack, and a NUL byte cannot end the text early.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace longtron {

/// The deepest nesting of arrays and objects that longtron reads. Hugging Face's config.json,
/// tokenizer files and every format longtron reads nest fewer than ten levels; a value nested
/// deeper is refused before it is built (a recursive copy or dump() of 200,000 levels would
/// overflow the stack).
inline constexpr int kJsonMaxDepth = 128;

/// Why a text is not one JSON value: `what` is one line (at most a few hundred bytes, control
/// bytes shown as '?') and `byte` the 0-based offset into the text where the problem was seen.
struct JsonProblem {
  std::string what;
  size_t byte = 0;
};

/// Parses `text` as exactly one JSON value (RFC 8259, surrounding whitespace allowed) whose arrays
/// and objects nest at most `max_depth` levels. A NUL byte anywhere is an error (nlohmann's lexer
/// would take it for the end of the text and drop what follows). Returns nullopt and fills
/// `*problem` (when non-null) on any error; never throws for bad text.
std::optional<nlohmann::json> try_parse_json(std::string_view text, JsonProblem* problem = nullptr,
                                             int max_depth = kJsonMaxDepth);

/// try_parse_json, or throws Error "<where>, byte <N>: not valid JSON: <why>".
nlohmann::json parse_json(std::string_view text, const std::string& where,
                          int max_depth = kJsonMaxDepth);

/// The whole of `file` parsed by parse_json (errors name the file and the byte offset). Throws
/// Error if the file cannot be read.
nlohmann::json read_json_file(const std::filesystem::path& file, int max_depth = kJsonMaxDepth);

/// A JSON value for an error message: its dump() cut to `max` bytes by shorten(). The value must
/// come from one of the functions above (bounded depth), or from longtron itself.
std::string json_excerpt(const nlohmann::json& value, size_t max = 80);

}  // namespace longtron
