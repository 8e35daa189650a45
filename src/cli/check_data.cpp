// `longtron check-data PATH`: opens a tokenized dataset (any format, docs/data.md) and reads every
// document once, so a malformed file is reported before a long training run meets it.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "cli/registry.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/plural.h"
#include "data/open.h"
#include "data/validate.h"

namespace longtron::cli {
namespace {

namespace fs = std::filesystem;

// The vocab_size of the dataset.json in `path` or its parent folder (prepare's layout), or 0.
int64_t vocab_from_dataset_json(const fs::path& path) {
  for (const fs::path& folder : {path, path.parent_path()}) {
    const fs::path json_path = folder / "dataset.json";
    if (!fs::is_regular_file(json_path)) continue;
    const auto json = read_json_file(json_path);
    check(json.is_object() && json.contains("vocab_size") && json["vocab_size"].is_number_integer(),
          "{}: expected a JSON object with an integer \"vocab_size\"", json_path.string());
    return json["vocab_size"].get<int64_t>();
  }
  return 0;
}

Subcommand check_data_command(help_order::kCheckData, [](CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto vocab_size = std::make_shared<int64_t>(0);
  auto* sub = app.add_subcommand("check-data", "Read every document of a tokenized dataset and check it");
  sub->add_option("path", *path, "Dataset folder or file (.idx/.bin)")->required();
  auto* vocab_option = sub->add_option("--vocab-size", *vocab_size,
                  "Token ids must be below this (default: dataset.json's vocab_size, if any)");
  return [path, vocab_size, vocab_option] {
    check(vocab_option->count() == 0 || *vocab_size > 0, "check-data: --vocab-size must be > 0, got {}",
          *vocab_size);
    int64_t vocab = *vocab_size > 0 ? *vocab_size : vocab_from_dataset_json(fs::path(*path));
    const auto dataset = data::open_dataset(*path);
    data::validate_dataset(dataset, vocab > 0 ? vocab : (int64_t{1} << 31));
    fmt::print("check-data: {}: {}, {}, {}{}\n", *path,
               count_of(static_cast<int64_t>(dataset.size()), "file"),
               count_of(data::count_documents(dataset), "document"),
               count_of(data::count_tokens(dataset), "token"),
               vocab > 0 ? fmt::format(", all ids < {}", vocab) : std::string());
    return 0;
  };
});

}  // namespace
}  // namespace longtron::cli
