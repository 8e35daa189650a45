#include "train/peft.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"
#include "core/json_read.h"
#include "core/safetensors.h"
#include "core/shorten.h"
#include "model/families.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/lora.h"
#include "train/checkpoint.h"

namespace longtron::train {
namespace fs = std::filesystem;
namespace st = safetensors;
using nlohmann::json;

namespace {

constexpr const char* kLoraA = ".lora_A.weight";
constexpr const char* kLoraB = ".lora_B.weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// The layer index of "model.layers.<i>.…" (or -1) and the module's target name (last component).
std::pair<int64_t, std::string> layer_and_target(const std::string& module) {
  static const std::regex pattern(R"(^model\.layers\.([0-9]{1,9})\..*)");
  std::smatch m;
  const int64_t layer = std::regex_match(module, m, pattern) ? std::stoll(m[1].str()) : -1;
  return {layer, module.substr(module.rfind('.') + 1)};
}

/// Position of a target name in a block (both families' orders), for sorting modules.
int target_rank(const std::string& target) {
  static const std::vector<std::string> order = {"q_proj", "k_proj", "v_proj", "wqkv",  "o_proj",
                                                 "wo",     "gate_proj", "w1",   "up_proj", "w3",
                                                 "down_proj", "w2"};
  const auto it = std::find(order.begin(), order.end(), target);
  return it == order.end() ? static_cast<int>(order.size()) : static_cast<int>(it - order.begin());
}

void sort_modules(std::vector<PeftModuleAdapter>& modules) {
  std::stable_sort(modules.begin(), modules.end(), [](const auto& a, const auto& b) {
    const auto [la, ta] = layer_and_target(a.module);
    const auto [lb, tb] = layer_and_target(b.module);
    if (la != lb) return la < lb;
    if (target_rank(ta) != target_rank(tb)) return target_rank(ta) < target_rank(tb);
    return a.module < b.module;
  });
}

/// The first non-finite element of v, or -1.
int64_t first_nonfinite(const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
  return -1;
}

/// Sizes and values of one module against r (messages name `where` and the tensor).
void check_module(const PeftModuleAdapter& m, int r, const std::string& where) {
  const std::string a = kPeftPrefix + m.module + kLoraA, b = kPeftPrefix + m.module + kLoraB;
  check(m.in > 0 && m.out > 0, "{}: tensor {}: in = {} and out = {} must be positive", where, a,
        m.in, m.out);
  check(static_cast<int64_t>(m.A.size()) == int64_t{r} * m.in,
        "{}: tensor {} holds {} values, but [r, in] = [{}, {}] needs {}", where, a, m.A.size(), r,
        m.in, int64_t{r} * m.in);
  check(static_cast<int64_t>(m.B.size()) == m.out * int64_t{r},
        "{}: tensor {} holds {} values, but [out, r] = [{}, {}] needs {}", where, b, m.B.size(),
        m.out, r, m.out * int64_t{r});
  for (const auto& [name, v] : {std::pair{a, &m.A}, std::pair{b, &m.B}}) {
    const int64_t i = first_nonfinite(*v);
    check(i < 0, "{}: tensor {} holds the non-finite value {} at element {} (an adapter holds "
          "finite values only)", where, name, (*v)[static_cast<size_t>(i < 0 ? 0 : i)], i);
  }
}

/// True when `target` of `module` is one of the config's target_modules (PEFT's rule: a list
/// names module-name suffixes; a string is a regular expression over the full module name).
bool targeted(const PeftLoraConfig& c, const std::string& module, const std::string& target) {
  if (c.target_is_regex) {
    try {
      return c.target_modules.size() == 1 && std::regex_match(module, std::regex(c.target_modules[0]));
    } catch (const std::regex_error&) {
      return false;
    }
  }
  for (const auto& t : c.target_modules)
    if (t == target || t == "all-linear" || ends_with(module, "." + t) || module == t) return true;
  return false;
}

}  // namespace

double lora_scale(const PeftLoraConfig& config) {
  check(config.r > 0, "LoRA: rank r = {} (must be positive)", config.r);
  return config.use_rslora ? config.lora_alpha / std::sqrt(static_cast<double>(config.r))
                           : config.lora_alpha / config.r;
}

void write_peft_adapter(const std::string& dir_name, const PeftAdapter& adapter) {
  const fs::path dir = dir_name;
  const PeftLoraConfig& c = adapter.config;
  check(c.r > 0, "{}: LoRA rank r = {} (an adapter needs r > 0)", dir.string(), c.r);
  check(std::isfinite(c.lora_alpha) && std::isfinite(c.lora_dropout) && c.lora_dropout >= 0 &&
            c.lora_dropout < 1,
        "{}: lora_alpha {} and lora_dropout {} must be finite, dropout in [0, 1)", dir.string(),
        c.lora_alpha, c.lora_dropout);
  check(!adapter.modules.empty(), "{}: the adapter has no module", dir.string());
  std::set<std::string> seen;
  std::vector<st::WriteTensor> tensors;
  for (const auto& m : adapter.modules) {
    check(!m.module.empty() && seen.insert(m.module).second,
          "{}: module '{}' is empty or listed twice", dir.string(), m.module);
    check_module(m, c.r, (dir / kAdapterWeightsFile).string());
    tensors.push_back({kPeftPrefix + m.module + kLoraA, {c.r, m.in}, st::DType::F32, m.A.data(), nullptr});
    tensors.push_back({kPeftPrefix + m.module + kLoraB, {m.out, c.r}, st::DType::F32, m.B.data(), nullptr});
  }
  // PEFT's LoraConfig fields as save_pretrained writes them (peft/tuners/lora/config.py); those
  // longtron does not use keep PEFT's defaults.
  json j;
  j["alpha_pattern"] = json::object();
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  // An integral alpha is written as an integer, as Python writes lora_alpha=16.
  if (c.lora_alpha == std::floor(c.lora_alpha) && std::fabs(c.lora_alpha) < 1e15)
    j["lora_alpha"] = static_cast<int64_t>(c.lora_alpha);
  else
    j["lora_alpha"] = c.lora_alpha;
  j["lora_dropout"] = c.lora_dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = json::object();
  j["revision"] = nullptr;
  if (c.target_is_regex)
    j["target_modules"] = c.target_modules.empty() ? std::string() : c.target_modules[0];
  else
    j["target_modules"] = c.target_modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_rslora"] = c.use_rslora;
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec, "{}: cannot create the adapter folder ({})", dir.string(), ec.message());
  st::write_file(dir / kAdapterWeightsFile, tensors, {{"format", "pt"}});
  write_atomically(dir / kAdapterConfigFile, [&](const fs::path& tmp) {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    out.close();
    check(out.good(), "{}: write failed ({})", (dir / kAdapterConfigFile).string(), io_error_text());
  });
}

