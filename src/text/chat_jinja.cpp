// A model's own Jinja chat template (see chat_jinja.h): loading it the way transformers reads
// tokenizer_config.json, rendering, and locating each answer for the loss mask.
#include "text/chat_jinja.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/json_read.h"
#include "core/shorten.h"
#include "text/jinja/jinja.h"
#include "text/token_matcher.h"

namespace longtron::text {

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// nlohmann::json (sorted keys), not ordered_json, whose insertion is linear in the object size:
// a tokenizer.json vocabulary has 150 000 keys.
nlohmann::json read_json(const fs::path& file) {
  auto j = read_json_file(file);  // depth-bounded, NUL bytes refused
  check(j.is_object(), "{}: not a JSON object", file.string());
  return j;
}

// A special token of tokenizer_config.json: a string, an AddedToken object {"content": …}, or null.
std::string token_text(const nlohmann::json& v, const std::string& key, const fs::path& file) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  check(v.is_object() && v.contains("content") && v["content"].is_string(),
        "{}: \"{}\" must be a string or an object with a \"content\" string", file.string(), key);
  return v["content"].get<std::string>();
}

// The chat_template value: a string, or a list of {"name", "template"} whose "default" is taken.
std::string template_source(const nlohmann::json& value, const fs::path& file) {
  if (value.is_string()) return value.get<std::string>();
  check(value.is_array(), "{}: \"chat_template\" must be a string or a list of {{\"name\", \"template\"}}",
        file.string());
  std::vector<std::string> names;
  for (const auto& entry : value) {
    check(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
              entry.contains("template") && entry["template"].is_string(),
          "{}: every \"chat_template\" entry needs a \"name\" and a \"template\" string", file.string());
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names.push_back(shorten(entry["name"].get<std::string>()));
  }
  if (names.size() > 10) names.resize(10), names.push_back("...");
  fail("{}: \"chat_template\" has no entry named \"default\" (it has: {})", file.string(),
       fmt::join(names, ", "));
}

void add_token(ChatTemplate& t, const std::string& token, bool special) {
  if (token.empty()) return;
  if (std::find(t.special_tokens.begin(), t.special_tokens.end(), token) == t.special_tokens.end())
    t.special_tokens.push_back(token);
  if (special && std::find(t.end_tokens.begin(), t.end_tokens.end(), token) == t.end_tokens.end())
    t.end_tokens.push_back(token);
}

// Special tokens, template variables and added tokens of a tokenizer_config.json (and of the
// tokenizer.json beside it, which lists the added tokens some configs leave out).
void read_tokens(ChatTemplate& t, const nlohmann::json& config, const fs::path& file) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                          "mask_token"}) {
    if (!config.contains(key)) continue;
    const std::string text = token_text(config[key], key, file);
    if (text.empty()) continue;
    t.jinja_variables.emplace_back(key, text);
    add_token(t, text, true);
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array())
    for (const auto& v : config["additional_special_tokens"])
      add_token(t, token_text(v, "additional_special_tokens", file), true);
  auto added = [&](const nlohmann::json& list, const fs::path& from) {
    for (const auto& item : list) {
      check(item.is_object() && item.contains("content") && item["content"].is_string(),
            "{}: every added token needs a \"content\" string", from.string());
      add_token(t, item["content"].get<std::string>(), item.value("special", false));
    }
  };
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [id, item] : config["added_tokens_decoder"].items()) list.push_back(item);
    added(list, file);
  }
  const fs::path tokenizer_json = file.parent_path() / "tokenizer.json";
  if (fs::is_regular_file(tokenizer_json)) {
    const auto j = try_parse_json(read_file(tokenizer_json));
    if (j && j->is_object() && j->contains("added_tokens") && (*j)["added_tokens"].is_array())
      added((*j)["added_tokens"], tokenizer_json);
  }
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

TokenMatcher<char> matcher_of(const std::vector<std::string>& tokens) {
  TokenMatcher<char> m;
  for (const auto& token : tokens) m.add(token, 0);
  return m;
}

// The probe answer's end-of-turn token: the first special token after an answer.
void find_end_of_turn(ChatTemplate& t) {
  const Conversation probe = {{ChatMessage::Role::kUser, "Hi"}, {ChatMessage::Role::kAssistant, "Hello"}};
  try {
    const auto segments = jinja_chat_segments(t, probe, false, "a probe conversation");
    for (size_t i = 0; i + 1 < segments.size(); ++i)
      if (segments[i].loss && segments[i].text == "Hello") {
        const std::string& rest = segments[i + 1].text;
        const auto ends = matcher_of(t.end_tokens);
        for (size_t at = 0; at < rest.size(); ++at)
          if (const auto* token = ends.match(rest, at)) {
            t.end_of_turn = token->first;
            return;
          }
      }
  } catch (const Error&) {
    // A template that refuses the probe has no end of turn found here; generation stops at EOS.
  }
}

}  // namespace

