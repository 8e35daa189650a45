#include "train/config.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "model/families.h"
#include "model/hf_config.h"
#include "model/lora.h"
#include "train/preference.h"
#include "model/params.h"
#include "ops/precision.h"
#include "parallel/tp2d_overlap.h"
#include "train/config_binding.h"
#include "train/config_keys.h"

namespace longtron::train {
namespace fs = std::filesystem;

namespace {

/// The --set argument that gave `key` or one of its parents (e.g. "parallel.tensor=2" for
/// parallel.tensor.size), or nullptr.
const std::string* set_argument(const std::map<std::string, std::string>& set_by,
                                const std::string& key) {
  for (std::string k = key;; k = k.substr(0, k.rfind('.'))) {
    if (auto it = set_by.find(k); it != set_by.end()) return &it->second;
    if (k.find('.') == std::string::npos) return nullptr;
  }
}

/// Where a key came from, for messages: "FILE:LINE: key" or "--set key=value".
class Locator {
 public:
  Locator(std::string source, const std::map<std::string, std::string>& set_by)
      : source_(std::move(source)), set_by_(set_by) {}

  std::string at(const std::string& key, const toml::node* node) const {
    if (const std::string* arg = set_argument(set_by_, key)) return "--set " + *arg;
    const bool from_file = node && node->source().begin.line > 0;
    if (!from_file)  // a table that only a --set created (--set foo.bar=1 makes [foo])
      for (const auto& [k, arg] : set_by_)
        if (k.rfind(key + ".", 0) == 0) return "--set " + arg;
    if (from_file) return source_ + ":" + std::to_string(node->source().begin.line) + ": " + key;
    return source_ + ": " + key;
  }
  /// Without the line: "FILE: key" or "--set key=value" (as config_origin).
  std::string origin(const std::string& key) const {
    if (const std::string* arg = set_argument(set_by_, key)) return "--set " + *arg;
    return source_ + ": " + key;
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  const std::map<std::string, std::string>& set_by_;
};

/// Applies the TOML table `table` (at dotted `prefix`; "" for the root) to `c` through the key
/// table (config_keys.cpp): a listed key sets its member, a table of listed keys is walked (with
/// its own rule, config_tables()), anything else is an unknown key or section. Every full key
/// name present goes into `present`.
void apply(const toml::table& table, const std::string& prefix, TrainConfig& c, const Locator& loc,
           std::set<std::string>& present) {
  for (const auto& [k, node] : table) {
    const std::string full = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    const std::string at = loc.at(full, &node);
    const bool dotted = k.str().find('.') != std::string_view::npos;  // "a.b" = 1: one odd name
    if (dotted) {
      if (prefix.empty())
        fail("{}: unknown section (expected model, data, optimizer, lr_scheduler, parallel, "
             "train, lora or preference)", at);
      fail("{}: unknown key", at);
    }
    if (const ConfigKey* key = find_config_key(full)) {
      key->member->read(c, node, {at, loc.origin(full)});
    } else if (!is_config_key(full)) {
      if (prefix.empty())
        fail("{}: unknown section (expected model, data, optimizer, lr_scheduler, parallel, "
             "train, lora or preference)", at);
      fail("{}: unknown key", at);
    } else {
      const ConfigTable* rule = find_config_table(full);
      if (rule && rule->given) rule->given(c) = true;
      if (node.is_table())
        apply(*node.as_table(), full, c, loc, present);
      else if (rule && rule->sized && node.is_integer())  // parallel.tensor = N: {size = N}
        find_config_key(full + ".size")->member->read(c, node, {at, loc.origin(full)});
      else
        wrong_type(at, rule ? rule->expected : "a table", node);
    }
    present.insert(full);
  }
}

/// `--set a.b.c=value`: the value is TOML when "v = <value>" parses, else a bare string.
/// A value that TOML would read as an integer if it fitted in 64 bits (digits, sign, underscores).
bool looks_like_integer(const std::string& v) {
  static const std::regex integer(R"(\s*[+-]?[0-9][0-9_]*\s*)");
  return std::regex_match(v, integer);
}

void apply_override(toml::table& root, const std::string& item,
                    std::map<std::string, std::string>& set_by) {
  const auto eq = item.find('=');
  check(eq != std::string::npos && eq > 0, "--set {}: expected section.key=value", item);
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  const std::string key = trim(item.substr(0, eq));
  const std::string value = item.substr(eq + 1);
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t e = key.find('.', b);
    parts.push_back(key.substr(b, e == std::string::npos ? e : e - b));
    check(!parts.back().empty(), "--set {}: empty part in key '{}'", item, key);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  check(parts.size() >= 2, "--set {}: expected section.key=value (got no section)", item);
  toml::table* t = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* child = t->get(parts[i]);
    if (!child || !child->is_table()) {
      t->insert_or_assign(parts[i], toml::table{});
      child = t->get(parts[i]);
    }
    t = child->as_table();
  }
  try {
    toml::table parsed = toml::parse("v = " + value);
    t->insert_or_assign(parts.back(), std::move(*parsed.get("v")));
  } catch (const toml::parse_error&) {
    check(!looks_like_integer(value), "--set {}: integer out of range (at most {}, at least {})",
          item, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min());
    t->insert_or_assign(parts.back(), value);
  }
  set_by[key] = item;
}

/// parallel.tensor = N → {size = N}, so that a later --set parallel.tensor.mode keeps the size.
void normalize_parallel(toml::table& root) {
  toml::table* par = root["parallel"].as_table();
  if (!par) return;
  for (const char* sub : {"tensor", "weight", "zero1"}) {
    if (toml::node* n = par->get(sub); n && n->is_integer()) {
      const int64_t size = n->as_integer()->get();
      par->insert_or_assign(sub, toml::table{{"size", size}});
    }
  }
}

void require(const std::set<std::string>& present, const std::string& section,
             std::initializer_list<const char*> keys, const std::string& source) {
  for (const char* k : keys)
    check(present.count(section + "." + k), "{}: {}.{}: required key missing", source, section, k);
}

}  // namespace

TrainConfig parse_config(const std::string& toml_text, const std::string& source,
                         const std::vector<std::string>& overrides, const ConfigNeeds& needs) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    const std::string_view what = e.description();
    const bool too_big = what.find("not representable in 64 bits") != std::string_view::npos;
    fail("{}:{}:{}: {}{}", source, e.source().begin.line, e.source().begin.column, what,
         too_big ? " (integer out of range)" : "");
  }
  normalize_parallel(root);
  TrainConfig c;
  c.source = source;
  for (const auto& o : overrides) apply_override(root, o, c.set_by);
  const Locator loc(source, c.set_by);

  std::set<std::string> present;  // full key names, tables too
  apply(root, "", c, loc, present);
  for (const std::string& key : present)
    if (key.rfind("model.", 0) == 0) c.model_keys_given.insert(key.substr(6));
  c.preference_given = present.count("preference") > 0;
  if (!present.count("lr_scheduler.min_lr")) c.lr_scheduler.min_lr = 0.1 * c.optimizer.lr;
  if (needs.model_shape)
    require(present, "model", {"vocab_size", "hidden_size", "num_layers",
            "num_attention_heads", "num_kv_attention_heads"}, source);
  if (needs.data) require(present, "data", {"train_folder", "seq_len", "micro_bsz"}, source);
  if (needs.total_steps) require(present, "train", {"total_steps"}, source);
  check_config(c, needs);
  return c;
}

