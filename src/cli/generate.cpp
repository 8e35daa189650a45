// `longtron generate`: text from a checkpoint and a prompt (README, "Commands"). Greedy by default;
// with --temperature > 0, nucleus (top-p) sampling (Holtzman et al. 2020) from a seeded generator.
// The tokenizer is the checkpoint's tokenizer.model or tokenizer.json (text/tokenizer.h);
// --prompt-ids takes and prints token ids instead of text.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/json_read.h"
#include "ops/threads.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/model_io.h"

namespace longtron::cli {
namespace {

struct GenerateOptions {
  std::string checkpoint, prompt;
  std::string prompt_ids;      // "1,2,3": token ids in, token ids out (no tokenizer)
  bool use_prompt_ids = false;  // --prompt-ids was given (even as "", which is then an error)
  int64_t max_new_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  uint64_t seed = 0;
  ComputeOptions compute;
  bool chat = false;           // the prompt is a user message of this chat template
  std::string chat_template, system;
};

/// The next token: argmax (temperature 0), else a draw from the smallest set of most likely tokens
/// whose probability reaches top_p, after softmax(logits / temperature).
int32_t pick(const std::vector<float>& logits, const GenerateOptions& o, std::mt19937_64& rng) {
  if (o.temperature <= 0.0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp((logits[i] - top) / o.temperature);
  std::vector<int32_t> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  double mass = 0;
  size_t keep = 0;
  while (keep < ids.size() && (keep == 0 || mass < o.top_p * z)) mass += p[ids[keep++]];
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng);
  for (size_t k = 0; k < keep; ++k)
    if ((r -= p[ids[k]]) <= 0) return ids[k];
  return ids[keep - 1];
}

/// The ids of "--prompt-ids 1,2,3" (commas, optional spaces), each in [0, vocab).
std::vector<int32_t> parse_prompt_ids(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, end - at);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(!item.empty() && used == item.size(),
          "generate: --prompt-ids \"{}\": \"{}\" is not a token id (expected e.g. 1,2,3)", text, item);
    check(id >= 0 && id < vocab, "generate: --prompt-ids: token id {} is outside the vocabulary [0, {})",
          id, vocab);
    ids.push_back(static_cast<int32_t>(id));
    at = end + 1;
  }
  return ids;
}

/// The eos_token_id (an id or a list of ids) of config.json (kept in ModelConfig::hf_extra) and of
/// generation_config.json beside it (or beside a LoRA step's base), where Transformers'
/// GenerationConfig takes the ids generate() stops at (Llama 3.1 Instruct lists three there); none
/// when neither states one.
std::vector<int32_t> model_eos_ids(const train::LoadedModel& m) {
  std::vector<int32_t> out;
  const auto add = [&out](const nlohmann::json& j) {
    if (!j.is_object() || !j.contains("eos_token_id")) return;
    const auto& e = j["eos_token_id"];
    for (const auto& v : e.is_array() ? e : nlohmann::json::array({e}))
      if (v.is_number_integer() && std::find(out.begin(), out.end(), v.get<int32_t>()) == out.end())
        out.push_back(v.get<int32_t>());
  };
  const model::ModelConfig& c = m.layout->config();
  if (!c.hf_extra.empty()) add(parse_json(c.hf_extra, "config.json's extra keys"));
  for (const std::filesystem::path& dir : {m.dir, m.lora_base}) {
    const std::filesystem::path g = dir / "generation_config.json";
    if (!dir.empty() && std::filesystem::exists(g)) {
      add(read_json_file(g));
      break;
    }
  }
  return out;
}

/// The decode loop: appends up to --max-new-tokens picked tokens to `ids` (the prompt), ending
/// before the first token in `stop` (which is not appended).
void decode(const GenerateOptions& o, parallel::ParallelEngine& engine, std::vector<int32_t>& ids,
            const std::vector<int32_t>& stop) {
  std::mt19937_64 rng(o.seed);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int32_t next = pick(engine.model().logits_last(ids), o, rng);
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
    ids.push_back(next);
  }
}

/// --prompt-ids: greedy or sampled ids until an eos id of the model's folder (model_eos_ids);
/// prints the prompt's and the new ids, comma-separated (as --prompt-ids takes them).
int generate_ids(const GenerateOptions& o, parallel::ParallelEngine& engine,
                 const std::vector<int32_t>& eos) {
  std::vector<int32_t> ids = parse_prompt_ids(o.prompt_ids, engine.full_layout().config().vocab_size);
  const size_t prompt_len = ids.size();
  decode(o, engine, ids, eos);
  fmt::print("{}\n", fmt::join(ids, ","));
  std::fflush(stdout);
  fmt::print(stderr, "generate: {} prompt tokens, {} new\n", prompt_len, ids.size() - prompt_len);
  return 0;
}