bool is_jinja_chat_template(const fs::path& path) {
  if (fs::is_directory(path)) return true;
  if (path.extension() == ".jinja") return true;
  if (path.extension() != ".json" || !fs::is_regular_file(path)) return false;
  const auto j = try_parse_json(read_file(path));
  return j && j->is_object() && j->contains("chat_template");
}

ChatTemplate load_jinja_chat_template(const fs::path& path) {
  ChatTemplate t;
  t.name = path.string();
  std::string source;
  fs::path config_file, source_file;
  if (fs::is_directory(path)) {
    config_file = path / "tokenizer_config.json";
    source_file = path / "chat_template.jinja";
    if (!fs::is_regular_file(source_file)) source_file.clear();
    if (!fs::is_regular_file(config_file)) config_file.clear();
    check(!source_file.empty() || !config_file.empty(),
          "--chat-template {}: the folder has neither chat_template.jinja nor tokenizer_config.json",
          path.string());
  } else if (path.extension() == ".jinja") {
    source_file = path;
    config_file = path.parent_path() / "tokenizer_config.json";
    if (!fs::is_regular_file(config_file)) config_file.clear();
  } else {
    config_file = path;
  }
  nlohmann::json config = nlohmann::json::object();
  if (!config_file.empty()) config = read_json(config_file);
  if (!source_file.empty()) {
    source = read_file(source_file);
  } else {
    check(config.contains("chat_template"), "{}: no \"chat_template\" (the tokenizer has no chat template; "
          "use a built-in one: {})", config_file.string(), fmt::join(builtin_chat_templates(), ", "));
    source = template_source(config["chat_template"], config_file);
  }
  if (!config_file.empty()) read_tokens(t, config, config_file);
  t.special_matcher = std::make_shared<const TokenMatcher<char>>(matcher_of(t.special_tokens));
  t.end_matcher = std::make_shared<const TokenMatcher<char>>(matcher_of(t.end_tokens));
  const std::string where = (source_file.empty() ? config_file : source_file).string();
  t.jinja = std::make_shared<const jinja::Template>(jinja::Template::parse(source, where));
  find_end_of_turn(t);
  return t;
}

std::string render_jinja_chat(const ChatTemplate& chat, const Conversation& conversation,
                              bool add_generation_prompt, const std::string& what) {
  check(chat.jinja != nullptr, "chat template {} is not a Jinja template", chat.name);
  jinja::List messages;
  for (const auto& m : conversation) {
    auto message = std::make_shared<jinja::Dict>();
    message->set("role", jinja::Value::from(m.role == ChatMessage::Role::kSystem ? "system"
                                            : m.role == ChatMessage::Role::kUser ? "user"
                                                                                 : "assistant"));
    message->set("content", jinja::Value::from(m.content));
    messages.push_back(jinja::Value::from(std::move(message)));
  }
  jinja::Dict variables;
  variables.set("messages", jinja::Value::from(std::move(messages)));
  variables.set("tools", jinja::Value::none());
  variables.set("documents", jinja::Value::none());
  variables.set("add_generation_prompt", jinja::Value::from(add_generation_prompt));
  for (const auto& [key, value] : chat.jinja_variables) variables.set(key, jinja::Value::from(value));
  try {
    return chat.jinja->render(variables);
  } catch (const jinja::Raised& e) {
    fail("{}: the chat template refuses the conversation (template line {}): {}", what, e.line, e.message);
  } catch (const Error& e) {
    fail("{}: {}", what, e.what());
  }
}