PeftAdapter read_peft_adapter(const std::string& dir_name) {
  const fs::path dir = dir_name;
  const fs::path config_file = dir / kAdapterConfigFile, weights_file = dir / kAdapterWeightsFile;
  check(fs::is_directory(dir), "{}: no such adapter folder", dir.string());
  check(fs::is_regular_file(config_file), "{}: missing (a PEFT adapter folder holds {} and {})",
        config_file.string(), kAdapterConfigFile, kAdapterWeightsFile);
  check(fs::is_regular_file(weights_file), "{}: missing{}", weights_file.string(),
        fs::exists(dir / "adapter_model.bin")
            ? " (adapter_model.bin, PyTorch's pickle format, is not read: save the adapter with "
              "safe_serialization=True)"
            : "");
  const json j = read_json_file(config_file);
  const std::string cf = config_file.string();
  check(j.is_object(), "{}: not a JSON object", cf);
  auto get = [&](const char* key) -> const json* { return j.contains(key) && !j[key].is_null() ? &j[key] : nullptr; };
  const json* type = get("peft_type");
  check(type && type->is_string(), "{}: no peft_type (a PEFT adapter_config.json names its method)", cf);
  check(type->get<std::string>() == "LORA", "{}: peft_type is {}, but only LORA adapters are read", cf,
        json_excerpt(*type));
  PeftAdapter a;
  PeftLoraConfig& c = a.config;
  const json* r = get("r");
  check(r && r->is_number_integer() && r->get<int64_t>() > 0 && r->get<int64_t>() < (int64_t{1} << 30),
        "{}: r must be a positive integer, got {}", cf, r ? json_excerpt(*r) : "nothing");
  c.r = static_cast<int>(r->get<int64_t>());
  const json* alpha = get("lora_alpha");
  check(!alpha || alpha->is_number(), "{}: lora_alpha must be a number, got {}", cf,
        alpha ? json_excerpt(*alpha) : "");
  c.lora_alpha = alpha ? alpha->get<double>() : 8.0;  // PEFT's default
  check(std::isfinite(c.lora_alpha), "{}: lora_alpha is {}, not a finite number", cf, c.lora_alpha);
  const json* dropout = get("lora_dropout");
  check(!dropout || dropout->is_number(), "{}: lora_dropout must be a number, got {}", cf,
        dropout ? json_excerpt(*dropout) : "");
  c.lora_dropout = dropout ? dropout->get<double>() : 0.0;
  check(c.lora_dropout >= 0.0 && c.lora_dropout < 1.0, "{}: lora_dropout is {}, outside [0, 1)",
        cf, c.lora_dropout);
  const json* rslora = get("use_rslora");
  check(!rslora || rslora->is_boolean(), "{}: use_rslora must be true or false", cf);
  c.use_rslora = rslora && rslora->get<bool>();
  if (const json* base = get("base_model_name_or_path")) {
    check(base->is_string(), "{}: base_model_name_or_path must be a string", cf);
    c.base_model_name_or_path = base->get<std::string>();
  }
  const json* targets = get("target_modules");
  check(targets && (targets->is_array() || targets->is_string()),
        "{}: target_modules must be a list of module names or a regular expression", cf);
  if (targets->is_string()) {
    c.target_modules = {targets->get<std::string>()};
    c.target_is_regex = c.target_modules[0] != "all-linear";
  } else {
    for (const auto& t : *targets) {
      check(t.is_string(), "{}: target_modules holds {}, not a module name", cf, json_excerpt(t));
      c.target_modules.push_back(t.get<std::string>());
    }
  }
  // What this reader cannot represent is refused rather than dropped.
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (const json* p = get(key))
      check(p->is_object() && p->empty(), "{}: {} gives some modules their own rank or alpha; "
            "longtron reads adapters of one r and one lora_alpha only", cf, key);
  if (const json* bias = get("bias"))
    check(bias->is_string() && bias->get<std::string>() == "none",
          "{}: bias is {}; longtron reads adapters with bias \"none\" only", cf, json_excerpt(*bias));
  for (const char* key : {"use_dora", "fan_in_fan_out"})
    if (const json* flag = get(key))
      check(flag->is_boolean() && !flag->get<bool>(), "{}: {} is {}; not supported", cf, key,
            json_excerpt(*flag));
  // PEFT adapts only the listed layers (layers_to_transform), leaves out modules
  // (exclude_modules), or repeats layers (layer_replication): longtron adapts every layer's
  // targets of the model as it is, so the same folder would mean another model here.
  for (const char* key : {"layers_to_transform", "exclude_modules", "layer_replication"})
    if (const json* p = get(key))
      check((p->is_array() || p->is_string()) && p->empty(), "{}: {} is {}; longtron adapts every "
            "layer's target_modules and reads no adapter restricted to some layers or modules",
            cf, key, json_excerpt(*p));
  if (const json* save = get("modules_to_save"))
    check(save->is_array() && save->empty(), "{}: modules_to_save is {}; an adapter with fully "
          "trained modules besides LoRA is not supported", cf, json_excerpt(*save));

  const st::File file(weights_file);
  const std::string wf = weights_file.string();
  std::map<std::string, PeftModuleAdapter> modules;
  std::map<std::string, std::string> a_of, b_of;  // module → tensor name
  for (const auto& info : file.tensors()) {
    const std::string& name = info.name;
    const bool is_a = ends_with(name, kLoraA), is_b = ends_with(name, kLoraB);
    check(name.rfind(kPeftPrefix, 0) == 0 && (is_a || is_b),
          "{}: tensor {} is not a LoRA weight (expected {}<module>{} or {})", wf, shorten(name),
          kPeftPrefix, kLoraA, kLoraB);
    const size_t prefix = std::strlen(kPeftPrefix), suffix = std::strlen(is_a ? kLoraA : kLoraB);
    check(name.size() > prefix + suffix, "{}: tensor {} names no module", wf, shorten(name));
    const std::string module = name.substr(prefix, name.size() - prefix - suffix);
    (is_a ? a_of : b_of)[module] = name;
    check(info.shape.size() == 2, "{}: tensor {} has shape {}; LoRA's {} is 2-D", wf, name,
          st::shape_string(info.shape), is_a ? "A [r, in]" : "B [out, r]");
    const int64_t rank = is_a ? info.shape[0] : info.shape[1];
    check(rank == c.r, "{}: tensor {} has shape {}, whose rank {} disagrees with r = {} of {}", wf,
          name, st::shape_string(info.shape), rank, c.r, cf);
    PeftModuleAdapter& m = modules[module];
    m.module = module;
    (is_a ? m.in : m.out) = is_a ? info.shape[1] : info.shape[0];
    check(info.shape[0] > 0 && info.shape[1] > 0, "{}: tensor {} is empty ({})", wf, name,
          st::shape_string(info.shape));
    std::vector<float>& values = is_a ? m.A : m.B;
    values.resize(static_cast<size_t>(info.numel()));
    file.read_floats(name, info.shape, values.data());  // refuses NaN/Inf naming the tensor
  }
  check(!modules.empty(), "{}: holds no LoRA weights ({}<module>{})", wf, kPeftPrefix, kLoraA);
  for (auto& [module, m] : modules) {
    // (the names are rebuilt here: operator[] on the maps would insert the missing partner)
    check(a_of.count(module), "{}: tensor {} has no lora_A partner {}", wf,
          kPeftPrefix + module + kLoraB, kPeftPrefix + module + kLoraA);
    check(b_of.count(module), "{}: tensor {} has no lora_B partner {}", wf,
          kPeftPrefix + module + kLoraA, kPeftPrefix + module + kLoraB);
    check_module(m, c.r, wf);
    a.modules.push_back(std::move(m));
  }
  sort_modules(a.modules);
  return a;
}

