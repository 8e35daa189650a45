// `longtron prepare`: raw text -> tokenized dataset (docs/data.md). Reads .jsonl/.json/.txt,
// encodes with a SentencePiece model (given or trained here) or a Hugging Face tokenizer.json,
// optionally holds out a seeded fraction of documents, and writes train/ [valid/], the tokenizer's
// files (tokenizer.model, or tokenizer.json with its tokenizer_config.json) and dataset.json — all
// under a temporary name renamed at the end, so a failure leaves nothing behind.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>

#include "cli/registry.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"
#include "core/plural.h"
#include "core/progress.h"
#include "data/chat_documents.h"
#include "data/internevo.h"
#include "data/megatron.h"
#include "data/open.h"
#include "data/preference_text.h"
#include "data/pretokenized.h"
#include "data/raw_text.h"
#include "data/validate.h"
#include "ops/threads.h"
#include "packing/shuffle.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace longtron::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::string tokenizer;
  bool train_tokenizer = false;
  int64_t vocab_size = 0;
  std::string format;  // "" = megatron, or with --chat internevo (jsonl where it must)
  std::string text_field = "text";
  double valid_fraction = 0.0;
  uint32_t seed = 1024;
  bool no_bos_eos = false;
  int threads = 0;
  bool chat = false;          // conversations -> SFT documents (no-loss tokens stored negative)
  bool preference = false;    // TRL preference pairs -> pairs.jsonl (data/preference_text.h)
  std::string chat_template;  // built-in name or template file
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Encodes in chunks so the progress line moves; each chunk is encoded in parallel.
std::vector<std::vector<int32_t>> encode_with_progress(const text::Tokenizer& tokenizer,
                                                       const std::vector<std::string>& documents,
                                                       bool bos_eos, int threads) {
  int64_t total_bytes = 0;
  for (const auto& d : documents) total_bytes += static_cast<int64_t>(d.size());
  Progress progress("tokenize", total_bytes, "bytes");  // counts bytes of text; the rate is tokens
  const auto start = Clock::now();
  std::vector<std::vector<int32_t>> out;
  out.reserve(documents.size());
  const size_t chunk = static_cast<size_t>(std::max(1, threads)) * 4;
  int64_t done_bytes = 0, tokens = 0;
  for (size_t begin = 0; begin < documents.size(); begin += chunk) {
    const size_t n = std::min(chunk, documents.size() - begin);
    auto encoded = tokenizer.encode_all(std::span(documents).subspan(begin, n), bos_eos, threads);
    for (size_t i = 0; i < n; ++i) {
      done_bytes += static_cast<int64_t>(documents[begin + i].size());
      tokens += static_cast<int64_t>(encoded[i].size());
      out.push_back(std::move(encoded[i]));
    }
    progress.update(done_bytes, fmt::format("{:.0f} tokens/s", tokens / std::max(1e-9, seconds_since(start))));
  }
  progress.finish(fmt::format("{}, {}, {:.0f} tokens/s",
                              count_of(static_cast<int64_t>(documents.size()), "document"),
                              count_of(tokens, "token"), tokens / std::max(1e-9, seconds_since(start))));
  return out;
}

// Indices of the held-out documents: the first round(F * n) of the NumPy-compatible permutation
// (docs/data.md), at least 1 and fewer than n, returned in corpus order.
std::vector<int64_t> choose_valid(int64_t n, double fraction, uint32_t seed) {
  if (fraction <= 0.0) return {};
  const int64_t k = std::max<int64_t>(1, std::llround(fraction * static_cast<double>(n)));
  check(k < n, "--valid-fraction {}: holding out {} of {} documents leaves nothing to train on",
        fraction, k, n);
  auto permutation = data::numpy_permutation(n, seed);
  std::vector<int64_t> valid(permutation.begin(), permutation.begin() + k);
  std::sort(valid.begin(), valid.end());
  return valid;
}

