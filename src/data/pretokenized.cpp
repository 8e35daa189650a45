#include "data/pretokenized.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_read.h"
#include "data/memory_source.h"
#include "data/preference_pairs.h"

namespace longtron::data {

namespace {

std::vector<int32_t> stored_row(const nlohmann::json& row, const std::string& where) {
  check(row.is_object() && row.contains("input_ids"),
        "{}: a .jsonl in a dataset must hold pre-tokenized rows {{\"input_ids\": [...], "
        "\"labels\": [...]}} (raw text is tokenized by `longtron prepare`)", where);
  const auto& ids = row["input_ids"];
  check(ids.is_array() && !ids.empty(), "{}: \"input_ids\" must be a non-empty array", where);
  const bool has_labels = row.contains("labels");
  check(!has_labels || (row["labels"].is_array() && row["labels"].size() == ids.size()),
        "{}: \"labels\" must be an array as long as \"input_ids\" ({} ids)", where, ids.size());
  std::vector<int32_t> stored(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i].is_number_integer() && ids[i].get<int64_t>() >= 0 &&
              ids[i].get<int64_t>() <= INT32_MAX,
          "{}: input_ids[{}] is not a token id (an integer in [0, 2^31))", where, i);
    const auto id = ids[i].get<int32_t>();
    bool loss = i > 0;  // position 0 is nobody's target
    if (has_labels) {
      const auto& label = row["labels"][i];
      check(label.is_number_integer() && (label.get<int64_t>() == -100 || label.get<int64_t>() == id),
            "{}: labels[{}] must be -100 or input_ids[{}] = {} (Hugging Face's aligned "
            "convention), got {}", where, i, i, id, json_excerpt(label));
      loss = loss && label.get<int64_t>() != -100;
    }
    stored[i] = loss ? (id == 0 ? kStoredLossZero : id) : -id;
  }
  return stored;
}

}  // namespace

std::unique_ptr<DocumentSource> open_pretokenized(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::vector<std::vector<int32_t>> documents;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A file whose first row is a preference pair holds pairs (preference_pairs.h).
    if (documents.empty() && is_pair_row(line)) return open_preference_pairs(file);
    const std::string where = file.string() + ", line " + std::to_string(number);
    documents.push_back(stored_row(parse_json(line, where), where));
  }
  return std::make_unique<MemorySource>(std::move(documents), file);
}

void write_pretokenized(const std::filesystem::path& file,
                        const std::vector<const std::vector<int32_t>*>& documents) {
  std::ofstream out(file, std::ios::binary);
  check(out.good(), "{}: cannot open for writing", file.string());
  std::string line, labels;
  char number[16];
  const auto append = [&number](std::string& to, int32_t value) {
    const auto [end, ec] = std::to_chars(number, number + sizeof(number), value);
    to.append(number, end);
  };
  for (const std::vector<int32_t>* doc : documents) {
    line.assign("{\"input_ids\": [");
    labels.assign("], \"labels\": [");
    for (size_t i = 0; i < doc->size(); ++i) {
      const int32_t stored = (*doc)[i];
      const bool loss = i > 0 && stored_label(stored, -1) >= 0;
      if (i > 0) line.append(", "), labels.append(", ");
      append(line, stored_input(stored));
      append(labels, loss ? stored_input(stored) : -100);
    }
    line.append(labels).append("]}\n");
    out.write(line.data(), static_cast<std::streamsize>(line.size()));
  }
  out.close();
  check(out.good(), "{}: write failed", file.string());
}

}  // namespace longtron::data
