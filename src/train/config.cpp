#include "train/config.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "model/hf_config.h"
#include "model/params.h"
#include "ops/precision.h"
#include "parallel/tp2d_overlap.h"
#include "train/config_keys.h"

namespace longtron::train {
namespace fs = std::filesystem;

namespace {

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

std::string node_text(const toml::node& n) {
  std::ostringstream s;
  n.visit([&](const auto& v) { s << v; });
  return s.str();
}

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
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  const std::map<std::string, std::string>& set_by_;
};

using Setter = std::function<void(const toml::node&, const std::string& where)>;
using Schema = std::map<std::string, Setter>;

[[noreturn]] void wrong_type(const std::string& where, const char* want, const toml::node& n) {
  fail("{}: expected {}, got {} ({})", where, want, type_name(n), node_text(n));
}

Setter int_key(int64_t& out) {
  return [&out](const toml::node& n, const std::string& where) {
    if (!n.is_integer()) wrong_type(where, "an integer", n);
    out = n.as_integer()->get();
  };
}

Setter double_key(double& out, bool allow_fraction = false) {
  return [&out, allow_fraction](const toml::node& n, const std::string& where) {
    if (n.is_integer()) {
      out = double(n.as_integer()->get());
    } else if (n.is_floating_point()) {
      out = n.as_floating_point()->get();
    } else if (allow_fraction && n.is_string()) {  // mlp_ratio = "8/3" (TOML has no fractions)
      const std::string s = n.as_string()->get();
      double a = 0, b = 0;
      char slash = 0, extra = 0;
      std::istringstream in(s);
      if (!(in >> a >> slash >> b) || slash != '/' || b == 0 || (in >> extra))
        fail("{}: expected a number or a fraction like \"8/3\", got \"{}\"", where, s);
      out = a / b;
    } else {
      wrong_type(where, "a number", n);
    }
  };
}

Setter bool_key(bool& out) {
  return [&out](const toml::node& n, const std::string& where) {
    if (!n.is_boolean()) wrong_type(where, "true or false", n);
    out = n.as_boolean()->get();
  };
}

Setter string_key(std::string& out) {
  return [&out](const toml::node& n, const std::string& where) {
    if (!n.is_string()) wrong_type(where, "a string", n);
    out = n.as_string()->get();
  };
}

/// model.dtype: one of ops::canonical_dtype's spellings, stored canonical.
Setter dtype_key(std::string& out) {
  return [&out](const toml::node& n, const std::string& where) {
    if (!n.is_string()) wrong_type(where, "a string", n);
    out = ops::canonical_dtype(n.as_string()->get());
    check(!out.empty(), "{}: \"{}\" is not one of float32 | bfloat16 | auto (or torch.float32 | "
          "torch.bfloat16)", where, n.as_string()->get());
  };
}

/// An array of numbers (integers or floats), e.g. data.balance_cost = [1.0, 0.5].
Setter numbers_key(std::vector<double>& out) {
  return [&out](const toml::node& n, const std::string& where) {
    if (!n.is_array()) wrong_type(where, "an array of numbers", n);
    out.clear();
    for (const toml::node& e : *n.as_array()) {
      if (e.is_integer())
        out.push_back(double(e.as_integer()->get()));
      else if (e.is_floating_point())
        out.push_back(e.as_floating_point()->get());
      else
        wrong_type(where, "an array of numbers", n);
    }
  };
}

/// Relative paths resolve from the working directory (docs/configuration.md).
Setter path_key(std::string& out) {
  return [&out](const toml::node& n, const std::string& where) {
    if (!n.is_string()) wrong_type(where, "a path string", n);
    const std::string s = n.as_string()->get();
    out = s.empty() ? s : fs::absolute(s).lexically_normal().string();
  };
}

/// Applies `schema` to every key of `table` (unknown keys are errors), returns the keys present.
std::set<std::string> apply(const toml::table& table, const std::string& prefix, const Schema& schema,
                            const Locator& loc) {
  std::set<std::string> present;
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    const std::string full = prefix + "." + key;
    auto it = schema.find(key);
    // The key table (config_keys.cpp) decides which names exist; the schema only binds them.
    const bool listed = is_config_key(full);
    if (it == schema.end() && !listed) fail("{}: unknown key", loc.at(full, &node));
    if (it == schema.end() || !listed)
      fail("{}: internal error: the key is {} (src/train/config_keys.cpp lists every key that "
           "parse_config binds; add it to both and regenerate docs/configuration.md)",
           loc.at(full, &node), listed ? "in the key table but not bound by the parser"
                                       : "bound by the parser but missing from the key table");
    it->second(node, loc.at(full, &node));
    present.insert(key);
  }
  return present;
}