// Writes one split (documents `ids` of `encoded`) into `folder`; returns its token count.
int64_t write_split(const fs::path& folder, const std::vector<std::vector<int32_t>>& encoded,
                    const std::vector<int64_t>& ids, const PrepareOptions& options, int64_t vocab_size) {
  fs::create_directories(folder);
  int64_t tokens = 0;
  if (options.format == "megatron") {
    data::MegatronWriter writer(folder / "tokens", data::megatron_dtype_for_vocab(vocab_size));
    for (int64_t i : ids) writer.add_document(encoded[i].data(), encoded[i].size());
    writer.finish();
  } else if (options.format == "jsonl") {
    std::vector<const std::vector<int32_t>*> documents;
    for (int64_t i : ids) documents.push_back(&encoded[i]);
    data::write_pretokenized(folder / "tokens.jsonl", documents);
  } else {
    data::InternEvoWriter writer(folder / "tokens.bin");
    for (int64_t i : ids) writer.add_document(encoded[i].data(), encoded[i].size());
    writer.finish();
  }
  for (int64_t i : ids) tokens += static_cast<int64_t>(encoded[i].size());
  // Read back what was written: the readers' own checks, plus ids inside the vocabulary.
  const auto written = data::open_dataset(folder);
  data::validate_dataset(written, vocab_size);
  check(data::count_tokens(written) == tokens, "{}: wrote {} tokens but read back {}",
        folder.string(), tokens, data::count_tokens(written));
  return tokens;
}

text::Tokenizer get_tokenizer(const PrepareOptions& options, const std::vector<std::string>& documents,
                              const text::ChatTemplate* chat = nullptr) {
  if (!options.train_tokenizer) return text::Tokenizer::load(options.tokenizer);
  const auto start = Clock::now();
  fmt::print(stderr, "prepare: training a BPE tokenizer (vocab_size {}) on {} documents\n",
             options.vocab_size, documents.size());
  text::TokenizerTraining training;
  training.vocab_size = options.vocab_size;
  training.threads = options.threads;
  if (chat) {  // the template's special tokens become single pieces; "\n" stays a newline
    for (const auto& token : chat->special_tokens) {
      if (token == "<s>" || token == "</s>" || token == "<unk>") continue;  // already control pieces
      // A model's own template lists all its tokenizer's added tokens: keep those the text uses.
      if (chat->jinja && std::none_of(documents.begin(), documents.end(), [&](const std::string& d) {
            return d.find(token) != std::string::npos;
          }))
        continue;
      training.user_defined_symbols.push_back(token);
    }
    training.keep_whitespace = true;
  }
  auto tokenizer = text::train_bpe_tokenizer(documents, training);
  fmt::print(stderr, "prepare: tokenizer trained in {:.1f} s\n", seconds_since(start));
  return tokenizer;
}

void check_options(const PrepareOptions& options) {
  check(options.train_tokenizer != !options.tokenizer.empty(),
        "prepare: give exactly one of --tokenizer MODEL or --train-tokenizer --vocab-size N");
  // The trained BPE has byte fallback: 256 byte pieces + <unk>, <s>, </s> + one per character.
  check(!options.train_tokenizer || options.vocab_size >= 260,
        "prepare: --train-tokenizer needs --vocab-size N >= 260 (256 byte pieces, <unk>, <s>, </s> "
        "and one piece per distinct character of the corpus), got {}", options.vocab_size);
  check(options.threads >= 0 && options.threads <= 4096,
        "prepare: --threads must be in [1, 4096] (0 or none: all cores), got {}", options.threads);
  check(options.format.empty() || options.format == "megatron" || options.format == "internevo" ||
            options.format == "jsonl",
        "prepare: --format {} is not megatron, internevo or jsonl", options.format);
  check(!options.chat || options.format != "megatron",
        "prepare: --chat writes InternEvo .bin (no-loss tokens are stored as negative ids) or a "
        "pre-tokenized .jsonl with labels; --format {} cannot hold them", options.format);
  check(!options.chat || !options.preference, "prepare: --chat and --preference exclude each "
        "other (--preference renders conversational pairs with --chat-template alone)");
  check(options.chat == !options.chat_template.empty() || options.preference,
        "prepare: --chat and --chat-template NAME|FILE go together");
  check(!options.preference || !options.train_tokenizer,
        "prepare: --preference encodes with a given --tokenizer (no --train-tokenizer)");
  check(!options.preference || options.format.empty() || options.format == "jsonl",
        "prepare: --preference writes TRL's tokenized columns as a .jsonl; --format {} cannot "
        "hold pairs", options.format);
  check(!options.preference || !options.no_bos_eos,
        "prepare: --no-bos-eos has no meaning with --preference (BOS and EOS go where TRL puts "
        "them)");
  check(!options.chat || !options.no_bos_eos,
        "prepare: --no-bos-eos has no meaning with --chat (the chat template places BOS/EOS)");
  check(options.valid_fraction >= 0.0 && options.valid_fraction < 1.0,
        "prepare: --valid-fraction {} is not in [0, 1)", options.valid_fraction);
  const fs::path output(options.output);
  check(!fs::exists(output) || fs::is_empty(output) || fs::exists(output / "dataset.json"),
        "prepare: --output {} exists and is not a prepared dataset (refusing to replace it)",
        options.output);
}

