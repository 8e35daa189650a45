// `longtron render-chat`: conversations through a chat template, printed as the text a model is
// trained on (docs/sft.md). One JSON object {"text": …} per conversation on stdout; a
// conversation the template refuses is reported on stderr with its line and the template's
// message, and the exit status is then 1.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "cli/registry.h"
#include "core/error.h"
#include "text/chat_jinja.h"
#include "text/chat_template.h"

namespace longtron::cli {
namespace {

struct RenderChatOptions {
  std::string chat_template;
  std::string input;
  bool add_generation_prompt = false;
};

int run_render_chat(const RenderChatOptions& o) {
  const auto chat = text::load_chat_template(o.chat_template);
  const auto conversations = text::read_conversations(o.input);
  int refused = 0;
  for (const auto& c : conversations) {
    std::string text;
    try {
      if (chat.jinja) {
        text = text::render_jinja_chat(chat, c.messages, o.add_generation_prompt, c.where);
      } else {
        for (const auto& segment : text::chat_segments(chat, c.messages, o.add_generation_prompt, c.where))
          text += segment.text;
      }
    } catch (const Error& e) {
      fmt::print(stderr, "render-chat: {}\n", e.what());
      ++refused;
      continue;
    }
    const nlohmann::json row = {{"text", text}};
    fmt::print("{}\n", row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  std::fflush(stdout);
  fmt::print(stderr, "render-chat: {} of {} conversations rendered\n", conversations.size() - refused,
             conversations.size());
  return refused == 0 ? 0 : 1;
}

Subcommand render_chat_command(12, [](CLI::App& app) {
  auto o = std::make_shared<RenderChatOptions>();
  auto* sub = app.add_subcommand("render-chat", "Print conversations as a chat template renders them");
  sub->add_option("--chat-template", o->chat_template,
                  "internlm2 | chatml | llama2 | mistral | a model folder, its tokenizer_config.json "
                  "or a .jinja file | a template file (JSON)")->required();
  sub->add_option("--input", o->input, ".jsonl of conversations (as prepare --chat reads)")->required();
  sub->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "End each with the assistant's reply prefix (as generate --chat prompts)");
  return [o] { return run_render_chat(*o); };
});

}  // namespace
}  // namespace longtron::cli