std::vector<ChatSegment> jinja_chat_segments(const ChatTemplate& chat, const Conversation& conversation,
                                             bool add_generation_prompt, const std::string& what) {
  check(!conversation.empty(), "{}: the conversation has no messages", what);
  const std::string text = render_jinja_chat(chat, conversation, add_generation_prompt, what);
  if (add_generation_prompt) return {{text, false}};
  std::vector<ChatSegment> out;
  auto add = [&](size_t begin, size_t end, bool loss) {
    if (end > begin) out.push_back({text.substr(begin, end - begin), loss});
  };
  auto matcher = [](const std::shared_ptr<const TokenMatcher<char>>& built, const std::vector<std::string>& tokens) {
    return built ? built : std::make_shared<const TokenMatcher<char>>(matcher_of(tokens));
  };
  const auto specials_ptr = matcher(chat.special_matcher, chat.special_tokens);
  const auto ends_ptr = matcher(chat.end_matcher, chat.end_tokens);
  const TokenMatcher<char>& specials = *specials_ptr;
  const TokenMatcher<char>& ends = *ends_ptr;
  const std::string newlines = "\n";
  // Where `content` is in text[from:]: the earliest well-placed occurrence (after whitespace or a
  // special token, followed by a special token) of any of its forms, longest first at one place;
  // else (unless well_placed_only) the earliest occurrence. {npos, 0} if none.
  auto locate = [&](const std::string& content, size_t from, bool well_placed_only) {
    std::vector<std::string> forms = {content, jinja::py_strip(content, nullptr, true, true),
                                      jinja::py_strip(content, &newlines, true, true)};
    if (const size_t think = content.rfind("</think>"); think != std::string::npos)
      forms.push_back(jinja::py_strip(content.substr(think + 8), &newlines, true, false));
    size_t best = std::string::npos, best_len = 0, loose = std::string::npos, loose_len = 0;
    for (const auto& form : forms) {
      for (size_t at = text.find(form, from); at != std::string::npos; at = text.find(form, at + 1)) {
        size_t after = at + form.size();
        while (after < text.size() && is_space(text[after])) ++after;
        const bool starts = at == from || is_space(text[at - 1]) || specials.ends_at(text, at);
        const bool ended = after == text.size() || ends.match(text, after) != nullptr;
        if (loose == std::string::npos || at < loose || (at == loose && form.size() > loose_len))
          loose = at, loose_len = form.size();
        if (starts && ended) {
          if (best == std::string::npos || at < best || (at == best && form.size() > best_len))
            best = at, best_len = form.size();
          break;
        }
      }
    }
    if (best == std::string::npos && !well_placed_only) best = loose, best_len = loose_len;
    return std::pair{best, best_len};
  };
  // Where the template puts answer m: where a marker in its place appears in a second render,
  // when everything the render wrote before the marker is the same as in the real text. This
  // keeps an answer that also occurs in a header ("assistant", "\n", "") from being taken from
  // the header. npos when it cannot tell (the template rewrote the text before the answer).
  auto marked_position = [&](size_t m, size_t from) {
    static const std::string marker = "LongtronAnswerMarker7f3a";
    Conversation marked = conversation;
    marked[m].content = marker;
    std::string other;
    try {
      other = render_jinja_chat(chat, marked, false, what);
    } catch (const std::exception&) {
      return std::string::npos;
    }
    const size_t k = other.find(marker);
    if (k == std::string::npos || k < from || k > text.size() || other.compare(0, k, text, 0, k) != 0)
      return std::string::npos;
    return k;
  };
  size_t pos = 0;      // where the next search starts
  size_t emitted = 0;  // the end of the segments so far
  for (size_t m = 0; m < conversation.size(); ++m) {
    const std::string& content = conversation[m].content;
    if (conversation[m].role != ChatMessage::Role::kAssistant) {
      // Step over a system or user message found well placed, so that an answer repeating it is
      // not taken from it; one the template moved or rewrote is skipped.
      if (content.empty()) continue;
      const auto [at, len] = locate(content, pos, true);
      if (at != std::string::npos) pos = at + len;
      continue;
    }
    size_t best = std::string::npos, best_len = 0;
    if (const size_t k = marked_position(m, emitted); k != std::string::npos) {
      std::vector<std::string> forms = {content, jinja::py_strip(content, nullptr, true, true),
                                        jinja::py_strip(content, &newlines, true, true)};
      for (const auto& form : forms)
        if ((best == std::string::npos || form.size() > best_len) && text.compare(k, form.size(), form) == 0)
          best = k, best_len = form.size();
    }
    if (best == std::string::npos) std::tie(best, best_len) = locate(content, pos, false);
    check(best != std::string::npos,
          "{}: message {} (assistant) is not in the text the chat template rendered, neither verbatim "
          "nor stripped, so its loss cannot be placed", what, m);
    add(emitted, best, false);
    size_t end = best + best_len;
    add(best, end, true);
    // Through the first special token after the answer (the end of turn): loss; what follows: none.
    for (size_t at = end; at < text.size(); ++at)
      if (const auto* token = ends.match(text, at)) {
        add(end, at + token->first.size(), true);
        end = at + token->first.size();
        break;
      }
    pos = emitted = end;
  }
  add(emitted, text.size(), false);
  return out;
}

}  // namespace longtron::text