/// A parallel sub-table that may also be a bare integer meaning {size = N}.
Setter sized_table(Schema schema, int64_t& size, bool* given, const Locator& loc, std::string full) {
  return [schema = std::move(schema), &size, given, &loc, full](const toml::node& n,
                                                                const std::string& where) {
    if (given) *given = true;
    if (n.is_integer()) {
      size = n.as_integer()->get();
    } else if (n.is_table()) {
      apply(*n.as_table(), full, schema, loc);
    } else {
      wrong_type(where, "an integer size or a table", n);
    }
  };
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
    check(present.count(k), "{}: {}.{}: required key missing", source, section, k);
}

/// `where` is config_origin(config, key).
void check_in(const std::string& where, const std::string& v, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : " | ") + a;
  fail("{}: \"{}\" is not one of {}", where, v, list);
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

  auto& m = c.model;
  auto& d = c.data;
  auto& o = c.optimizer;
  auto& p = c.parallel;
  auto& t = c.train;
  const Schema model = {
      {"type", string_key(m.type)},
      {"vocab_size", int_key(m.vocab_size)}, {"hidden_size", int_key(m.hidden_size)},
      {"num_layers", int_key(m.num_layers)}, {"num_attention_heads", int_key(m.num_attention_heads)},
      {"num_kv_attention_heads", int_key(m.num_kv_attention_heads)},
      {"head_dim", int_key(m.explicit_head_dim)},
      {"sliding_window", int_key(m.sliding_window)},
      {"mlp_ratio", double_key(m.mlp_ratio, true)}, {"multiple_of", int_key(m.multiple_of)},
      {"norm_eps", double_key(m.norm_eps)}, {"rope_base", double_key(m.rope_base)},
      {"qkv_bias", bool_key(m.qkv_bias)}, {"o_bias", bool_key(m.o_bias)},
      {"mlp_bias", bool_key(m.mlp_bias)},
      {"tie_word_embeddings", bool_key(m.tie_word_embeddings)},
      {"checkpoint", bool_key(m.checkpoint)}, {"dtype", dtype_key(m.dtype)}};
  const Schema data = {
      {"train_folder", path_key(d.train_folder)}, {"valid_folder", path_key(d.valid_folder)},
      {"seq_len", int_key(d.seq_len)}, {"micro_bsz", int_key(d.micro_bsz)},
      {"micro_num", int_key(d.micro_num)}, {"use_packed_dataset", bool_key(d.use_packed_dataset)},
      {"pack_sample_into_one", bool_key(d.pack_sample_into_one)},
      {"pack_tail", string_key(d.pack_tail)}, {"shuffle", bool_key(d.shuffle)},
      {"seed", int_key(d.seed)}, {"min_length", int_key(d.min_length)},
      {"split_documents", bool_key(d.split_documents)}, {"balance", string_key(d.balance)},
      {"balance_window", int_key(d.balance_window)}, {"balance_cost", numbers_key(d.balance_cost)}};
  const Schema optimizer = {
      {"lr", double_key(o.lr)}, {"beta1", double_key(o.beta1)}, {"beta2", double_key(o.beta2)},
      {"eps", double_key(o.eps)}, {"weight_decay", double_key(o.weight_decay)},
      {"clip_grad_norm", double_key(o.clip_grad_norm)}};
  const Schema scheduler = {{"warmup_steps", int_key(c.lr_scheduler.warmup_steps)},
                            {"min_lr", double_key(c.lr_scheduler.min_lr)}};
  const Schema parallel = {
      {"tensor", sized_table({{"size", int_key(p.tensor.size)}, {"mode", string_key(p.tensor.mode)}},
                             p.tensor.size, &p.tensor_given, loc, "parallel.tensor")},
      {"weight", sized_table({{"size", int_key(p.weight.size)}, {"overlap", bool_key(p.weight.overlap)}},
                             p.weight.size, nullptr, loc, "parallel.weight")},
      {"zero1", sized_table({{"size", int_key(p.zero1.size)}}, p.zero1.size, nullptr, loc,
                            "parallel.zero1")},
      {"tensor_2d", [&](const toml::node& n, const std::string& where) {
         if (!n.is_table()) wrong_type(where, "a table {x, y, overlap}", n);
         p.tensor_2d.given = true;
         apply(*n.as_table(), "parallel.tensor_2d",
               {{"x", int_key(p.tensor_2d.x)}, {"y", int_key(p.tensor_2d.y)},
                {"overlap", string_key(p.tensor_2d.overlap)}}, loc);
       }},
      {"sequence_2D", [&](const toml::node& n, const std::string& where) {
         if (!n.is_table()) wrong_type(where, "a table {enable, head_size, context_size, ...}", n);
         auto& q = p.sequence_2d;
         q.given = true;
         apply(*n.as_table(), "parallel.sequence_2D",
               {{"enable", bool_key(q.enable)}, {"head_size", int_key(q.head_size)},
                {"context_size", int_key(q.context_size)},
                {"window_size", int_key(q.window_size)}, {"balance", string_key(q.balance)},
                {"device_placement_strategy",
                 [&](const toml::node& d, const std::string& at) {
                   if (!d.is_table()) wrong_type(at, "a table {head_first, interleaved}", d);
                   apply(*d.as_table(), "parallel.sequence_2D.device_placement_strategy",
                         {{"head_first", bool_key(q.head_first)},
                          {"interleaved", bool_key(q.interleaved)}},
                         loc);
                 }}},
               loc);
       }}};
  const Schema train = {
      {"total_steps", int_key(t.total_steps)}, {"seed", int_key(t.seed)},
      {"num_threads", int_key(t.num_threads)}, {"log_every", int_key(t.log_every)},
      {"valid_every", int_key(t.valid_every)}, {"save_every", int_key(t.save_every)},
      {"checkpoint_dir", path_key(t.checkpoint_dir)}, {"metrics_file", path_key(t.metrics_file)},
      {"loss_reduction", string_key(t.loss_reduction)},
      {"max_skipped_steps", int_key(t.max_skipped_steps)}};
  const std::map<std::string, const Schema*> sections = {
      {"model", &model}, {"data", &data}, {"optimizer", &optimizer},
      {"lr_scheduler", &scheduler}, {"parallel", &parallel}, {"train", &train}};

  std::map<std::string, std::set<std::string>> present;
  for (const auto& [k, node] : root) {
    const std::string key(k.str());
    auto it = sections.find(key);
    if (it == sections.end())
      fail("{}: unknown section (expected model, data, optimizer, lr_scheduler, parallel or train)",
           loc.at(key, &node));
    if (!node.is_table()) wrong_type(loc.at(key, &node), "a table", node);
    present[key] = apply(*node.as_table(), key, *it->second, loc);
  }
  c.model_keys_given = present["model"];
  if (!present["lr_scheduler"].count("min_lr")) c.lr_scheduler.min_lr = 0.1 * o.lr;
  if (needs.model_shape)
    require(present["model"], "model", {"vocab_size", "hidden_size", "num_layers",
            "num_attention_heads", "num_kv_attention_heads"}, source);
  if (needs.data) require(present["data"], "data", {"train_folder", "seq_len", "micro_bsz"}, source);
  if (needs.total_steps) require(present["train"], "train", {"total_steps"}, source);
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
      {"num_kv_attention_heads", m.num_kv_attention_heads}, {"multiple_of", m.multiple_of}};
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
  check(m.sliding_window == 0 || m.type == "mistral" || m.type == "qwen2",
        "model.sliding_window: {} needs model.type = \"mistral\" or \"qwen2\" (the families whose "
        "config.json has a window), got \"{}\"", m.sliding_window, m.type);
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
  check_in(at("data.pack_tail"), d.pack_tail, {"pad", "drop"});
  check_in(at("data.balance"), d.balance, {"none", "rows", "documents"});
  positive("data.balance_window", d.balance_window);
  if (!d.balance_cost.empty()) {
    const auto& b = d.balance_cost;
    check(b.size() == 2 && std::isfinite(b[0]) && std::isfinite(b[1]) && b[0] >= 0 && b[1] >= 0 &&
              (b[0] > 0 || b[1] > 0),
          "{}: expected [cost per token, cost per causal pair], two finite numbers >= 0 and not "
          "both 0, got [{}]", at("data.balance_cost"), fmt::join(b, ", "));
  }
  if (d.balance == "documents") {
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

  const auto& p = c.parallel;
  positive("parallel.tensor.size", p.tensor.size);
  check_in(at("parallel.tensor.mode"), p.tensor.mode, {"mtp", "msp", "fsp", "isp"});
  positive("parallel.weight.size", p.weight.size);
  check(p.zero1.size == -1 || p.zero1.size >= 1, "{}: must be -1 or >= 1, got {}",
        at("parallel.zero1.size"), p.zero1.size);
  positive("parallel.tensor_2d.x", p.tensor_2d.x);
  positive("parallel.tensor_2d.y", p.tensor_2d.y);
  check_in(at("parallel.tensor_2d.overlap"), p.tensor_2d.overlap,
           parallel::overlap_2d_names());
  const auto& q = p.sequence_2d;
  positive("parallel.sequence_2D.head_size", q.head_size);
  positive("parallel.sequence_2D.context_size", q.context_size);
  positive("parallel.sequence_2D.window_size", q.window_size);
  check_in(at("parallel.sequence_2D.balance"), q.balance, {"contiguous", "zigzag", "document"});
  // A rule between several keys blames the first of them given by --set, else the section in
  // the file (a --set error never names a file the keys are not in).
  auto at_set = [&](std::initializer_list<const char*> keys, const char* section) {
    for (const char* key : keys)
      if (set_argument(c.set_by, key)) return at(key);
    return at(section);
  };
  if (q.enable) {  // InternEvo's rules, before any work (the layout checks them again)
    check(p.tensor.mode == "isp", "{}: 2D-Attention needs parallel.tensor.mode = \"isp\", got \"{}\"",
          at("parallel.sequence_2D.enable"), p.tensor.mode);
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
  check_in(at("train.loss_reduction"), t.loss_reduction, {"token", "micro_mean"});
}

nlohmann::json to_json(const TrainConfig& c) {
  const auto& m = c.model;
  const auto& d = c.data;
  const auto& o = c.optimizer;
  const auto& p = c.parallel;
  const auto& t = c.train;
  nlohmann::json j;
  j["model"] = {{"type", m.type}, {"vocab_size", m.vocab_size}, {"hidden_size", m.hidden_size},
                {"num_layers", m.num_layers}, {"num_attention_heads", m.num_attention_heads},
                {"head_dim", m.explicit_head_dim}, {"sliding_window", m.sliding_window},
                {"num_kv_attention_heads", m.num_kv_attention_heads}, {"mlp_ratio", m.mlp_ratio},
                {"multiple_of", m.multiple_of}, {"norm_eps", m.norm_eps}, {"rope_base", m.rope_base},
                {"qkv_bias", m.qkv_bias}, {"o_bias", m.o_bias}, {"mlp_bias", m.mlp_bias},
                {"tie_word_embeddings", m.tie_word_embeddings}, {"checkpoint", m.checkpoint},
                {"dtype", m.dtype}};
  j["data"] = {{"train_folder", d.train_folder}, {"valid_folder", d.valid_folder},
               {"seq_len", d.seq_len}, {"micro_bsz", d.micro_bsz}, {"micro_num", d.micro_num},
               {"use_packed_dataset", d.use_packed_dataset},
               {"pack_sample_into_one", d.pack_sample_into_one}, {"pack_tail", d.pack_tail},
               {"shuffle", d.shuffle}, {"seed", d.seed}, {"min_length", d.min_length},
               {"split_documents", d.split_documents}, {"balance", d.balance},
               {"balance_window", d.balance_window}, {"balance_cost", d.balance_cost}};
  j["optimizer"] = {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
                    {"weight_decay", o.weight_decay}, {"clip_grad_norm", o.clip_grad_norm}};
  j["lr_scheduler"] = {{"warmup_steps", c.lr_scheduler.warmup_steps},
                       {"min_lr", c.lr_scheduler.min_lr}};
  j["parallel"] = {
      {"tensor", {{"size", p.tensor.size}, {"mode", p.tensor.mode}}},
      {"weight", {{"size", p.weight.size}, {"overlap", p.weight.overlap}}},
      {"zero1", {{"size", p.zero1.size}}}};
  if (p.tensor_2d.given)
    j["parallel"]["tensor_2d"] = {{"x", p.tensor_2d.x}, {"y", p.tensor_2d.y},
                                  {"overlap", p.tensor_2d.overlap}};
  const auto& q = p.sequence_2d;
  j["parallel"]["sequence_2D"] = {
      {"enable", q.enable}, {"head_size", q.head_size}, {"context_size", q.context_size},
      {"window_size", q.window_size}, {"balance", q.balance},
      {"device_placement_strategy", {{"head_first", q.head_first}, {"interleaved", q.interleaved}}}};
  j["train"] = {{"total_steps", t.total_steps}, {"seed", t.seed}, {"num_threads", t.num_threads},
                {"log_every", t.log_every}, {"valid_every", t.valid_every},
                {"save_every", t.save_every}, {"checkpoint_dir", t.checkpoint_dir},
                {"metrics_file", t.metrics_file}, {"loss_reduction", t.loss_reduction},
                {"max_skipped_steps", t.max_skipped_steps}};
  return j;
}

}  // namespace longtron::train