namespace {

/// 64-bit hash of a byte range: four lanes of a multiply-rotate mix over 8-byte little-endian
/// words (the tail zero-padded, the length mixed in), combined at the end. Deterministic; not
/// cryptographic — it tells a changed or different base apart, it does not resist forgery.
uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t seed) {
  constexpr uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full;
  const auto mix = [](uint64_t h, uint64_t w) {
    h ^= w * k2;
    h = (h << 31) | (h >> 33);
    return h * k1;
  };
  uint64_t lane[4] = {seed ^ k1, seed ^ k2, seed + k1, seed - k2};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = mix(lane[l], w);
    }
  uint64_t h = seed ^ n;
  for (int l = 0; l < 4; ++l) h = mix(h, lane[l]);
  for (; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, std::min<size_t>(8, n - i));
    h = mix(h, w);
  }
  h ^= h >> 29;
  h *= k2;
  return h ^ (h >> 32);
}

}  // namespace

std::string base_fingerprint(const std::string& hf_dir) {
  const fs::path dir = hf_dir;
  check(fs::is_directory(dir), "{}: no such model folder", dir.string());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool weights = (ends_with(name, ".safetensors") || ends_with(name, ".bin")) &&
                         name != "optimizer.safetensors" && name != kAdapterWeightsFile &&
                         name != "training_args.bin";
    if (weights && e.is_regular_file()) files.push_back(e.path());
  }
  check(!files.empty(), "{}: holds no weights (*.safetensors or *.bin)", dir.string());
  std::sort(files.begin(), files.end());
  uint64_t total = 0x6C6F6E6774726F6Eull;
  constexpr size_t kChunk = size_t{64} << 20;  // fixed chunks: the value does not depend on threads
  for (const fs::path& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd >= 0, "{}: cannot open ({})", path.string(), io_error_text());
    struct stat sb {};
    const bool ok = ::fstat(fd, &sb) == 0;
    const size_t size = ok ? static_cast<size_t>(sb.st_size) : 0;
    void* map = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);
    check(ok && map != MAP_FAILED, "{}: cannot read ({})", path.string(), io_error_text());
    const auto* bytes = static_cast<const uint8_t*>(map);
    if (map) ::madvise(map, size, MADV_SEQUENTIAL);
    const int64_t chunks = static_cast<int64_t>((size + kChunk - 1) / kChunk);
    std::vector<uint64_t> h(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < chunks; ++k) {
      const size_t begin = static_cast<size_t>(k) * kChunk;
      const size_t n = std::min(kChunk, size - begin);
      h[static_cast<size_t>(k)] = hash_bytes(bytes + begin, n, uint64_t(k));
      // Give the chunk's pages back at once: a base of many GiB would otherwise stay counted in
      // the resident set until munmap (at most one chunk a thread is resident).
      ::madvise(const_cast<uint8_t*>(bytes + begin), n, MADV_DONTNEED);
    }
    if (map) ::munmap(map, size);
    const std::string name = path.filename().string();
    total = hash_bytes(reinterpret_cast<const uint8_t*>(name.data()), name.size(), total);
    total = hash_bytes(reinterpret_cast<const uint8_t*>(h.data()), h.size() * 8, total ^ size);
  }
  return fmt::format("lt64:{:016x}", total);
}