TrainConfig load_config(const fs::path& path, const std::vector<std::string>& overrides,
                        const ConfigNeeds& needs) {
  std::ifstream in(path);
  check(in.good(), "{}: cannot open config file", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path.string(), overrides, needs);
}

void check_model_config(const model::ModelConfig& m) {
  model::check_model_type(m.type, "model.type");
  check(m.sliding_window >= 0, "model.sliding_window: must be >= 0, got {}", m.sliding_window);
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", m.vocab_size}, {"hidden_size", m.hidden_size}, {"num_layers", m.num_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_kv_attention_heads", m.num_kv_attention_heads}, {"multiple_of", m.multiple_of},
      {"chunk_tokens", m.chunk_tokens}};
  for (const auto& [k, v] : positive) check(v > 0, "model.{}: must be > 0, got {}", k, v);
  check(m.explicit_head_dim > 0 || m.hidden_size % m.num_attention_heads == 0,
        "model.num_attention_heads: {} does not divide model.hidden_size {}", m.num_attention_heads,
        m.hidden_size);
  check(m.num_attention_heads % m.num_kv_attention_heads == 0,
        "model.num_kv_attention_heads: {} does not divide model.num_attention_heads {}",
        m.num_kv_attention_heads, m.num_attention_heads);
  check(m.mlp_ratio > 0, "model.mlp_ratio: must be > 0, got {}", m.mlp_ratio);
  check(m.norm_eps > 0 && std::isfinite(m.norm_eps), "model.norm_eps: must be finite and > 0, got {}",
        m.norm_eps);
  check(m.rope_base > 0 && std::isfinite(m.rope_base),
        "model.rope_base: must be finite and > 0, got {}", m.rope_base);
  check(m.explicit_head_dim >= 0, "model.head_dim: must be >= 0, got {}", m.explicit_head_dim);
  check(m.sliding_window == 0 || model::family(m.type, "model.type").block.windows !=
                                     model::WindowKeys::kNone,
        "model.sliding_window: {} needs model.type = {} (the families whose config.json has a "
        "window), got \"{}\"", m.sliding_window, model::or_list(model::window_families(), true),
        m.type);
  check(m.window_layers.empty() || int64_t(m.window_layers.size()) == m.num_layers,
        "model.sliding_window: the window is given for {} layers, the model has {}",
        m.window_layers.size(), m.num_layers);
  model::check_model_limits(m);
  try {  // what the family's config.json cannot say (e.g. a Qwen2 without q/k/v bias); last, as
         // it computes the FFN width from the checked sizes
    (void)model::to_hf_config(m);
  } catch (const Error& e) {
    fail("model.type: {}", e.what());
  }
}

