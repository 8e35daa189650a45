#include "text/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <omp.h>

#include <algorithm>
#include <optional>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_read.h"
#include "text/hf_tokenizer.h"

namespace longtron::text {

namespace {

// Feeds training lines to SentencePiece without writing a temporary corpus file.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t i_ = 0;
};

bool space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Cuts `piece` (no newlines) at sentence ends, then at spaces, then anywhere, into lines < max_bytes.
void split_long(std::string_view piece, size_t max_bytes, std::vector<std::string>& out) {
  while (piece.size() >= max_bytes) {
    size_t cut = std::string_view::npos;
    for (size_t i = max_bytes - 1; i > 0 && cut == std::string_view::npos; --i) {
      const char c = piece[i - 1];
      if ((c == '.' || c == '?' || c == '!') && piece[i] == ' ') cut = i;
    }
    if (cut == std::string_view::npos) cut = piece.rfind(' ', max_bytes - 1);
    if (cut == std::string_view::npos || cut == 0) {
      cut = max_bytes - 1;
      while (cut > 0 && (static_cast<unsigned char>(piece[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
      if (cut == 0) cut = max_bytes - 1;
    }
    out.emplace_back(piece.substr(0, cut));
    piece.remove_prefix(cut);
    while (!piece.empty() && space(piece.front())) piece.remove_prefix(1);
  }
  if (!piece.empty()) out.emplace_back(piece);
}

}  // namespace

std::vector<std::string> split_for_training(const std::string& text, size_t max_bytes) {
  check(max_bytes >= 16, "max_sentence_bytes {} is too small", max_bytes);
  std::vector<std::string> lines;
  std::string_view rest(text);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view paragraph = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    while (!paragraph.empty() && space(paragraph.back())) paragraph.remove_suffix(1);
    while (!paragraph.empty() && space(paragraph.front())) paragraph.remove_prefix(1);
    if (!paragraph.empty()) split_long(paragraph, max_bytes, lines);
  }
  return lines;
}

/// A Hugging Face tokenizer with what tokenizer_config.json adds to it.
struct HfParts {
  HfTokenizer tokenizer;
  std::string config, special_map;  // the texts of tokenizer_config.json, special_tokens_map.json
  std::vector<int32_t> prefix, suffix;
  int32_t eos = -1;
};

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open {} for reading", path.string(), what);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A special token entry of tokenizer_config.json: a string, {"content": ...} or null.
std::string token_string(const nlohmann::json& config, const char* key, const std::string& name) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return {};
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  fail("{}: \"{}\" is not a string or {{\"content\": ...}}", name, key);
}

nlohmann::json parse_config(const std::string& text, const std::string& name) {
  if (text.empty()) return nlohmann::json::object();
  auto j = parse_json(text, name);  // depth-bounded, NUL bytes refused
  check(j.is_object(), "{}: is not a JSON object", name);
  return j;
}

}  // namespace

fs::path find_tokenizer_file(const fs::path& folder) {
  if (folder.empty()) return {};
  const bool json = fs::is_regular_file(folder / "tokenizer.json");
  if (json && fs::is_regular_file(folder / "tokenizer_config.json")) return folder / "tokenizer.json";
  if (fs::is_regular_file(folder / "tokenizer.model")) return folder / "tokenizer.model";
  if (json) return folder / "tokenizer.json";
  return {};
}

std::vector<fs::path> tokenizer_file_set(const fs::path& tokenizer_file) {
  std::vector<fs::path> files{tokenizer_file};
  if (tokenizer_file.extension() == ".json")
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
      if (const fs::path p = tokenizer_file.parent_path() / name; fs::is_regular_file(p)) files.push_back(p);
  return files;
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const fs::path& path) {
  fs::path file = path;
  if (fs::is_directory(path)) {
    file = find_tokenizer_file(path);
    check(!file.empty(), "{}: no tokenizer.json or tokenizer.model in this folder", path.string());
  } else if (path.filename() == "tokenizer_config.json") {
    file = path.parent_path() / "tokenizer.json";
    check(fs::is_regular_file(file), "{}: no tokenizer.json beside it", path.string());
  }
  if (file.extension() == ".json") {
    const std::string json = read_file(file, "tokenizer.json");
    std::string config, special_map;
    if (const fs::path p = file.parent_path() / "tokenizer_config.json"; fs::is_regular_file(p))
      config = read_file(p, "tokenizer_config.json");
    if (const fs::path p = file.parent_path() / "special_tokens_map.json"; fs::is_regular_file(p))
      special_map = read_file(p, "special_tokens_map.json");
    return from_hf_json(json, file.string(), config, special_map);
  }
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open SentencePiece model for reading", file.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return from_serialized(bytes.str(), file.string());
}

Tokenizer Tokenizer::from_serialized(const std::string& model_proto, const std::string& name) {
  Tokenizer tokenizer;
  tokenizer.name_ = name;
  tokenizer.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = tokenizer.sp_->LoadFromSerializedProto(model_proto);
  check(status.ok(), "{}: not a SentencePiece model: {}", name, status.ToString());
  return tokenizer;
}

Tokenizer Tokenizer::from_hf_json(const std::string& tokenizer_json, const std::string& name,
                                  const std::string& tokenizer_config,
                                  const std::string& special_tokens_map) {
  const fs::path folder = fs::path(name).parent_path();
  const std::string config_name = (folder / "tokenizer_config.json").string();
  const std::string map_name = (folder / "special_tokens_map.json").string();
  auto parts = std::make_shared<HfParts>(HfParts{HfTokenizer::from_json(tokenizer_json, name),
                                                 tokenizer_config, special_tokens_map, {}, {}, -1});
  const HfTokenizer& hf = parts->tokenizer;
  const auto config = parse_config(tokenizer_config, config_name);
  const auto map = parse_config(special_tokens_map, map_name);
  auto special = [&](const char* key) -> std::pair<std::string, int32_t> {
    std::string token = token_string(config, key, config_name);
    std::string from = config_name;
    if (token.empty()) token = token_string(map, key, map_name), from = map_name;
    if (token.empty()) return {"", -1};
    const int32_t id = hf.token_id(token);
    check(id >= 0, "{}: {} \"{}\" is not a token of {}", from, key, token, name);
    return {token, id};
  };
  const auto [bos_token, bos] = special("bos_token");
  const auto [eos_token, eos] = special("eos_token");
  parts->prefix = hf.template_prefix();
  parts->suffix = hf.template_suffix();
  parts->eos = eos;
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!config.contains(key) || config[key].is_null()) return std::nullopt;
    check(config[key].is_boolean(), "{}: \"{}\" is not true or false", config_name, key);
    return config[key].get<bool>();
  };
  if (const auto add_bos = flag("add_bos_token")) {
    check(!*add_bos || bos >= 0, "{}: add_bos_token is true but there is no bos_token", config_name);
    parts->prefix = *add_bos ? std::vector<int32_t>{bos} : std::vector<int32_t>{};
  }
  if (const auto add_eos = flag("add_eos_token")) {
    check(!*add_eos || eos >= 0, "{}: add_eos_token is true but there is no eos_token", config_name);
    parts->suffix = *add_eos ? std::vector<int32_t>{eos} : std::vector<int32_t>{};
  }
  Tokenizer tokenizer;
  tokenizer.name_ = name;
  tokenizer.hf_ = std::move(parts);
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool bos_eos) const {
  if (hf_) {
    std::vector<int32_t> ids = hf_->tokenizer.encode(text);
    if (!bos_eos) return ids;
    std::vector<int32_t> out;
    out.reserve(ids.size() + hf_->prefix.size() + hf_->suffix.size() + 1);
    out.insert(out.end(), hf_->prefix.begin(), hf_->prefix.end());
    out.insert(out.end(), ids.begin(), ids.end());
    out.insert(out.end(), hf_->suffix.begin(), hf_->suffix.end());
    if (hf_->eos >= 0 && (out.empty() || out.back() != hf_->eos)) out.push_back(hf_->eos);
    return out;
  }
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  check(status.ok(), "{}: encoding failed: {}", name_, status.ToString());
  std::vector<int32_t> out;
  out.reserve(ids.size() + 2);
  if (bos_eos && bos_id() >= 0) out.push_back(bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  if (bos_eos && eos_id() >= 0) out.push_back(eos_id());
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_all(std::span<const std::string> documents,
                                                        bool bos_eos, int threads) const {
  std::vector<std::vector<int32_t>> out(documents.size());
  const int n = threads > 0 ? threads : omp_get_max_threads();
  std::string error;
  bool out_of_memory = false;
  // Dynamic schedule: document lengths vary by orders of magnitude.
#pragma omp parallel for schedule(dynamic, 1) num_threads(n)
  for (size_t i = 0; i < documents.size(); ++i) {
    try {
      out[i] = encode(documents[i], bos_eos);
    } catch (const std::bad_alloc&) {
#pragma omp critical
      out_of_memory = true;
    } catch (const std::exception& e) {  // an exception leaving the parallel region is std::terminate
#pragma omp critical
      error = e.what();
    }
  }
  if (out_of_memory) throw std::bad_alloc();
  if (!error.empty()) throw Error(error);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (hf_) return hf_->tokenizer.decode(ids, /*skip_special_tokens=*/true);
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  check(status.ok(), "{}: decoding failed: {}", name_, status.ToString());
  return text;
}

int32_t Tokenizer::piece_id(const std::string& piece) const {
  if (hf_) return hf_->tokenizer.token_id(piece);
  const int id = sp_->PieceToId(piece);
  // PieceToId answers unk_id for unknown pieces: only the unk piece itself may map there.
  if (id < 0 || (id == sp_->unk_id() && sp_->IdToPiece(id) != piece)) return -1;
  return id;
}

int64_t Tokenizer::vocab_size() const {
  return hf_ ? hf_->tokenizer.vocab_size() : sp_->GetPieceSize();
}
int32_t Tokenizer::bos_id() const {
  if (hf_) return hf_->prefix.empty() ? -1 : hf_->prefix.front();
  return sp_->bos_id();
}
int32_t Tokenizer::eos_id() const { return hf_ ? hf_->eos : sp_->eos_id(); }
std::string Tokenizer::serialized() const {
  return hf_ ? hf_->tokenizer.json_text() : sp_->serialized_model_proto();
}

bool Tokenizer::is_special(int32_t id) const {
  if (hf_) return hf_->tokenizer.is_special(id);
  return id >= 0 && id < sp_->GetPieceSize() && sp_->IsControl(id);
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  if (hf_) return hf_->tokenizer.token(id);
  return id >= 0 && id < sp_->GetPieceSize() ? sp_->IdToPiece(id) : std::string();
}

std::vector<std::pair<std::string, std::string>> Tokenizer::files() const {
  if (!hf_) return {{"tokenizer.model", sp_->serialized_model_proto()}};
  std::vector<std::pair<std::string, std::string>> out{{"tokenizer.json", hf_->tokenizer.json_text()}};
  if (!hf_->config.empty()) out.emplace_back("tokenizer_config.json", hf_->config);
  if (!hf_->special_map.empty()) out.emplace_back("special_tokens_map.json", hf_->special_map);
  return out;
}

Tokenizer train_bpe_tokenizer(const std::vector<std::string>& documents,
                              const TokenizerTraining& options) {
  std::vector<std::string> lines;
  for (const auto& document : documents) {
    auto more = split_for_training(document, options.max_sentence_bytes);
    std::move(more.begin(), more.end(), std::back_inserter(lines));
  }
  check(!lines.empty(), "tokenizer training: the corpus has no text");
  // SentencePiece's trainer refuses more than 128 threads: a bigger machine (or --threads) uses 128.
  constexpr int kSentencePieceMaxThreads = 128;
  const int threads = std::min(
      kSentencePieceMaxThreads,
      options.threads > 0 ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"max_sentence_length", std::to_string(options.max_sentence_bytes)},
      {"num_threads", std::to_string(threads)},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"minloglevel", "2"},
  };
  if (!options.user_defined_symbols.empty()) {
    std::string joined;
    for (const auto& s : options.user_defined_symbols) {
      check(s.find(',') == std::string::npos,
            "tokenizer training: user-defined symbol \"{}\" contains a comma", s);
      joined += (joined.empty() ? "" : ",") + s;
    }
    kwargs["user_defined_symbols"] = joined;
  }
  if (options.keep_whitespace) {
    kwargs["normalization_rule_name"] = "identity";
    kwargs["remove_extra_whitespaces"] = "false";
  }
  LineIterator iterator(lines);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &iterator, &model);
  check(status.ok(), "tokenizer training (BPE, vocab_size {}) failed: {} (change --vocab-size)",
        options.vocab_size, status.ToString());
  return Tokenizer::from_serialized(model, "trained tokenizer");
}

}  // namespace longtron::text