fs::path lora_checkpoint_base(const fs::path& step_dir) {
  if (!fs::is_regular_file(step_dir / "state.json")) return {};
  const CheckpointState state = read_checkpoint_state(step_dir);
  if (!state.extra.is_object() || !state.extra.contains("lora")) return {};
  const json& lora = state.extra["lora"];
  const std::string file = (step_dir / "state.json").string();
  check(lora.is_object() && lora.contains("base") && lora["base"].is_string() &&
            lora.contains("base_fingerprint") && lora["base_fingerprint"].is_string(),
        "{}: extra.lora must name the base folder (\"base\") and its \"base_fingerprint\"", file);
  const fs::path base = lora["base"].get<std::string>();
  check(fs::is_directory(base),
        "{}: the LoRA adapter of this checkpoint was trained on the base model {}, which does not "
        "exist any more (moved or deleted? the checkpoint holds the adapter only)",
        step_dir.string(), base.string());
  const std::string want = lora["base_fingerprint"].get<std::string>();
  const std::string have = base_fingerprint(base.string());
  check(have == want,
        "{}: the weights of the base model {} changed since the LoRA adapter of this checkpoint "
        "was trained on them (fingerprint {}, state.json records {}); the adapter needs the base "
        "it was trained on", step_dir.string(), base.string(), have, want);
  return base;
}