std::string config_origin(const TrainConfig& c, const std::string& key) {
  if (const std::string* arg = set_argument(c.set_by, key)) return "--set " + *arg;
  return c.source + ": " + key;
}

// More threads per rank than any machine has cores; a larger count is a typo (and overflows the
// int that OpenMP and the BLAS take).
constexpr int64_t kMaxThreads = 4096;

void check_config(const TrainConfig& c, const ConfigNeeds& needs) {
  auto at = [&](const std::string& key) { return config_origin(c, key); };
  if (needs.model_shape) {
    try {
      check_model_config(c.model);
    } catch (const Error& e) {
      const std::string message = e.what();  // "model.<key>: ..."
      const std::string key = message.substr(0, message.find(':'));
      if (set_argument(c.set_by, key)) fail("{}: {}", at(key), message.substr(key.size() + 2));
      fail("{}: {}", c.source, message);
    }
  }
  const auto& d = c.data;
  auto positive = [&](const char* key, int64_t v) { check(v > 0, "{}: must be > 0, got {}", at(key), v); };
  auto non_negative = [&](const char* key, double v) {
    check(v >= 0, "{}: must be >= 0, got {}", at(key), v);
  };
  if (needs.data) {
    positive("data.seq_len", d.seq_len);
    positive("data.micro_bsz", d.micro_bsz);
  }
  positive("data.micro_num", d.micro_num);
  non_negative("data.min_length", double(d.min_length));
  check(d.seed >= 0 && d.seed <= 0xffffffffLL, "{}: must be in [0, 2^32), got {}", at("data.seed"),
        d.seed);  // the shuffles' generator takes 32 bits: a larger seed would alias a smaller one
  positive("data.balance_window", d.balance_window);
  if (!d.balance_cost.empty()) {
    const auto& b = d.balance_cost;
    check(b.size() == 2 && std::isfinite(b[0]) && std::isfinite(b[1]) && b[0] >= 0 && b[1] >= 0 &&
              (b[0] > 0 || b[1] > 0),
          "{}: expected [cost per token, cost per causal pair], two finite numbers >= 0 and not "
          "both 0, got [{}]", at("data.balance_cost"), fmt::join(b, ", "));
  }
  if (d.balance == data::BalanceMode::kDocuments) {
    const std::string who = set_argument(c.set_by, "data.balance") ? at("data.balance") : c.source;
    check(d.use_packed_dataset, "{}: data.balance = \"documents\" packs documents into rows: it needs "
          "data.use_packed_dataset = true (use data.balance = \"rows\" with unpacked rows)",
          who);
    check(!d.pack_sample_into_one, "{}: data.balance = \"documents\" cannot be combined with "
          "data.pack_sample_into_one = true (attention there ignores documents)", who);
    check(d.split_documents, "{}: data.balance = \"documents\" cuts documents at row edges: it needs "
          "data.split_documents = true", who);
  }

  const auto& o = c.optimizer;
  check(o.lr > 0 && std::isfinite(o.lr), "{}: must be finite and > 0, got {}", at("optimizer.lr"), o.lr);
  check(o.beta1 >= 0 && o.beta1 < 1, "{}: must be in [0, 1), got {}", at("optimizer.beta1"), o.beta1);
  check(o.beta2 >= 0 && o.beta2 < 1, "{}: must be in [0, 1), got {}", at("optimizer.beta2"), o.beta2);
  check(o.eps > 0 && std::isfinite(o.eps), "{}: must be finite and > 0, got {}", at("optimizer.eps"),
        o.eps);
  check(o.weight_decay >= 0 && std::isfinite(o.weight_decay), "{}: must be finite and >= 0, got {}",
        at("optimizer.weight_decay"), o.weight_decay);
  check(!std::isnan(o.clip_grad_norm), "{}: must be a number (<= 0: no clipping), got nan",
        at("optimizer.clip_grad_norm"));
  const auto& l = c.lr_scheduler;
  non_negative("lr_scheduler.warmup_steps", double(l.warmup_steps));
  check(l.min_lr >= 0 && l.min_lr <= o.lr, "{}: must be in [0, optimizer.lr = {}], got {}",
        at("lr_scheduler.min_lr"), o.lr, l.min_lr);

  const model::LoraConfig& lora = c.model.lora;
  non_negative("lora.rank", double(lora.rank));
  check(lora.dropout >= 0 && lora.dropout < 1, "{}: must be in [0, 1), got {}", at("lora.dropout"),
        lora.dropout);
  check(std::isfinite(lora.alpha) && lora.alpha > 0, "{}: must be finite and > 0, got {}",
        at("lora.alpha"), lora.alpha);
  non_negative("lora.seed", double(lora.seed));
  if (lora.enabled() && needs.model_shape) {  // the family is known (else checked once read)
    try {
      model::lora_resolve_targets(c.model.type, lora.targets);
    } catch (const Error& e) {
      fail("{}: {}", at("lora.targets"), std::string(e.what()).substr(std::string("lora.targets: ").size()));
    }
  }

  check_preference_config(c.preference);  // its messages name the preference.* key

  const auto& p = c.parallel;
  positive("parallel.tensor.size", p.tensor.size);
  positive("parallel.weight.size", p.weight.size);
  check(p.zero1.size == -1 || p.zero1.size >= 1, "{}: must be -1 or >= 1, got {}",
        at("parallel.zero1.size"), p.zero1.size);
  positive("parallel.tensor_2d.x", p.tensor_2d.x);
  positive("parallel.tensor_2d.y", p.tensor_2d.y);
  const auto& q = p.sequence_2d;
  positive("parallel.sequence_2D.head_size", q.head_size);
  positive("parallel.sequence_2D.context_size", q.context_size);
  positive("parallel.sequence_2D.window_size", q.window_size);
  // A rule between several keys blames the first of them given by --set, else the section in
  // the file (a --set error never names a file the keys are not in).
  auto at_set = [&](std::initializer_list<const char*> keys, const char* section) {
    for (const char* key : keys)
      if (set_argument(c.set_by, key)) return at(key);
    return at(section);
  };
  if (q.enable) {  // InternEvo's rules, before any work (the layout checks them again)
    check(p.tensor.mode == parallel::TensorMode::kIsp,
          "{}: 2D-Attention needs parallel.tensor.mode = \"isp\", got \"{}\"",
          at("parallel.sequence_2D.enable"), parallel::tensor_mode_name(p.tensor.mode));
    check(q.head_size * q.context_size == p.tensor.size,
          "{}: head_size ({}) x context_size ({}) must equal parallel.tensor.size ({})",
          at_set({"parallel.sequence_2D.context_size", "parallel.sequence_2D.head_size",
                  "parallel.tensor.size"}, "parallel.sequence_2D"),
          q.head_size, q.context_size, p.tensor.size);
    check(q.context_size % q.window_size == 0, "{}: window_size ({}) must divide context_size ({})",
          at("parallel.sequence_2D.window_size"), q.window_size, q.context_size);
    check(!(q.head_first && q.head_size > 1 && q.interleaved),
          "{}: interleaved = true needs head_first = false when head_size ({}) > 1",
          at_set({"parallel.sequence_2D.device_placement_strategy.interleaved",
                  "parallel.sequence_2D.device_placement_strategy.head_first",
                  "parallel.sequence_2D.head_size"},
                 "parallel.sequence_2D.device_placement_strategy"),
          q.head_size);
  }
  check(!(p.tensor.size > 1 && p.tensor_2d.given), "{}: cannot be combined with "
        "parallel.tensor.size = {} (use one form of tensor parallelism)", at("parallel.tensor_2d"),
        p.tensor.size);

  const auto& t = c.train;
  if (needs.total_steps) positive("train.total_steps", t.total_steps);
  // warmup_steps > total_steps is well defined (the run ends inside the warmup, as PyTorch's and
  // Megatron-LM's schedulers allow); the trainer says so at start-up.
  non_negative("train.seed", double(t.seed));
  check(t.num_threads >= 0 && t.num_threads <= kMaxThreads, "{}: must be in [0, {}], got {}",
        at("train.num_threads"), kMaxThreads, t.num_threads);
  positive("train.log_every", t.log_every);
  non_negative("train.valid_every", double(t.valid_every));
  non_negative("train.save_every", double(t.save_every));
  positive("train.max_skipped_steps", t.max_skipped_steps);
}