// --chat: conversations of the .jsonl inputs through the template; no-loss tokens stored negative.
std::vector<std::vector<int32_t>> encode_chat(const PrepareOptions& options,
                                              const std::vector<fs::path>& inputs,
                                              const text::ChatTemplate& chat,
                                              std::optional<text::Tokenizer>& tokenizer) {
  std::vector<text::NamedConversation> conversations;
  for (const auto& file : data::list_text_files(inputs)) {
    check(file.extension() == ".jsonl", "prepare --chat: {} is not a .jsonl of conversations",
          file.string());
    auto more = text::read_conversations(file);
    std::move(more.begin(), more.end(), std::back_inserter(conversations));
  }
  check(!conversations.empty(), "prepare: no conversations in {}", fmt::join(options.inputs, ", "));
  fmt::print(stderr, "prepare: {} from {}, template {}\n",
             count_of(static_cast<int64_t>(conversations.size()), "conversation"),
             count_of(static_cast<int64_t>(inputs.size()), "input"), chat.name);
  std::vector<std::string> texts;  // tokenizer training corpus: the rendered conversations
  if (options.train_tokenizer)
    for (const auto& c : conversations) texts.push_back(text::chat_text(chat, c.messages));
  tokenizer.emplace(get_tokenizer(options, texts, &chat));
  const text::ChatEncoder encoder(chat, *tokenizer);
  std::vector<std::vector<int32_t>> encoded(conversations.size());
  std::string error;
  bool out_of_memory = false;
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t i = 0; i < conversations.size(); ++i) {
    try {
      const auto& c = conversations[i];
      encoded[i] = data::to_stored_ids(encoder.encode(c.messages, c.where));
    } catch (const std::bad_alloc&) {
#pragma omp critical
      out_of_memory = true;
    } catch (const std::exception& e) {  // an exception leaving the parallel region is std::terminate
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (out_of_memory) throw std::bad_alloc();
  if (!error.empty()) throw Error("prepare: " + error);
  return encoded;
}

// Every reader refuses a document of no tokens: say which input document it is before writing
// (the readers' own check would name the temporary output file).
void check_no_empty_document(const std::vector<std::vector<int32_t>>& encoded,
                             const PrepareOptions& options) {
  for (size_t i = 0; i < encoded.size(); ++i)
    check(!encoded[i].empty(),
          "prepare: document {} of the inputs (counting from 1, in input order, blank ones "
          "skipped) encodes to no tokens{}", i + 1,
          options.no_bos_eos ? " (--no-bos-eos adds no BOS/EOS around it)" : "");
}

// The format written: --format, else megatron for text; for chat InternEvo's .bin, unless an
// answer holds token id 0 (e.g. "!" in Llama 3's and Qwen2's vocabularies), which only a
// pre-tokenized .jsonl with labels can mark as carrying loss.
std::string output_format(const PrepareOptions& options,
                          const std::vector<std::vector<int32_t>>& encoded) {
  if (!options.format.empty()) return options.format;
  if (!options.chat) return "megatron";
  for (const auto& doc : encoded)
    if (std::find(doc.begin(), doc.end(), data::kStoredLossZero) != doc.end()) {
      fmt::print(stderr, "prepare: an answer holds token id 0, which InternEvo's .bin cannot mark "
                         "as carrying loss: writing a pre-tokenized .jsonl with labels\n");
      return "jsonl";
    }
  return "internevo";
}

// --preference: TRL's preference formats -> train/pairs.jsonl [valid/pairs.jsonl], pairs held out
// whole by the seeded shuffle of --valid-fraction.
int run_prepare_preference(const PrepareOptions& options, const fs::path& output) {
  const auto start = Clock::now();
  const text::Tokenizer tokenizer = text::Tokenizer::load(options.tokenizer);
  std::optional<text::ChatTemplate> chat;
  if (!options.chat_template.empty()) chat = text::load_chat_template(options.chat_template);
  std::vector<data::PairIds> pairs;
  for (const auto& file : data::list_text_files({options.inputs.begin(), options.inputs.end()})) {
    check(file.extension() == ".jsonl", "prepare --preference: {} is not a .jsonl of pairs",
          file.string());
    auto more = data::read_preference_text(file, tokenizer, chat ? &*chat : nullptr);
    std::move(more.begin(), more.end(), std::back_inserter(pairs));
  }
  check(!pairs.empty(), "prepare: no preference pairs in {}", fmt::join(options.inputs, ", "));
  const auto n = static_cast<int64_t>(pairs.size());
  const auto valid = choose_valid(n, options.valid_fraction, options.seed);
  std::vector<data::PairIds> split[2];  // train, valid
  for (int64_t i = 0, v = 0; i < n; ++i) {
    const bool held = v < static_cast<int64_t>(valid.size()) && valid[size_t(v)] == i;
    v += held;
    split[held].push_back(std::move(pairs[size_t(i)]));
  }
  const auto tokens = [](const std::vector<data::PairIds>& ps) {
    int64_t t = 0;
    for (const auto& p : ps) t += int64_t(2 * p.prompt.size() + p.chosen.size() + p.rejected.size());
    return t;
  };
  nlohmann::json info;
  write_atomically(output, [&](const fs::path& tmp) {
    const int64_t vocab = tokenizer.vocab_size();
    info = {{"format", "preference"}, {"pairs", n}, {"documents", 2 * n}, {"tokens", 0},
            {"vocab_size", vocab}, {"bos_id", tokenizer.bos_id()},
            {"eos_id", tokenizer.eos_id()}, {"tokenizer", tokenizer.files().front().first}};
    if (chat) info["chat_template"] = chat->name;
    for (int s = 0; s < (valid.empty() ? 1 : 2); ++s) {
      const fs::path folder = tmp / (s == 0 ? "train" : "valid");
      fs::create_directories(folder);
      data::write_preference_pairs(folder / "pairs.jsonl", split[s]);
      data::validate_dataset(data::open_dataset(folder), vocab);  // read back, ids in range
      if (!valid.empty())
        info[s == 0 ? "train" : "valid"] = {{"pairs", split[s].size()}, {"tokens", tokens(split[s])}};
    }
    info["tokens"] = tokens(split[0]) + tokens(split[1]);
    if (!valid.empty()) info["valid_fraction"] = options.valid_fraction, info["seed"] = options.seed;
    auto files = tokenizer.files();
    files.emplace_back("dataset.json", info.dump(2) + "\n");
    for (const auto& [name, text] : files) {
      std::ofstream out(tmp / name, std::ios::binary);
      out << text;
      out.close();
      check(out.good(), "{}: write failed ({})", (tmp / name).string(), io_error_text());
    }
  });
  fmt::print("prepare: wrote {} (preference pairs): {} pairs ({} train, {} valid), {} tokens, "
             "vocab_size {}; total {:.1f} s\n", options.output, n, split[0].size(),
             split[1].size(), info["tokens"].get<int64_t>(), tokenizer.vocab_size(),
             seconds_since(start));
  return 0;
}

int run_prepare(const PrepareOptions& given) {
  check_options(given);
  if (given.preference) {
    fs::path output = fs::path(given.output).lexically_normal();
    if (output.filename().empty()) output = output.parent_path();
    set_num_threads(given.threads);
    return run_prepare_preference(given, output);
  }
  PrepareOptions options = given;
  const auto start = Clock::now();
  const int threads = set_num_threads(options.threads);
  std::vector<fs::path> inputs(options.inputs.begin(), options.inputs.end());
  std::optional<text::Tokenizer> tokenizer;
  std::vector<std::vector<int32_t>> encoded;
  std::optional<text::ChatTemplate> chat;
  const auto encode_start = Clock::now();
  if (options.chat) {
    chat = text::load_chat_template(options.chat_template);
    encoded = encode_chat(options, inputs, *chat, tokenizer);
  } else {
    const auto documents = data::read_text_inputs(inputs, options.text_field);
    check(!documents.empty(), "prepare: no documents in {}", fmt::join(options.inputs, ", "));
    fmt::print(stderr, "prepare: {} from {}\n", count_of(static_cast<int64_t>(documents.size()), "document"),
               count_of(static_cast<int64_t>(inputs.size()), "input"));
    tokenizer.emplace(get_tokenizer(options, documents));
    encoded = encode_with_progress(*tokenizer, documents, !options.no_bos_eos, threads);
  }
  const double encode_seconds = seconds_since(encode_start);
  check_no_empty_document(encoded, options);
  options.format = output_format(options, encoded);

  const auto n = static_cast<int64_t>(encoded.size());
  const auto valid = choose_valid(n, options.valid_fraction, options.seed);
  std::vector<int64_t> train;
  for (int64_t i = 0, v = 0; i < n; ++i) {
    if (v < static_cast<int64_t>(valid.size()) && valid[v] == i) ++v;
    else train.push_back(i);
  }

  // "out/" would put the temporary name inside the target: drop a trailing separator.
  fs::path output = fs::path(options.output).lexically_normal();
  if (output.filename().empty()) output = output.parent_path();
  nlohmann::json info;
  write_atomically(output, [&](const fs::path& tmp) {
    fs::create_directories(tmp);
    const int64_t vocab = tokenizer->vocab_size();
    const int64_t train_tokens = write_split(tmp / "train", encoded, train, options, vocab);
    info = {{"format", options.format}, {"documents", n}, {"vocab_size", vocab},
            {"bos_id", tokenizer->bos_id()}, {"eos_id", tokenizer->eos_id()},
            {"bos_eos", !options.no_bos_eos && !options.chat},
            {"tokenizer", tokenizer->files().front().first}};
    if (chat) info["chat_template"] = chat->name;
    int64_t tokens = train_tokens;
    if (!valid.empty()) {
      const int64_t valid_tokens = write_split(tmp / "valid", encoded, valid, options, vocab);
      tokens += valid_tokens;
      info["valid_fraction"] = options.valid_fraction;
      info["seed"] = options.seed;
      info["train"] = {{"documents", train.size()}, {"tokens", train_tokens}};
      info["valid"] = {{"documents", valid.size()}, {"tokens", valid_tokens}};
    }
    info["tokens"] = tokens;
    auto files = tokenizer->files();
    files.emplace_back("dataset.json", info.dump(2) + "\n");
    for (const auto& [name, text] : files) {
      std::ofstream out(tmp / name, std::ios::binary);
      out << text;
      out.close();
      check(out.good(), "{}: write failed ({})", (tmp / name).string(), io_error_text());
    }
  });

  const int64_t tokens = info["tokens"].get<int64_t>();
  fmt::print("prepare: wrote {} ({} format): {} documents ({} train, {} valid), {} tokens, "
             "vocab_size {}\n", options.output, options.format, n, train.size(), valid.size(),
             tokens, tokenizer->vocab_size());
  fmt::print("prepare: tokenized at {:.0f} tokens/s on {}; total {:.1f} s\n",
             static_cast<double>(tokens) / std::max(1e-9, encode_seconds), count_of(threads, "thread"),
             seconds_since(start));
  return 0;
}

Subcommand prepare_command(help_order::kPrepare, [](CLI::App& app) {
  auto options = std::make_shared<PrepareOptions>();
  auto* sub = app.add_subcommand("prepare", "Tokenize raw text (.jsonl/.json/.txt) into a dataset");
  sub->add_option("--input", options->inputs, "Text files or folders (searched recursively)")
      ->required()->expected(1, -1);
  sub->add_option("--output", options->output, "Output folder")->required();
  sub->add_option("--tokenizer", options->tokenizer,
                  "Tokenizer to encode with: a SentencePiece tokenizer.model, a Hugging Face "
                  "tokenizer.json, or a model folder");
  sub->add_flag("--train-tokenizer", options->train_tokenizer, "Train a BPE tokenizer on the input");
  sub->add_option("--vocab-size", options->vocab_size, "Vocabulary size of the trained tokenizer");
  sub->add_flag("--chat", options->chat,
                "Inputs are .jsonl conversations (messages or XTuner conversation); writes an "
                "InternEvo .bin where only assistant answers carry loss");
  sub->add_flag("--preference", options->preference,
                "Inputs are .jsonl preference pairs in TRL's formats (prompt/chosen/rejected as "
                "text or messages, or chosen/rejected conversations sharing the prompt); writes "
                "train/pairs.jsonl of prompt_input_ids, chosen_input_ids, rejected_input_ids");
  sub->add_option("--chat-template", options->chat_template,
                  "With --chat or --preference: internlm2 | chatml | llama2 | mistral | a model folder, its "
                  "tokenizer_config.json or a .jinja file (the model's own template) | a template "
                  "file (JSON)");
  sub->add_option("--format", options->format,
                  "megatron (default; with --chat internevo, or jsonl where an answer holds token "
                  "id 0), internevo or jsonl (pre-tokenized input_ids and labels)")
      ->check(CLI::IsMember({"megatron", "internevo", "jsonl"}));
  sub->add_option("--text-field", options->text_field, "JSON field holding the text (default text)");
  sub->add_option("--valid-fraction", options->valid_fraction,
                  "Fraction of documents held out into valid/ (seeded shuffle)");
  sub->add_option("--seed", options->seed, "Seed of the held-out choice (default 1024)");
  sub->add_flag("--no-bos-eos", options->no_bos_eos, "Do not add BOS/EOS around documents");
  sub->add_option("--threads", options->threads, "Encoding threads (default: all cores)");
  return [options] {
    return run_prepare(*options);
  };
});

}  // namespace
}  // namespace longtron::cli
