// Chat templates (see chat_template.h). The built-in strings follow the upstream chat templates:
// InternLM2 and ChatML (`<|im_start|>role\n…<|im_end|>\n`, XTuner `internlm2_chat`), Llama 2
// (`<s>[INST] <<SYS>>\n…\n<</SYS>>\n\n… [/INST] … </s>`, Meta's `chat_completion`) and Mistral
// (`<s>[INST] … [/INST]…</s>`, the Mistral-7B-Instruct template).
#include "text/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_read.h"
#include "text/chat_jinja.h"

namespace longtron::text {

namespace {

constexpr std::string_view kContent = "{content}";

ChatTemplate builtin(const std::string& name) {
  ChatTemplate t;
  t.name = name;
  if (name == "internlm2" || name == "chatml") {
    t.bos = name == "internlm2" ? "<s>" : "";
    t.system = "<|im_start|>system\n{content}<|im_end|>\n";
    t.user = "<|im_start|>user\n{content}<|im_end|>\n";
    t.assistant = "<|im_start|>assistant\n{content}<|im_end|>\n";
    t.end_of_turn = "<|im_end|>";
    t.special_tokens = {"<|im_start|>", "<|im_end|>"};
    if (name == "internlm2") t.special_tokens.insert(t.special_tokens.begin(), "<s>");
  } else if (name == "llama2") {
    t.system = "<<SYS>>\n{content}\n<</SYS>>\n\n";
    t.system_in_first_user = true;
    t.user = "<s>[INST] {content} [/INST]";
    t.assistant = "{content}</s>";
    t.end_of_turn = "</s>";
    t.special_tokens = {"<s>", "</s>"};
  } else if (name == "mistral") {
    t.bos = "<s>";
    t.system = "{content}\n\n";
    t.system_in_first_user = true;
    t.user = "[INST] {content} [/INST]";
    t.assistant = "{content}</s>";
    t.end_of_turn = "</s>";
    t.special_tokens = {"<s>", "</s>"};
  }
  return t;
}

std::string read_whole(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::string string_field(const nlohmann::json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) return "";
  check(j[key].is_string(), "{}: \"{}\" must be a string", file, key);
  return j[key].get<std::string>();
}

ChatTemplate template_from_file(const std::filesystem::path& path) {
  const std::string file = path.string();
  const auto j = parse_json(read_whole(path), file);
  check(j.is_object(), "{}: a chat template file is one JSON object", file);
  static const std::vector<std::string> known = {"name",      "bos",         "system",
                                                 "user",      "assistant",   "end_of_turn",
                                                 "special_tokens", "system_in_first_user"};
  for (const auto& [key, value] : j.items())
    check(std::find(known.begin(), known.end(), key) != known.end(),
          "{}: unknown chat template key \"{}\"", file, key);
  ChatTemplate t;
  t.name = j.contains("name") ? string_field(j, "name", file) : file;
  t.bos = string_field(j, "bos", file);
  t.system = string_field(j, "system", file);
  t.user = string_field(j, "user", file);
  t.assistant = string_field(j, "assistant", file);
  t.end_of_turn = string_field(j, "end_of_turn", file);
  if (j.contains("system_in_first_user")) {
    check(j["system_in_first_user"].is_boolean(), "{}: \"system_in_first_user\" must be true or false",
          file);
    t.system_in_first_user = j["system_in_first_user"].get<bool>();
  }
  if (j.contains("special_tokens")) {
    const auto& s = j["special_tokens"];
    check(s.is_array(), "{}: \"special_tokens\" must be an array of strings", file);
    for (const auto& token : s) {
      check(token.is_string() && !token.get<std::string>().empty(),
            "{}: \"special_tokens\" must hold non-empty strings", file);
      t.special_tokens.push_back(token.get<std::string>());
    }
  }
  return t;
}

// Splits `text` at its one "{content}" into prefix and suffix.
std::pair<std::string, std::string> split_content(const std::string& text) {
  const size_t at = text.find(kContent);
  return {text.substr(0, at), text.substr(at + kContent.size())};
}

}  // namespace

ChatMessage::Role parse_role(const std::string& role, const std::string& where) {
  if (role == "system") return ChatMessage::Role::kSystem;
  if (role == "user") return ChatMessage::Role::kUser;
  if (role == "assistant") return ChatMessage::Role::kAssistant;
  fail("{}: role \"{}\" is not system, user or assistant", where, role);
}

void ChatTemplate::validate() const {
  if (jinja) return;  // a model's own template: nothing to check beyond its syntax
  auto once = [&](const std::string& field, const std::string& value, bool optional) {
    if (optional && value.empty()) return;
    const size_t at = value.find(kContent);
    check(at != std::string::npos && value.find(kContent, at + 1) == std::string::npos,
          "chat template {}: \"{}\" must hold {{content}} exactly once, got \"{}\"", name, field,
          value);
  };
  once("system", system, true);
  once("user", user, false);
  once("assistant", assistant, false);
  check(!end_of_turn.empty(), "chat template {}: \"end_of_turn\" is empty", name);
  check(std::find(special_tokens.begin(), special_tokens.end(), end_of_turn) != special_tokens.end(),
        "chat template {}: end_of_turn \"{}\" is not one of its special_tokens", name, end_of_turn);
  check(split_content(assistant).second.find(end_of_turn) != std::string::npos,
        "chat template {}: end_of_turn \"{}\" does not follow {{content}} in \"assistant\"", name,
        end_of_turn);
}

std::vector<std::string> builtin_chat_templates() { return {"internlm2", "chatml", "llama2", "mistral"}; }

ChatTemplate load_chat_template(const std::string& name_or_file) {
  const auto names = builtin_chat_templates();
  ChatTemplate t;
  if (std::find(names.begin(), names.end(), name_or_file) != names.end()) {
    t = builtin(name_or_file);
  } else if (std::filesystem::exists(name_or_file) && is_jinja_chat_template(name_or_file)) {
    return load_jinja_chat_template(name_or_file);
  } else {
    check(std::filesystem::is_regular_file(name_or_file),
          "--chat-template {}: neither a built-in template ({}) nor a model folder, tokenizer_config.json, "
          ".jinja or template file", name_or_file,
          fmt::format("{}", fmt::join(names, ", ")));
    t = template_from_file(name_or_file);
  }
  t.validate();
  return t;
}

ChatEncoder::ChatEncoder(const ChatTemplate& chat, const Tokenizer& tokenizer)
    : chat_(chat), tokenizer_(tokenizer) {
  chat_.validate();
  for (const auto& token : chat_.special_tokens) {
    const int32_t id = tokenizer_.piece_id(token);
    if (chat_.jinja && id < 0) {  // a model's added token this vocabulary lacks: text, unless special
      if (std::find(chat_.end_tokens.begin(), chat_.end_tokens.end(), token) != chat_.end_tokens.end())
        missing_.push_back(token);
      continue;
    }
    check(id >= 0, "chat template {}: special token \"{}\" is not a single id of the tokenizer's "
          "vocabulary (use a tokenizer that has it, or prepare --train-tokenizer, which adds it)",
          chat_.name, token);
    specials_.add(token, id);
    if (token == chat_.end_of_turn) end_of_turn_id_ = id;
  }
}

// Literal text: split at special tokens (longest match first), plain chunks encoded whole.
void ChatEncoder::append_literal(const std::string& text, bool loss, EncodedConversation& out) const {
  size_t chunk = 0, at = 0;
  auto flush = [&](size_t end) {
    if (end > chunk) {
      for (const int32_t id : tokenizer_.encode(text.substr(chunk, end - chunk), false)) {
        out.ids.push_back(id);
        out.loss.push_back(loss);
      }
    }
  };
  while (at < text.size()) {
    const auto* special = specials_.match(text, at);
    if (!special) {
      ++at;
      continue;
    }
    flush(at);
    out.ids.push_back(special->second);
    out.loss.push_back(loss);
    at += special->first.size();
    chunk = at;
  }
  flush(text.size());
}

std::vector<ChatSegment> chat_segments(const ChatTemplate& chat, const Conversation& conversation,
                                       bool add_reply_prefix, const std::string& what) {
  if (chat.jinja) return jinja_chat_segments(chat, conversation, add_reply_prefix, what);
  check(!conversation.empty(), "{}: the conversation has no messages", what);
  std::vector<ChatSegment> out;
  auto add = [&](std::string text, bool loss) {
    if (!text.empty()) out.push_back({std::move(text), loss});
  };
  add(chat.bos, false);
  std::string pending_system;  // system text waiting for the first user message
  for (size_t m = 0; m < conversation.size(); ++m) {
    const auto& message = conversation[m];
    using Role = ChatMessage::Role;
    const auto [prefix, suffix] = split_content(message.role == Role::kSystem ? chat.system
                                                : message.role == Role::kUser ? chat.user
                                                                              : chat.assistant);
    switch (message.role) {
      case Role::kSystem:
        check(m == 0, "{}: message {} is a system message; only the first may be", what, m);
        check(!chat.system.empty(), "{}: chat template {} has no system role", what, chat.name);
        if (chat.system_in_first_user) {
          check(conversation.size() > 1 && conversation[1].role == Role::kUser,
                "{}: chat template {} puts the system text into the first user message, but "
                "message 1 is not a user message", what, chat.name);
          pending_system = prefix + message.content + suffix;
        } else {
          add(prefix + message.content + suffix, false);
        }
        break;
      case Role::kUser:
        add(prefix + pending_system + message.content + suffix, false);
        pending_system.clear();
        break;
      case Role::kAssistant: {
        add(prefix, false);
        add(message.content, true);
        // The suffix: only the end-of-turn token carries loss (XTuner: EOS with loss, SEP without).
        const size_t eot = suffix.find(chat.end_of_turn);
        add(suffix.substr(0, eot), false);
        add(chat.end_of_turn, true);
        add(suffix.substr(eot + chat.end_of_turn.size()), false);
        break;
      }
    }
  }
  if (add_reply_prefix) add(split_content(chat.assistant).first, false);
  return out;
}

std::string chat_text(const ChatTemplate& chat, const Conversation& conversation) {
  if (chat.jinja) return render_jinja_chat(chat, conversation, false, "a conversation");
  std::string text;
  for (const auto& segment : chat_segments(chat, conversation, false, "a conversation"))
    text += segment.text;
  return text;
}

void ChatEncoder::check_specials(const std::vector<ChatSegment>& segments, const std::string& what) const {
  for (const auto& token : missing_)
    for (const auto& segment : segments)
      check(segment.text.find(token) == std::string::npos,
            "{}: the chat template {} writes the special token \"{}\", which is not a single id of the "
            "tokenizer's vocabulary (use the model's own tokenizer)", what, chat_.name, token);
}

EncodedConversation ChatEncoder::encode(const Conversation& conversation,
                                        const std::string& what) const {
  EncodedConversation out;
  const auto segments = chat_segments(chat_, conversation, false, what);
  check_specials(segments, what);
  for (const auto& segment : segments) append_literal(segment.text, segment.loss, out);
  return out;
}

std::vector<int32_t> ChatEncoder::encode_prompt(const Conversation& conversation) const {
  EncodedConversation out;
  const auto segments = chat_segments(chat_, conversation, true, "the prompt");
  check_specials(segments, "the prompt");
  for (const auto& segment : segments) append_literal(segment.text, segment.loss, out);
  return out.ids;
}

std::vector<int32_t> ChatEncoder::stop_ids() const {
  std::vector<int32_t> ids;
  if (end_of_turn_id_ >= 0) ids.push_back(end_of_turn_id_);
  for (const auto& [key, value] : chat_.jinja_variables)
    if (key == "eos_token") {
      const int32_t id = tokenizer_.piece_id(value);
      if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  return ids;
}

std::vector<NamedConversation> read_conversations(const std::filesystem::path& file) {
  std::istringstream lines(read_whole(file));
  std::vector<NamedConversation> conversations;
  std::string line;
  for (size_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}, line {}", file.string(), number);
    const auto j = parse_json(line, where);
    check(j.is_object(), "{}: not a JSON object", where);
    Conversation c;
    auto text = [&](const nlohmann::json& v, const char* key) {
      check(v.is_string(), "{}: \"{}\" must be a string", where, key);
      return v.get<std::string>();
    };
    if (j.contains("messages") && j["messages"].is_array()) {
      for (const auto& m : j["messages"]) {
        check(m.is_object() && m.contains("role") && m.contains("content"),
              "{}: every message needs \"role\" and \"content\"", where);
        c.push_back({parse_role(text(m["role"], "role"), where), text(m["content"], "content")});
      }
    } else if (j.contains("conversation") && j["conversation"].is_array()) {
      for (const auto& turn : j["conversation"]) {  // XTuner: {system?, input?, output?} per turn
        check(turn.is_object(), "{}: every conversation turn must be an object", where);
        if (turn.contains("system") && !text(turn["system"], "system").empty())
          c.push_back({ChatMessage::Role::kSystem, turn["system"].get<std::string>()});
        if (turn.contains("input")) c.push_back({ChatMessage::Role::kUser, text(turn["input"], "input")});
        if (turn.contains("output"))
          c.push_back({ChatMessage::Role::kAssistant, text(turn["output"], "output")});
      }
    } else {
      fail("{}: expected {{\"messages\": [...]}} or {{\"conversation\": [...]}}", where);
    }
    check(!c.empty(), "{}: the conversation has no messages", where);
    conversations.push_back({where, std::move(c)});
  }
  return conversations;
}

}  // namespace longtron::text