namespace {

/// The linears of `layout` under family `format`'s names (empty: its own), all of them
/// (model::lora_modules with "all-linear"), each with its weight as an HfTensor.
struct Linear {
  std::string module, target;
  model::HfTensor weight;
};
std::vector<Linear> linears(const model::ParamTable& layout, const std::string& format = "") {
  const model::ParamTable* table = &layout;
  std::unique_ptr<model::ParamTable> other;
  if (!format.empty() && format != layout.config().type) {
    model::ModelConfig c = layout.config();
    c.type = format;
    other = std::make_unique<model::ParamTable>(c);
    table = other.get();
  }
  model::LoraConfig all;
  all.rank = 1;
  all.targets = {"all-linear"};
  std::vector<Linear> out;
  for (const auto& m : model::lora_modules(*table, all))
    out.push_back({m.module, m.target, {m.module + ".weight", {m.out, m.in}, m.base_view, m.rows}});
  return out;
}

}  // namespace

void check_adapter_fits(const PeftAdapter& adapter, const model::ParamTable& layout,
                        const std::string& where) {
  const PeftLoraConfig& c = adapter.config;
  check(c.r > 0, "{}: LoRA rank r = {}; an adapter needs r > 0", where, c.r);
  std::map<std::string, const Linear*> by_module;
  const auto list = linears(layout);
  for (const auto& l : list) by_module[l.module] = &l;
  const std::string family = layout.config().type;
  check(!adapter.modules.empty(), "{}: the adapter has no module", where);
  std::set<std::string> seen;
  for (const auto& m : adapter.modules) {
    const std::string a = kPeftPrefix + m.module + kLoraA;
    check(seen.insert(m.module).second, "{}: module {} is adapted twice", where, m.module);
    const auto it = by_module.find(m.module);
    if (it == by_module.end()) {
      const auto [layer, target] = layer_and_target(m.module);
      const auto names = model::lora_family_targets(family);
      if (std::find(names.begin(), names.end(), target) == names.end())
        fail("{}: tensor {}: {} is not a linear layer of a {} model (its targets: {}){}", where, a,
             target, family, join(names),
             model::family(family, "model.type").names == model::TensorNames::kFused
                 ? ""
                 : (target == "wqkv" ? " — an InternLM2 adapter on a " + family +
                                           " model? export it with --format llama" : ""));
      fail("{}: tensor {}: the model has no module {} (layer {} of {})", where, a, m.module, layer,
           layout.layers.size());
    }
    const Linear& l = *it->second;
    if (m.out != l.weight.shape[0] || m.in != l.weight.shape[1]) {
      const bool b_wrong = m.out != l.weight.shape[0];  // name the tensor whose shape is wrong
      fail("{}: tensor {}{} has shape [{}, {}], which does not fit the base weight {} of shape [{}, "
           "{}] (lora_A must be [r, {}], lora_B [{}, r])", where, kPeftPrefix + m.module,
           b_wrong ? kLoraB : kLoraA, b_wrong ? m.out : int64_t{c.r}, b_wrong ? int64_t{c.r} : m.in,
           l.weight.name, l.weight.shape[0], l.weight.shape[1], l.weight.shape[1], l.weight.shape[0]);
    }
    check(targeted(c, m.module, l.target), "{}: tensor {}: module {} is not in adapter_config.json's "
          "target_modules ({})", where, a, l.target, join(c.target_modules));
    check_module(m, c.r, where);
  }
  for (const auto& t : c.target_modules) {
    if (c.target_is_regex || t == "all-linear") continue;
    const auto names = model::lora_family_targets(family);
    check(std::find(names.begin(), names.end(), t) != names.end(),
          "{}: target_modules names \"{}\", which is not a linear layer of a {} model (its "
          "targets: {})", where, t, family, join(names));
  }
}

