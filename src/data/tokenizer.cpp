#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <omp.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/error.h"

namespace longtron::data {

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

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::filesystem::path& model_path) {
  std::ifstream in(model_path, std::ios::binary);
  check(in.good(), "{}: cannot open SentencePiece model for reading", model_path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return from_serialized(bytes.str(), model_path.string());
}

Tokenizer Tokenizer::from_serialized(const std::string& model_proto, const std::string& name) {
  Tokenizer tokenizer;
  tokenizer.name_ = name;
  const auto status = tokenizer.sp_->LoadFromSerializedProto(model_proto);
  check(status.ok(), "{}: not a SentencePiece model: {}", name, status.ToString());
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool bos_eos) const {
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
  // Dynamic schedule: document lengths vary by orders of magnitude.
#pragma omp parallel for schedule(dynamic, 1) num_threads(n)
  for (size_t i = 0; i < documents.size(); ++i) {
    try {
      out[i] = encode(documents[i], bos_eos);
    } catch (const Error& e) {
#pragma omp critical
      error = e.what();
    }
  }
  if (!error.empty()) throw Error(error);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  check(status.ok(), "{}: decoding failed: {}", name_, status.ToString());
  return text;
}

int32_t Tokenizer::piece_id(const std::string& piece) const {
  const int id = sp_->PieceToId(piece);
  // PieceToId answers unk_id for unknown pieces: only the unk piece itself may map there.
  if (id < 0 || (id == sp_->unk_id() && sp_->IdToPiece(id) != piece)) return -1;
  return id;
}

int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }
std::string Tokenizer::serialized() const { return sp_->serialized_model_proto(); }

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

}  // namespace longtron::data
