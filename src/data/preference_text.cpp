#include "data/preference_text.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/json_read.h"

namespace longtron::data {

namespace {

using text::ChatMessage;
using text::Conversation;

Conversation messages_of(const nlohmann::json& v, const char* key, const std::string& where) {
  check(v.is_array() && !v.empty(), "{}: \"{}\" must be a non-empty list of messages", where, key);
  Conversation c;
  for (const auto& m : v) {
    check(m.is_object() && m.contains("role") && m.contains("content") && m["role"].is_string() &&
              m["content"].is_string(),
          "{}: every message of \"{}\" needs string \"role\" and \"content\"", where, key);
    c.push_back({text::parse_role(m["role"].get<std::string>(), where),
                 m["content"].get<std::string>()});
  }
  return c;
}

bool same(const ChatMessage& a, const ChatMessage& b) {
  return a.role == b.role && a.content == b.content;
}

/// TRL's extract_prompt on conversations: the longest shared leading messages, not ending with
/// an assistant message (that one is part of the answers).
size_t shared_prompt(const Conversation& chosen, const Conversation& rejected) {
  size_t n = 0;
  while (n < chosen.size() && n < rejected.size() && same(chosen[n], rejected[n])) ++n;
  while (n > 0 && chosen[n - 1].role == ChatMessage::Role::kAssistant) --n;
  return n;
}

/// Prompt + answer rendered by the template; the answer is what follows the prompt's tokens
/// (the prompt: its messages and the assistant's generation prefix).
std::vector<int32_t> answer_ids(const text::ChatEncoder& encoder, const Conversation& prompt,
                                const std::vector<int32_t>& prompt_ids, const Conversation& answer,
                                const char* key, const std::string& where) {
  Conversation whole = prompt;
  whole.insert(whole.end(), answer.begin(), answer.end());
  const std::vector<int32_t> ids = encoder.encode(whole, where).ids;
  check(ids.size() > prompt_ids.size() &&
            std::equal(prompt_ids.begin(), prompt_ids.end(), ids.begin()),
        "{}: the template renders prompt + {} so that it does not start with the prompt's "
        "tokens (or adds nothing after them)", where, key);
  return {ids.begin() + static_cast<std::ptrdiff_t>(prompt_ids.size()), ids.end()};
}

PairIds conversational(const nlohmann::json& row, const text::ChatEncoder& encoder,
                       const std::string& where) {
  Conversation chosen = messages_of(row["chosen"], "chosen", where);
  Conversation rejected = messages_of(row["rejected"], "rejected", where);
  Conversation prompt;
  if (row.contains("prompt")) {
    prompt = messages_of(row["prompt"], "prompt", where);
  } else {  // implicit prompt
    const size_t n = shared_prompt(chosen, rejected);
    check(n > 0, "{}: no \"prompt\", and \"chosen\" and \"rejected\" share no leading message "
          "to take as the prompt", where);
    prompt.assign(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(n));
    chosen.erase(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(n));
    rejected.erase(rejected.begin(), rejected.begin() + static_cast<std::ptrdiff_t>(n));
    check(!chosen.empty() && !rejected.empty(), "{}: after the shared prompt, \"chosen\" or "
          "\"rejected\" has no message left", where);
  }
  check(prompt.back().role == ChatMessage::Role::kUser,
        "{}: the prompt must end with a user message", where);
  PairIds p;
  p.prompt = encoder.encode_prompt(prompt);
  p.chosen = answer_ids(encoder, prompt, p.prompt, chosen, "chosen", where);
  p.rejected = answer_ids(encoder, prompt, p.prompt, rejected, "rejected", where);
  return p;
}

PairIds plain(const nlohmann::json& row, const text::Tokenizer& tokenizer, const std::string& where) {
  check(row.contains("prompt"), "{}: a plain-text pair needs \"prompt\" (the implicit prompt is "
        "read from conversations only)", where);
  const auto text = [&](const char* key) {
    check(row[key].is_string(), "{}: \"{}\" must be a string (or, in a conversational pair, a "
          "list of messages)", where, key);
    return row[key].get<std::string>();
  };
  PairIds p;
  if (tokenizer.bos_id() >= 0) p.prompt.push_back(tokenizer.bos_id());
  const auto prompt = tokenizer.encode(text("prompt"), false);
  p.prompt.insert(p.prompt.end(), prompt.begin(), prompt.end());
  p.chosen = tokenizer.encode(text("chosen"), false);
  p.rejected = tokenizer.encode(text("rejected"), false);
  if (tokenizer.eos_id() >= 0) {
    p.chosen.push_back(tokenizer.eos_id());
    p.rejected.push_back(tokenizer.eos_id());
  }
  return p;
}

}  // namespace

std::vector<PairIds> read_preference_text(const std::filesystem::path& file,
                                          const text::Tokenizer& tokenizer,
                                          const text::ChatTemplate* chat) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "{}: cannot open for reading", file.string());
  std::optional<text::ChatEncoder> encoder;
  if (chat) encoder.emplace(*chat, tokenizer);
  std::vector<PairIds> pairs;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + ", line " + std::to_string(number);
    const nlohmann::json row = parse_json(line, where);
    check(row.is_object() && row.contains("chosen") && row.contains("rejected"),
          "{}: a preference pair needs \"chosen\" and \"rejected\" (and \"prompt\", or "
          "conversations that share it)", where);
    const bool conversation = row["chosen"].is_array();
    check(!conversation || encoder, "{}: a conversational pair needs --chat-template", where);
    PairIds p = conversation ? conversational(row, *encoder, where) : plain(row, tokenizer, where);
    check(!p.prompt.empty() && !p.chosen.empty() && !p.rejected.empty(),
          "{}: the pair encodes to an empty prompt or answer", where);
    pairs.push_back(std::move(p));
  }
  return pairs;
}

}  // namespace longtron::data
