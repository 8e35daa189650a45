// Tokenizers (docs/data.md, docs/tokenizers.md): a SentencePiece .model or a Hugging Face
// tokenizer.json (BPE, text/hf_tokenizer.h) behind one interface; encode documents in parallel;
// train a SentencePiece BPE.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace longtron::text {

struct HfParts;

/// The tokenizer file of a model folder: tokenizer.json when tokenizer_config.json is beside it,
/// else tokenizer.model, else a lone tokenizer.json; empty path when there is none.
std::filesystem::path find_tokenizer_file(const std::filesystem::path& folder);

/// The files that make up the tokenizer of `tokenizer_file`: itself, and for a tokenizer.json its
/// tokenizer_config.json and special_tokens_map.json where they exist beside it.
std::vector<std::filesystem::path> tokenizer_file_set(const std::filesystem::path& tokenizer_file);

/// A loaded SentencePiece model or Hugging Face tokenizer.json. Encoding is const and thread-safe.
class Tokenizer {
 public:
  /// Loads `path`: a SentencePiece `.model`, a Hugging Face `tokenizer.json` (with the
  /// tokenizer_config.json and special_tokens_map.json beside it, when present), a
  /// tokenizer_config.json (its folder's tokenizer.json), or a model folder (find_tokenizer_file).
  /// Throws Error naming the file if it cannot be read/parsed.
  static Tokenizer load(const std::filesystem::path& path);
  /// The same as load (the name says that it takes any of those).
  static Tokenizer load_any(const std::filesystem::path& path) { return load(path); }
  /// Loads from a serialized ModelProto (the bytes of a .model file).
  static Tokenizer from_serialized(const std::string& model_proto, const std::string& name);
  /// A Hugging Face tokenizer from the texts of its tokenizer.json and (may be empty)
  /// tokenizer_config.json and special_tokens_map.json. BOS: the ids the post-processor's
  /// single template puts first, or — where tokenizer_config.json sets add_bos_token — bos_token
  /// when true and nothing when false (as LlamaTokenizerFast does). EOS: its eos_token (a string
  /// or {"content": ...}; from special_tokens_map.json when tokenizer_config.json has none).
  static Tokenizer from_hf_json(const std::string& tokenizer_json, const std::string& name,
                                const std::string& tokenizer_config = {},
                                const std::string& special_tokens_map = {});
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text`, with BOS first and EOS last when `bos_eos` (InternEvo convention). A
  /// Hugging Face tokenizer matches its added tokens in `text` (as encode with
  /// add_special_tokens=False); with `bos_eos` it adds the template's tokens around the text (see
  /// from_hf_json) and then EOS unless the text already ends with it.
  std::vector<int32_t> encode(const std::string& text, bool bos_eos = true) const;
  /// Encodes every document, `threads` at a time (0 = the OpenMP default). Output [documents][ids].
  std::vector<std::vector<int32_t>> encode_all(std::span<const std::string> documents,
                                               bool bos_eos = true, int threads = 0) const;
  /// Text of `ids` (control ids such as BOS/EOS, and special added tokens, are dropped).
  std::string decode(const std::vector<int32_t>& ids) const;
  /// Id of the vocabulary piece spelled exactly `piece` (e.g. "<s>", "<|im_end|>"), -1 if none.
  int32_t piece_id(const std::string& piece) const;
  int64_t vocab_size() const;
  /// The id encode(..., true) puts first, -1 when none.
  int32_t bos_id() const;
  /// The id encode(..., true) puts last, -1 when none.
  int32_t eos_id() const;
  /// The serialized model (the bytes of a .model file; a tokenizer.json's text).
  std::string serialized() const;
  /// Whether this is a SentencePiece model (else a Hugging Face tokenizer.json).
  bool is_sentencepiece() const { return sp_ != nullptr; }
  /// Whether `id` is a control piece (SentencePiece) or a special added token (Hugging Face).
  bool is_special(int32_t id) const;
  /// The piece / token string of `id` ("" when out of range).
  std::string id_to_piece(int32_t id) const;
  /// The files to write beside data encoded with it, as (file name, bytes): tokenizer.model, or
  /// tokenizer.json with the tokenizer_config.json and special_tokens_map.json it was loaded with.
  std::vector<std::pair<std::string, std::string>> files() const;

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::shared_ptr<const HfParts> hf_;
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

}  // namespace longtron::text
