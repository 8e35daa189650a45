// open_dataset: format detection by file name, folders in sorted path order (docs/data.md).
#include "data/open.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "data/internevo.h"
#include "data/megatron.h"
#include "data/pretokenized.h"
#include "data/validate.h"

namespace longtron::data {

namespace fs = std::filesystem;

namespace {

fs::path without_extension(const fs::path& path) {
  fs::path prefix = path;
  return prefix.replace_extension();
}

// Opens one file of a dataset, or returns nullptr for a file that is not a dataset's entry point
// (a .meta, the .idx of a pair already opened through its .bin, dataset.json, tokenizer.model ...).
std::unique_ptr<DocumentSource> open_file(const fs::path& path, bool explicit_file) {
  const std::string ext = path.extension().string();
  if (ext == ".bin") {
    const fs::path prefix = without_extension(path);
    if (fs::exists(prefix.string() + ".idx")) return open_megatron(prefix);
    // InternEvo .bin files are JSON lines; anything else is most likely a Megatron .bin whose .idx
    // was not copied along, which the JSON reader would only report as "expected a JSON object".
    std::ifstream in(path, std::ios::binary);
    char first = 0;
    while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {}
    check(!in || first == '{', "{}: neither an InternEvo .bin (JSON lines) nor a Megatron .bin with "
          "its index ({}.idx is missing)", path.string(), prefix.string());
    return open_internevo(path);
  }
  if (ext == ".jsonl") return open_pretokenized(path);  // in a folder too: raw text is an error
  if (ext == ".idx") {
    const fs::path prefix = without_extension(path);
    check(fs::exists(prefix.string() + ".bin"), "{}: Megatron index without its data file {}.bin",
          path.string(), prefix.string());
    return explicit_file ? open_megatron(prefix) : nullptr;
  }
  if (explicit_file)
    fail("{}: not a tokenized dataset file (expected a Megatron .idx/.bin, an InternEvo .bin or "
         "a pre-tokenized .jsonl)",
         path.string());
  return nullptr;
}

}  // namespace

Dataset open_dataset(const fs::path& path) {
  check(fs::exists(path), "{}: no such file or folder", path.string());
  Dataset dataset;
  if (fs::is_directory(path)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::recursive_directory_iterator(path)) {
      if (entry.is_regular_file() && entry.path().filename().string().front() != '.')
        files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files)
      if (auto source = open_file(file, false)) dataset.push_back(std::move(source));
  } else {
    dataset.push_back(open_file(path, true));
  }
  check(count_documents(dataset) > 0, "{}: the dataset has no documents (no tokenized .bin/.idx "
        "files with content were found)", path.string());
  return dataset;
}

int64_t count_documents(const Dataset& dataset) {
  int64_t n = 0;
  for (const auto& source : dataset) n += static_cast<int64_t>(source->num_documents());
  return n;
}

int64_t count_tokens(const Dataset& dataset) {
  int64_t n = 0;
  for (const auto& source : dataset)
    for (size_t i = 0; i < source->num_documents(); ++i)
      n += static_cast<int64_t>(source->document_length(i));
  return n;
}

void validate_dataset(const Dataset& dataset, int64_t vocab_size, ProgressHook* progress) {
  std::vector<int32_t> tokens;
  if (progress && !dataset.empty())
    progress->begin("checking token ids", count_tokens(dataset), "tokens");
  int64_t done = 0, reported = 0;
  for (const auto& source : dataset) {
    for (size_t i = 0; i < source->num_documents(); ++i) {
      const size_t length = source->document_length(i);
      done += static_cast<int64_t>(length);
      if (progress && done - reported >= kProgressStepTokens) {
        progress->update(done);
        reported = done;
      }
      if (length == 0) fail("{}: document {} is empty (0 tokens)", source->path().string(), i);
      tokens.resize(length);
      source->read_tokens(i, 0, length, tokens.data());
      for (size_t j = 0; j < length; ++j) {
        // fail() under an if: check()'s arguments would build the path string for every token.
        if (stored_input(tokens[j]) >= vocab_size)
          fail("{}: document {}, token {}: id {} is outside the vocabulary of {} ids",
               source->path().string(), i, j, tokens[j], vocab_size);
      }
    }
  }
  if (progress && !dataset.empty()) {
    progress->update(done);
    progress->end();
  }
}

}  // namespace longtron::data
