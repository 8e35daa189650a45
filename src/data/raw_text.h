// Raw text inputs of `prepare` (docs/data.md): .jsonl, .json and .txt.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace longtron::data {

/// The text files under `inputs` (each a file or a folder searched recursively), folders in
/// sorted path order, keeping only .jsonl/.json/.txt inside folders. An explicitly named file of
/// another type, or an input that does not exist, throws Error.
std::vector<std::filesystem::path> list_text_files(const std::vector<std::filesystem::path>& inputs);

/// Documents of one text file, in file order:
/// - .jsonl: one JSON object per non-blank line, text in `text_field`;
/// - .json: an object with `text_field`, or an array of such objects;
/// - .txt: one document per non-empty line, UTF-8 (as JSON strings are).
/// Documents whose text is empty or only whitespace are skipped. Throws Error naming the file and
/// the line (jsonl, txt) or array element (json) for invalid JSON, a missing or non-string field,
/// text that is not UTF-8, or an unreadable file.
std::vector<std::string> read_text_documents(const std::filesystem::path& file,
                                             const std::string& text_field = "text");

/// All documents of list_text_files(inputs), in order.
std::vector<std::string> read_text_inputs(const std::vector<std::filesystem::path>& inputs,
                                          const std::string& text_field = "text");

}  // namespace longtron::data