namespace {

/// Whether to_json writes `key`: not when it is in a table written only once given.
bool written(const TrainConfig& c, const std::string& key) {
  for (const ConfigTable& t : config_tables())
    if (t.written_when_given && key.rfind(std::string(t.key) + ".", 0) == 0)
      return t.given(const_cast<TrainConfig&>(c));
  return true;
}

/// The dotted parts of a key ("parallel.tensor.size" → parallel, tensor, size).
std::vector<std::string> key_parts(const std::string& key) {
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t e = key.find('.', b);
    parts.push_back(key.substr(b, e == std::string::npos ? e : e - b));
    if (e == std::string::npos) return parts;
    b = e + 1;
  }
}

}  // namespace

nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const ConfigKey& k : config_keys()) {
    if (!written(c, k.key)) continue;
    const std::vector<std::string> parts = key_parts(k.key);
    nlohmann::json* at = &j;
    for (size_t i = 0; i + 1 < parts.size(); ++i) at = &(*at)[parts[i]];
    (*at)[parts.back()] = k.member->write(c);
  }
  return j;
}

TrainConfig saved_train_config(const nlohmann::json& saved) {
  TrainConfig c;
  for (const ConfigKey& k : config_keys()) {
    const nlohmann::json* at = &saved;
    for (const std::string& part : key_parts(k.key)) {
      at = at->is_object() && at->contains(part) ? &(*at)[part] : nullptr;
      if (at == nullptr) break;
    }
    if (at != nullptr) k.member->read_json(c, *at);
  }
  for (const ConfigTable& t : config_tables()) {
    if (!t.given) continue;
    const nlohmann::json* at = &saved;
    for (const std::string& part : key_parts(t.key)) {
      at = at->is_object() && at->contains(part) ? &(*at)[part] : nullptr;
      if (at == nullptr) break;
    }
    if (at != nullptr && at->is_object()) t.given(c) = true;
  }
  return c;
}

parallel::Layout layout_of(const ParallelConfig& p) {
  parallel::Layout l;
  l.tensor_size = static_cast<int>(p.tensor.size);
  l.tensor_mode = p.tensor.mode;
  l.weight_size = static_cast<int>(p.weight.size);
  l.weight_overlap = p.weight.overlap;
  l.zero1_size = static_cast<int>(p.zero1.size);
  if (p.tensor_2d.given) {
    l.tensor_2d_x = static_cast<int>(p.tensor_2d.x);
    l.tensor_2d_y = static_cast<int>(p.tensor_2d.y);
    l.tensor_2d_overlap = parallel::overlap_2d_name(p.tensor_2d.overlap);
  }
  if (p.sequence_2d.enable) {
    const auto& q = p.sequence_2d;
    l.seq2d = true;
    l.seq2d_head = static_cast<int>(q.head_size);
    l.seq2d_context = static_cast<int>(q.context_size);
    l.seq2d_window = static_cast<int>(q.window_size);
    l.seq2d_head_first = q.head_first;
    l.seq2d_interleaved = q.interleaved;
    l.seq2d_balance = q.balance;
  }
  return l;
}

}  // namespace longtron::train