void merge_peft_adapter(const PeftAdapter& adapter, model::Params<float>& full, const std::string& where) {
  const model::ParamTable& layout = full.layout();
  check_adapter_fits(adapter, layout, where);
  const double s = lora_scale(adapter.config);
  const int64_t r = adapter.config.r;
  std::map<std::string, model::HfTensor> weights;
  for (auto& l : linears(layout)) weights[l.module] = std::move(l.weight);
  for (const auto& m : adapter.modules) {
    const model::HfTensor& t = weights.at(m.module);
    std::vector<float> w(static_cast<size_t>(m.out * m.in));
    model::gather_hf(t, layout, full.data(), w.data());
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t i = 0; i < m.in; ++i) {
        double sum = 0;
        for (int64_t k = 0; k < r; ++k)
          sum += double(m.B[size_t(o * r + k)]) * double(m.A[size_t(k * m.in + i)]);
        float& x = w[size_t(o * m.in + i)];
        x = static_cast<float>(double(x) + s * sum);
      }
    for (size_t i = 0; i < w.size(); ++i)
      check(std::isfinite(w[i]), "{}: merging {} gives the non-finite value {} at element {} of {}",
            where, m.module, w[i], i, t.name);
    model::scatter_hf(t, layout, w.data(), full.data());
  }
}

namespace {

/// Rows `blocks` (first, count) of a row-major matrix of `cols` columns, concatenated.
std::vector<float> take_rows(const std::vector<float>& m, int64_t cols,
                             const std::vector<std::pair<int64_t, int64_t>>& blocks) {
  std::vector<float> out;
  for (const auto& [first, count] : blocks)
    out.insert(out.end(), m.begin() + first * cols, m.begin() + (first + count) * cols);
  return out;
}

/// The targets of `modules` in block order of family `type`.
std::vector<std::string> targets_of(const std::vector<PeftModuleAdapter>& modules, const std::string& type) {
  std::set<std::string> used;
  for (const auto& m : modules) used.insert(layer_and_target(m.module).second);
  std::vector<std::string> out;
  for (const auto& n : model::lora_family_targets(type))
    if (used.count(n)) out.push_back(n);
  return out;
}

/// The families whose names the conversions below go between: InternLM2's fused wqkv, wo, w1,
/// w3, w2 and Llama's separate q/k/v/o_proj, gate/up/down_proj (model/families.h).
const std::string kFused = model::names_family(model::TensorNames::kFused);
const std::string kSeparate = model::names_family(model::TensorNames::kSeparate);

/// The model's layout as the family of each conversion needs (the view rows are the same).
model::ParamTable layout_of(const model::ModelConfig& config) {
  model::ModelConfig c = config;
  c.type = kFused;
  return model::ParamTable(c);
}

}  // namespace

