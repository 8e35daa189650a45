#include "data/preference_pairs.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/json_read.h"

namespace longtron::data {

namespace {

std::vector<int32_t> ids_of(const nlohmann::json& row, const char* key, const std::string& where) {
  check(row.contains(key), "{}: a preference pair needs \"{}\" (TRL's tokenized columns "
        "prompt_input_ids, chosen_input_ids, rejected_input_ids)", where, key);
  const auto& ids = row[key];
  check(ids.is_array() && !ids.empty(), "{}: \"{}\" must be a non-empty array of token ids",
        where, key);
  std::vector<int32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i].is_number_integer() && ids[i].get<int64_t>() >= 0 &&
              ids[i].get<int64_t>() <= INT32_MAX,
          "{}: {}[{}] is not a token id (an integer in [0, 2^31)), got {}", where, key, i,
          json_excerpt(ids[i]));
    out[i] = ids[i].get<int32_t>();
  }
  return out;
}

PairIds pair_of(const nlohmann::json& row, const std::string& where) {
  check(row.is_object(), "{}: expected a JSON object with prompt_input_ids, chosen_input_ids and "
        "rejected_input_ids", where);
  check(!row.contains("input_ids"), "{}: a supervised row (\"input_ids\") in a file of preference "
        "pairs: one file holds one kind", where);
  return {ids_of(row, "prompt_input_ids", where), ids_of(row, "chosen_input_ids", where),
          ids_of(row, "rejected_input_ids", where)};
}

}  // namespace

PairSource::PairSource(std::vector<PairIds> pairs, std::filesystem::path name,
                       std::vector<int64_t> lines)
    : pairs_(std::move(pairs)), name_(std::move(name)), lines_(std::move(lines)) {
  check(lines_.empty() || lines_.size() == pairs_.size(), "{}: {} line numbers for {} pairs",
        name_.string(), lines_.size(), pairs_.size());
  for (size_t p = 0; p < pairs_.size(); ++p)
    check(!pairs_[p].prompt.empty() && !pairs_[p].chosen.empty() && !pairs_[p].rejected.empty(),
          "{}, line {}: a pair needs a non-empty prompt, chosen and rejected", name_.string(),
          line_of(p));
}

size_t PairSource::document_length(size_t i) const {
  return pairs_.at(i / 2).prompt.size() + answer(i).size();
}

void PairSource::read_tokens(size_t i, size_t begin, size_t count, int32_t* out) const {
  const std::vector<int32_t>& prompt = pairs_.at(i / 2).prompt;
  const std::vector<int32_t>& tail = answer(i);
  check(begin <= document_length(i) && count <= document_length(i) - begin,
        "{}: document {} has {} tokens, asked for [{}, {})", name_.string(), i,
        document_length(i), begin, begin + count);
  for (size_t k = 0; k < count; ++k) {
    const size_t t = begin + k;
    const int32_t id = t < prompt.size() ? prompt[t] : tail[t - prompt.size()];
    out[k] = id == 0 ? kStoredLossZero : id;  // every id a target (see the class comment)
  }
}

bool is_pair_row(const std::string& first_line) {
  return first_line.find("\"chosen_input_ids\"") != std::string::npos;
}

std::unique_ptr<PairSource> open_preference_pairs(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::vector<PairIds> pairs;
  std::vector<int64_t> lines;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + ", line " + std::to_string(number);
    pairs.push_back(pair_of(parse_json(line, where), where));
    lines.push_back(number);
  }
  return std::make_unique<PairSource>(std::move(pairs), file, std::move(lines));
}

void write_preference_pairs(const std::filesystem::path& file, const std::vector<PairIds>& pairs) {
  std::ofstream out(file, std::ios::binary);
  check(out.good(), "{}: cannot open for writing", file.string());
  std::string line;
  char number[16];
  const auto append = [&](const char* key, const std::vector<int32_t>& ids, bool last) {
    line.append("\"").append(key).append("\": [");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line.append(", ");
      const auto [end, ec] = std::to_chars(number, number + sizeof(number), ids[i]);
      line.append(number, end);
    }
    line.append(last ? "]}\n" : "], ");
  };
  for (const PairIds& p : pairs) {
    line.assign(1, '{');  // (GCC 12's -Wrestrict misfires on assigning a literal)
    append("prompt_input_ids", p.prompt, false);
    append("chosen_input_ids", p.chosen, false);
    append("rejected_input_ids", p.rejected, true);
    out.write(line.data(), static_cast<std::streamsize>(line.size()));
  }
  out.close();
  check(out.good(), "{}: write failed", file.string());
}

}  // namespace longtron::data
