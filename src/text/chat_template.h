// Chat templates for supervised fine-tuning: conversations -> token ids + which targets carry loss.
// A template is a handful of literal strings with a `{content}` placeholder per role, the same
// shape as XTuner's `PROMPT_TEMPLATE` entries and the Hugging Face chat templates of InternLM2,
// ChatML, Llama 2 and Mistral; the format of a template file is documented in docs/sft.md.
// A template may instead be a model's own Jinja chat template (tokenizer_config.json's
// `chat_template`), rendered as Hugging Face's apply_chat_template renders it (chat_jinja.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "text/token_matcher.h"
#include "text/tokenizer.h"

namespace longtron::text {

namespace jinja {
class Template;
}

/// One message of a conversation.
struct ChatMessage {
  enum class Role { kSystem, kUser, kAssistant };
  Role role = Role::kUser;
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

/// Parses "system" | "user" | "assistant"; anything else throws Error naming `where`.
ChatMessage::Role parse_role(const std::string& role, const std::string& where);

/// A chat template. Each role string holds `{content}` once; every other character is literal
/// text, except the strings of `special_tokens`, which are encoded as one vocabulary id each.
struct ChatTemplate {
  std::string name;
  std::string bos;        ///< literal text before the first message ("" for none)
  std::string system;     ///< one system message ("" = the template has no system role)
  std::string user;       ///< one user message
  std::string assistant;  ///< one assistant message: prefix {content} suffix
  /// The special token closing an assistant message (in `assistant` after {content}); generation
  /// stops at it and it carries loss.
  std::string end_of_turn;
  /// The rendered system text is put in front of the first user message's content (Llama 2 and
  /// Mistral) instead of being a turn of its own.
  bool system_in_first_user = false;
  std::vector<std::string> special_tokens;
  /// A model's own Jinja template (then bos/system/user/assistant are unused, special_tokens are
  /// the tokenizer's added tokens and end_of_turn the special token closing an answer, if found).
  std::shared_ptr<const jinja::Template> jinja;
  /// The Jinja variables bos_token, eos_token, … (tokenizer_config.json's special tokens).
  std::vector<std::pair<std::string, std::string>> jinja_variables;
  /// Of special_tokens, the special ones (a Jinja answer's loss runs through the first following).
  std::vector<std::string> end_tokens;
  /// special_tokens and end_tokens as matchers, built once by load_jinja_chat_template (rebuilt
  /// per conversation where null).
  std::shared_ptr<const TokenMatcher<char>> special_matcher, end_matcher;
  /// Throws Error naming the template and the field for a malformed template.
  void validate() const;
};

/// `internlm2`, `chatml`, `llama2` or `mistral`; a model folder, its tokenizer_config.json (a JSON
/// file with a "chat_template" key) or a `.jinja` file (a Jinja template, see chat_jinja.h);
/// otherwise `name` is a template file (JSON, keys as the fields above). Throws Error for an
/// unknown name that is not a readable, valid file.
ChatTemplate load_chat_template(const std::string& name_or_file);

/// Names of the built-in templates.
std::vector<std::string> builtin_chat_templates();

/// A run of literal text of a rendered conversation and whether its tokens carry loss.
struct ChatSegment {
  std::string text;
  bool loss = false;
};

/// `conversation` laid out by `chat`: bos, then each message's template text; an assistant message
/// is split into prefix, content (loss), suffix text before the end-of-turn token, the end-of-turn
/// token (loss), the rest. With add_reply_prefix the assistant prefix follows (a generation
/// prompt). Throws Error naming `what` for an empty conversation, a system message that is not
/// first, or one the template cannot place. A Jinja template: jinja_chat_segments (chat_jinja.h).
std::vector<ChatSegment> chat_segments(const ChatTemplate& chat, const Conversation& conversation,
                                       bool add_reply_prefix, const std::string& what);

/// The whole rendered text of a conversation (tokenizer training input).
std::string chat_text(const ChatTemplate& chat, const Conversation& conversation);

/// A conversation as tokens: ids[i] and whether ids[i] is a target that carries loss (an assistant
/// content token or the end-of-turn token closing an assistant message).
struct EncodedConversation {
  std::vector<int32_t> ids;
  std::vector<char> loss;
};

/// A template bound to a tokenizer. Literal text between special tokens is encoded as one chunk;
/// an assistant's content is encoded on its own, so the loss boundary is a token boundary.
class ChatEncoder {
 public:
  /// Throws Error naming the token if a special token of `chat` is not a single id of `tokenizer`
  /// (a Jinja template's added tokens: only a special one, and only when a rendered text holds
  /// it). `tokenizer` must outlive the encoder.
  ChatEncoder(const ChatTemplate& chat, const Tokenizer& tokenizer);
  /// The tokens of chat_segments(): each segment split at special tokens, plain text encoded
  /// without BOS/EOS. Errors as chat_segments, naming `what` (e.g. "file.jsonl, line 3").
  EncodedConversation encode(const Conversation& conversation, const std::string& what) const;
  /// The prompt of a reply: `conversation` (ending with a user message) then the assistant prefix.
  std::vector<int32_t> encode_prompt(const Conversation& conversation) const;
  int32_t end_of_turn_id() const { return end_of_turn_id_; }
  /// Where a reply ends: the end-of-turn id, and a Jinja template's eos_token id (if in the vocabulary).
  std::vector<int32_t> stop_ids() const;

 private:
  void check_specials(const std::vector<ChatSegment>& segments, const std::string& what) const;
  void append_literal(const std::string& text, bool loss, EncodedConversation& out) const;

  ChatTemplate chat_;
  const Tokenizer& tokenizer_;
  TokenMatcher<int32_t> specials_;  // special token -> id (longest match wins)
  int32_t end_of_turn_id_ = -1;
  std::vector<std::string> missing_;  // special tokens of a Jinja template the vocabulary lacks
};

/// A conversation and where it was read ("file.jsonl, line 3"), for error messages.
struct NamedConversation {
  std::string where;
  Conversation messages;
};

/// Conversations of a `.jsonl` file, one per non-blank line: `{"messages": [{"role", "content"}]}`
/// or XTuner's `{"conversation": [{"system"?, "input"?, "output"?}, …]}`. Throws Error naming the
/// file and line for invalid JSON or a row of neither shape.
std::vector<NamedConversation> read_conversations(const std::filesystem::path& file);

}  // namespace longtron::text
