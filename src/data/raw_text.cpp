#include "data/raw_text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_read.h"
#include "core/utf8.h"

namespace longtron::data {

namespace fs = std::filesystem;

namespace {

bool is_text_file(const fs::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".txt";
}

bool blank(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); });
}

std::string read_whole(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  check(!in.bad(), "{}: read error", file.string());
  return buffer.str();
}

// The text of one JSON object; `where` says where it is (", line 3" or ", element 2").
std::string text_of(const nlohmann::json& object, const std::string& field, const fs::path& file,
                    const std::string& where) {
  check(object.is_object(), "{}{}: expected a JSON object with a \"{}\" field", file.string(), where,
        field);
  const auto it = object.find(field);
  check(it != object.end() && it->is_string(), "{}{}: no string field \"{}\"", file.string(), where,
        field);
  return it->get<std::string>();
}

void add(std::vector<std::string>& documents, std::string text) {
  if (!blank(text)) documents.push_back(std::move(text));
}

}  // namespace

std::vector<fs::path> list_text_files(const std::vector<fs::path>& inputs) {
  std::vector<fs::path> files;
  for (const auto& input : inputs) {
    check(fs::exists(input), "{}: no such file or folder", input.string());
    if (fs::is_directory(input)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::recursive_directory_iterator(input))
        if (entry.is_regular_file() && is_text_file(entry.path())) found.push_back(entry.path());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      check(is_text_file(input), "{}: not a text input (expected .jsonl, .json or .txt)",
            input.string());
      files.push_back(input);
    }
  }
  return files;
}

std::vector<std::string> read_text_documents(const fs::path& file, const std::string& text_field) {
  const std::string ext = file.extension().string();
  const std::string content = read_whole(file);
  std::vector<std::string> documents;
  if (ext == ".json") {
    const auto json = parse_json(content, file.string());
    if (json.is_array()) {
      for (size_t i = 0; i < json.size(); ++i)
        add(documents, text_of(json[i], text_field, file, ", element " + std::to_string(i)));
    } else {
      add(documents, text_of(json, text_field, file, ""));
    }
    return documents;
  }
  std::istringstream lines(content);
  std::string line;
  for (size_t number = 1; std::getline(lines, line); ++number) {
    if (blank(line)) continue;
    if (ext == ".txt") {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      // As JSON's strings are: a tokenizer reads UTF-8, and its error could not say where.
      const size_t bad = unicode::invalid_utf8_at(line);
      check(bad == std::string::npos, "{}, line {}, byte {}: not valid UTF-8 text", file.string(),
            number, bad);
      add(documents, std::move(line));
      continue;
    }
    const std::string where = ", line " + std::to_string(number);
    const auto json = parse_json(line, file.string() + where);
    add(documents, text_of(json, text_field, file, where));
  }
  return documents;
}

std::vector<std::string> read_text_inputs(const std::vector<fs::path>& inputs,
                                          const std::string& text_field) {
  std::vector<std::string> documents;
  for (const auto& file : list_text_files(inputs)) {
    auto more = read_text_documents(file, text_field);
    std::move(more.begin(), more.end(), std::back_inserter(documents));
  }
  return documents;
}

}  // namespace longtron::data
