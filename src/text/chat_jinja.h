// A model's own chat template: the Jinja `chat_template` of a Hugging Face tokenizer_config.json,
// rendered as transformers' apply_chat_template(messages, tokenize=False) renders it, and the loss
// mask of a rendered conversation.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "text/chat_template.h"

namespace longtron::text {

/// Whether `path` names a Jinja chat template: a folder, a `.jinja` file, or a JSON file with a
/// "chat_template" key (a tokenizer_config.json). Other JSON files are literal template files.
bool is_jinja_chat_template(const std::filesystem::path& path);

/// Loads a Jinja chat template from a model folder (its chat_template.jinja where present, else
/// tokenizer_config.json's chat_template), a tokenizer_config.json, or a `.jinja` file (with the
/// tokenizer_config.json of its folder, if any, for the special tokens). A chat_template that is a
/// list takes the entry named "default". Special tokens (bos_token, eos_token, …) may be strings
/// or {"content": …} objects; added tokens come from added_tokens_decoder and, where the folder
/// has one, tokenizer.json's added_tokens. Throws Error naming the file for a missing or malformed
/// template, or the template line of a syntax error.
ChatTemplate load_jinja_chat_template(const std::filesystem::path& path);

/// The text of `conversation` rendered by the Jinja template of `chat`, with the variables
/// messages, tools=None, documents=None, add_generation_prompt and chat.jinja_variables. Throws
/// Error naming `what` if the template refuses the conversation (raise_exception: the template
/// line and its message) or fails.
std::string render_jinja_chat(const ChatTemplate& chat, const Conversation& conversation,
                              bool add_generation_prompt, const std::string& what);

/// The rendered conversation cut into loss segments. Each assistant message's content is found in
/// the rendered text, in order: verbatim, or as the template transformed it (stripped of
/// whitespace, as Llama 3's `| trim`; stripped of newlines; or the answer after a reasoning block's
/// `</think>`, which Qwen3 drops from earlier turns), preferring an occurrence that starts after
/// whitespace or a special token and is followed by a special token, and searching after the
/// system and user messages found so placed (so an answer that repeats the question is not taken
/// from the question). Loss falls on the content and
/// on the text after it through the first special token (chat.end_tokens) that follows, not on
/// what comes after that token. With add_generation_prompt the text is one no-loss segment.
/// Throws Error naming `what` and the message for content that cannot be found.
std::vector<ChatSegment> jinja_chat_segments(const ChatTemplate& chat, const Conversation& conversation,
                                             bool add_generation_prompt, const std::string& what);

}  // namespace longtron::text
