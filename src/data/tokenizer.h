// SentencePiece tokenizer (docs/data.md): load a .model, encode documents in parallel, train BPE.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace longtron::data {

/// A loaded SentencePiece model. Encoding is const and thread-safe.
class Tokenizer {
 public:
  /// Loads a SentencePiece `.model` file. Throws Error naming the file if it cannot be read/parsed.
  static Tokenizer load(const std::filesystem::path& model_path);
  /// Loads from a serialized ModelProto (the bytes of a .model file).
  static Tokenizer from_serialized(const std::string& model_proto, const std::string& name);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text`, with BOS first and EOS last when `bos_eos` (InternEvo convention).
  std::vector<int32_t> encode(const std::string& text, bool bos_eos = true) const;
  /// Encodes every document, `threads` at a time (0 = the OpenMP default). Output [documents][ids].
  std::vector<std::vector<int32_t>> encode_all(std::span<const std::string> documents,
                                               bool bos_eos = true, int threads = 0) const;
  /// Text of `ids` (control ids such as BOS/EOS are dropped).
  std::string decode(const std::vector<int32_t>& ids) const;
  /// Id of the vocabulary piece spelled exactly `piece` (e.g. "<s>", "<|im_end|>"), -1 if none.
  int32_t piece_id(const std::string& piece) const;
  int64_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  /// The serialized model (the bytes of a .model file).
  std::string serialized() const;

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string name_;
};

/// Options of train_bpe_tokenizer.
struct TokenizerTraining {
  int64_t vocab_size = 8192;
  /// Pieces that are always one id and never split (a chat template's special tokens).
  std::vector<std::string> user_defined_symbols;
  /// Keep text as written (identity normalization, whitespace runs and newlines kept; newlines
  /// encode through byte fallback) instead of NFKC with collapsed whitespace. Chat templates
  /// put meaning in "\n".
  bool keep_whitespace = false;
  int threads = 0;                    // 0 = all hardware threads
  size_t max_sentence_bytes = 4000;   // training lines are kept shorter than this
  double character_coverage = 0.9995;
};

/// Trains a SentencePiece BPE model on `documents` and returns it loaded. Documents are cut into
/// paragraphs (blank lines / newlines) and then sentences (". ", "? ", "! ") and finally at spaces so
/// every training line is < max_sentence_bytes (SentencePiece silently drops longer lines); the
/// documents themselves are encoded whole later. byte_fallback is on, so any text encodes without
/// <unk>; ids: unk 0, bos 1, eos 2. SentencePiece's logging is silenced. Throws Error if training
/// fails (e.g. a vocabulary larger than the corpus allows).
Tokenizer train_bpe_tokenizer(const std::vector<std::string>& documents,
                              const TokenizerTraining& options);

/// Splits `text` into training lines < max_bytes (see train_bpe_tokenizer). Exposed for tests.
std::vector<std::string> split_for_training(const std::string& text, size_t max_bytes);

}  // namespace longtron::data
