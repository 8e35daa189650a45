// Hugging Face fast tokenizers (`tokenizer.json`, model type BPE), with the semantics of Hugging
// Face's `tokenizers` library (github.com/huggingface/tokenizers, tokenizers/src): added tokens
// split off first, then normalizer, pre-tokenizer, BPE, and for decoding the decoder chain.
// docs/tokenizers.md lists the components read; any other is refused by name.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longtron::text {

/// A loaded tokenizer.json. Encoding is const and thread-safe (each thread keeps its own word
/// cache and regex match data).
class HfTokenizer {
 public:
  /// Parses the text of a tokenizer.json; `name` (the file) prefixes every error. Throws Error
  /// for bad JSON, a model other than BPE, a component longtron does not implement (named), merges
  /// naming tokens missing from the vocabulary, ids outside [0, 2^31 - 1) or a regex that does
  /// not compile.
  static HfTokenizer from_json(const std::string& json_text, const std::string& name);
  /// Reads and parses `path` (see from_json).
  static HfTokenizer load(const std::filesystem::path& path);
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  /// Ids of `text` as `Tokenizer.encode(text, add_special_tokens=False)` gives them: added tokens
  /// in the text are matched, no post-processor tokens are added. `text` must be valid UTF-8
  /// (Error otherwise, naming the byte offset).
  std::vector<int32_t> encode(std::string_view text) const;
  /// Text of `ids` through the decoder chain (`decode(ids, skip_special_tokens)`); ids outside
  /// the vocabulary are skipped, as Hugging Face does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;
  /// Id of `token` (added tokens first, then the model's vocabulary), -1 if none.
  int32_t token_id(std::string_view token) const;
  /// The token string of `id` ("" if none).
  std::string token(int32_t id) const;
  /// Whether `id` is an added token marked special.
  bool is_special(int32_t id) const;
  /// One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  /// Ids the post-processor's single-sequence template (TemplateProcessing, or Bert/Roberta
  /// processing) puts before and after the text; empty when it adds none.
  const std::vector<int32_t>& template_prefix() const;
  const std::vector<int32_t>& template_suffix() const;
  /// The tokenizer.json text it was parsed from.
  const std::string& json_text() const;
  const std::string& name() const;

  struct Impl;  // the parsed components (hf_tokenizer.cpp)

 private:
  HfTokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace longtron::text