int run_generate(const GenerateOptions& o) {
  check(o.max_new_tokens >= 0, "generate: --max-new-tokens must be >= 0, got {}", o.max_new_tokens);
  check(o.top_p > 0 && o.top_p <= 1, "generate: --top-p must be in (0, 1], got {}", o.top_p);
  // NaN would compare false everywhere and inf divides every logit to 0 or NaN; a negative value
  // (once read as greedy) is refused too, so that a typo is not taken for a choice.
  check(std::isfinite(o.temperature) && o.temperature >= 0,
        "generate: --temperature must be a finite number >= 0 (0 = greedy), got {}", o.temperature);
  set_num_threads(o.compute.threads);
  train::LoadedModel m = train::load_model_dir(o.checkpoint, /*read_weights=*/false);
  const std::vector<int32_t> eos = model_eos_ids(m);
  const ops::ComputeType compute = train::loaded_compute_type(m, o.compute.dtype);
  // One process: the engine's dense mode (the one way into the model).
  const auto engine = train::load_into_engine(
      m, parallel::make_grid(comm::make_local_communicator(), parallel::Layout{}));
  engine->set_compute_type(compute);
  // No bf16 weight copy: each GEMM rounds its weight (the forward pass's memory plan).
  engine->compute().weights().attach(nullptr, 0);
  check(!o.use_prompt_ids || !o.chat, "generate: --chat takes --prompt, not --prompt-ids");
  if (o.use_prompt_ids) return generate_ids(o, *engine, eos);
  check(!m.tokenizer.empty(),
        "generate: no tokenizer.json or tokenizer.model in {} or next to its training data "
        "(--prompt-ids takes and prints token ids without one)", m.dir.string());
  const text::Tokenizer tok = [&] {
    try {
      return text::Tokenizer::load(m.tokenizer);
    } catch (const Error& e) {
      fail("generate: {} (--prompt-ids takes and prints token ids without a tokenizer)", e.what());
    }
  }();
  std::vector<int32_t> ids;
  std::vector<int32_t> stop = {tok.eos_id()};
  if (o.chat) {  // the template's reply prompt; the answer ends at its end-of-turn token
    check(!o.chat_template.empty(), "generate: --chat needs --chat-template NAME|FILE");
    const auto chat = text::load_chat_template(o.chat_template);
    const text::ChatEncoder encoder(chat, tok);
    text::Conversation c;
    if (!o.system.empty()) c.push_back({text::ChatMessage::Role::kSystem, o.system});
    c.push_back({text::ChatMessage::Role::kUser, o.prompt});
    ids = encoder.encode_prompt(c);
    stop = {encoder.end_of_turn_id()};
    if (chat.jinja) {  // a model's own template: also its eos_token and the folder's eos ids
      stop = encoder.stop_ids();
      for (const int32_t id : eos) stop.push_back(id);
      check(!stop.empty(), "generate: the chat template {} names no end-of-turn or eos_token in the "
            "vocabulary and neither config.json nor generation_config.json has an eos_token_id: "
            "nothing would end the reply", chat.name);
    }
  } else {
    ids = tok.encode(o.prompt, /*bos_eos=*/false);
    if (tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
  }
  check(!ids.empty(), "generate: empty prompt and the tokenizer has no BOS");
  const size_t prompt_len = ids.size();
  decode(o, *engine, ids, stop);
  // Decoding the whole sequence keeps word-boundary spaces right at the seam;
  // a chat prints only the answer.
  fmt::print("{}\n", o.chat ? tok.decode({ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end()})
                            : tok.decode(ids));
  std::fflush(stdout);
  fmt::print(stderr, "generate: {} prompt tokens, {} new\n", prompt_len, ids.size() - prompt_len);
  return 0;
}

Subcommand generate_command(help_order::kGenerate, [](CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "Generate text from a checkpoint");
  add_checkpoint_option(*sub, o->checkpoint);
  auto* prompt = sub->add_option("--prompt", o->prompt, "Prompt text");
  auto* ids = sub->add_option("--prompt-ids", o->prompt_ids,
                              "Prompt token ids, e.g. 1,2,3 (no tokenizer needed; prints the ids "
                              "of the prompt and of the new tokens; stops at the eos_token_id of "
                              "config.json or generation_config.json)");
  prompt->excludes(ids);
  sub->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate (default 64)");
  sub->add_option("--temperature", o->temperature, "0 = greedy (default); > 0 samples; finite, >= 0");
  sub->add_option("--top-p", o->top_p, "Nucleus sampling mass (default 1)");
  sub->add_option("--seed", o->seed, "Sampling seed (default 0)");
  add_compute_options(*sub, o->compute);
  sub->add_flag("--chat", o->chat, "The prompt is a user message: apply --chat-template, stop at "
                "its end-of-turn token, print the answer");
  sub->add_option("--chat-template", o->chat_template,
                  "internlm2 | chatml | llama2 | mistral | a model folder, tokenizer_config.json or "
                  ".jinja file | a template file (with --chat)");
  sub->add_option("--system", o->system, "System message (with --chat)");
  return [o, prompt, ids] {
    check(prompt->count() + ids->count() > 0, "generate: --prompt or --prompt-ids is required");
    o->use_prompt_ids = ids->count() > 0;
    return run_generate(*o);
  };
});

}  // namespace
}  // namespace longtron::cli