PeftAdapter internlm2_adapter_as_llama(const PeftAdapter& adapter, const model::ModelConfig& config) {
  const model::ParamTable layout = layout_of(config);
  check_adapter_fits(adapter, layout, "converting an InternLM2 adapter to Llama's names");
  std::map<int, const PeftModuleAdapter*> by_view;  // engine view → InternLM2 module (whole view)
  std::map<std::string, int> view_of;
  for (const auto& l : linears(layout, kFused)) view_of[l.module] = l.weight.view;
  for (const auto& m : adapter.modules) by_view[view_of.at(m.module)] = &m;
  PeftAdapter out;
  out.config = adapter.config;
  for (const auto& l : linears(layout, kSeparate)) {
    const auto it = by_view.find(l.weight.view);
    if (it == by_view.end()) continue;
    const PeftModuleAdapter& src = *it->second;
    PeftModuleAdapter m;
    m.module = l.module;
    m.in = src.in;
    m.out = l.weight.shape[0];
    m.A = src.A;  // q, k and v share A: B_q A is the q rows of B A
    m.B = take_rows(src.B, adapter.config.r, l.weight.rows);
    out.modules.push_back(std::move(m));
  }
  out.config.target_is_regex = false;
  out.config.target_modules = targets_of(out.modules, kSeparate);
  return out;
}

PeftAdapter llama_adapter_as_internlm2(const PeftAdapter& adapter, const model::ModelConfig& config,
                                       bool allow_rank_growth) {
  model::ModelConfig llama = config;
  llama.type = kSeparate;
  const model::ParamTable layout(llama);
  check_adapter_fits(adapter, layout, "converting a Llama adapter to InternLM2's names");
  const int64_t r = adapter.config.r;
  std::map<std::string, const PeftModuleAdapter*> by_module;
  for (const auto& m : adapter.modules) by_module[m.module] = &m;
  // Llama linears per engine view, in order (q, k, v of one wqkv).
  std::map<int, std::vector<Linear>> parts;
  for (auto& l : linears(layout, kSeparate))
    if (by_module.count(l.module)) parts[l.weight.view].push_back(std::move(l));
  // Whether every fused view's parts share A (then rank r stays exact).
  bool shared = true;
  std::string first_unshared;
  for (const auto& [view, list] : parts)
    for (const auto& l : list)
      if (by_module.at(l.module)->A != by_module.at(list.front().module)->A) {
        if (shared) first_unshared = l.module + " and " + list.front().module;
        shared = false;
      }
  const bool grow = !shared;
  check(shared || allow_rank_growth,
        "converting to InternLM2's fused wqkv: {} have different lora_A; one wqkv adapter of rank "
        "{} cannot hold them exactly (it would need rank {}: q, k and v's A stacked)",
        first_unshared, r, 3 * r);
  PeftAdapter out;
  out.config = adapter.config;
  const int64_t r2 = grow ? 3 * r : r;
  out.config.r = static_cast<int>(r2);
  // s'·B' must equal s·B: B' = B · s / s'.
  const double ratio = lora_scale(adapter.config) / lora_scale(out.config);
  const model::ParamTable fused = layout_of(config);
  for (const auto& l : linears(fused, kFused)) {
    const auto it = parts.find(l.weight.view);
    if (it == parts.end()) continue;
    const auto& list = it->second;
    PeftModuleAdapter m;
    m.module = l.module;
    m.in = l.weight.shape[1];
    m.out = l.weight.shape[0];
    m.A.assign(size_t(r2 * m.in), 0.0f);
    m.B.assign(size_t(m.out * r2), 0.0f);
    for (size_t p = 0; p < list.size(); ++p) {
      const PeftModuleAdapter& src = *by_module.at(list[p].module);
      // Which rank slot this part uses: its own third when growing, else the shared r.
      const int64_t slot = grow ? (layer_and_target(list[p].module).second == "k_proj"   ? 1
                                   : layer_and_target(list[p].module).second == "v_proj" ? 2
                                                                                          : 0)
                                : 0;
      if (grow || p == 0) std::copy(src.A.begin(), src.A.end(), m.A.begin() + slot * r * m.in);
      int64_t row = 0;  // row of src.B
      for (const auto& [first, count] : list[p].weight.rows)
        for (int64_t k = 0; k < count; ++k, ++row)
          for (int64_t j = 0; j < r; ++j)
            m.B[size_t((first + k) * r2 + slot * r + j)] =
                static_cast<float>(src.B[size_t(row * r + j)] * ratio);
    }
    out.modules.push_back(std::move(m));
  }
  out.config.target_is_regex = false;
  out.config.target_modules = targets_of(out.modules, kFused);
  return out;
}

}  // namespace longtron::train
