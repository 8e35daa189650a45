// The trainer's side of LoRA (see lora_train.h).
#include "train/lora_train.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "core/error.h"
#include "model/lora.h"

namespace longtron::train {

PeftLoraConfig peft_config_of(const model::LoraConfig& lora, const std::string& type,
                              const std::string& base) {
  PeftLoraConfig c;
  c.r = static_cast<int>(lora.rank);
  c.lora_alpha = lora.alpha;
  c.lora_dropout = lora.dropout;
  c.target_modules = model::lora_resolve_targets(type, lora.targets);
  c.use_rslora = lora.use_rslora;
  c.base_model_name_or_path = base;
  return c;
}

PeftAdapter gather_peft_adapter(const parallel::ParallelEngine& engine,
                                const model::Params<float>& local, const PeftLoraConfig& config) {
  check(engine.has_lora(), "gather_peft_adapter: the model has no LoRA adapters");
  model::Params<float> full(engine.train_full_layout());
  engine.gather_train_full(full, local);
  PeftAdapter out;
  out.config = config;
  for (const model::LoraModule& m : engine.lora_modules()) {
    PeftModuleAdapter a;
    a.module = m.module;
    a.in = m.in;
    a.out = m.out;
    const int64_t r = full.layout().view(m.a_view).shape[0];
    a.A.assign(full.ptr(m.a_view), full.ptr(m.a_view) + r * m.in);
    a.B.assign(full.ptr(m.b_view), full.ptr(m.b_view) + m.out * r);
    out.modules.push_back(std::move(a));
  }
  return out;
}

void load_peft_adapter(const parallel::ParallelEngine& engine, const PeftAdapter& adapter,
                       model::Params<float>& local, const std::string& where) {
  check(engine.has_lora(), "{}: an adapter was given but lora.rank is 0 (no adapters to load)",
        where);
  const auto& modules = engine.lora_modules();
  model::Params<float> full(engine.train_full_layout());
  for (const PeftModuleAdapter& a : adapter.modules) {
    const auto it = std::find_if(modules.begin(), modules.end(),
                                 [&](const model::LoraModule& m) { return m.module == a.module; });
    check(it != modules.end(), "{}: module {} is not an adapted linear of this model and [lora] "
          "targets", where, a.module);
  }
  for (const model::LoraModule& m : modules) {
    const auto it = std::find_if(adapter.modules.begin(), adapter.modules.end(),
                                 [&](const PeftModuleAdapter& a) { return a.module == m.module; });
    check(it != adapter.modules.end(), "{}: no adapter for {} (lora.targets adapts it)", where,
          m.module);
    const int64_t r = full.layout().view(m.a_view).shape[0];
    check(it->in == m.in && it->out == m.out && int64_t(it->A.size()) == r * m.in &&
              int64_t(it->B.size()) == m.out * r,
          "{}: {}{}.lora_A.weight / lora_B.weight hold [{}, {}] / [{}, {}]; the model needs "
          "[{}, {}] / [{}, {}]", where, kPeftPrefix, m.module, it->in ? it->A.size() / it->in : 0,
          it->in, it->out, it->out ? it->B.size() / it->out : 0, r, m.in, m.out, r);
    for (float v : it->A) check(std::isfinite(v), "{}: {}.lora_A.weight holds {}", where, m.module, v);
    for (float v : it->B) check(std::isfinite(v), "{}: {}.lora_B.weight holds {}", where, m.module, v);
    std::copy(it->A.begin(), it->A.end(), full.ptr(m.a_view));
    std::copy(it->B.begin(), it->B.end(), full.ptr(m.b_view));
  }
  engine.scatter_train_full(local, full);
}

void check_adapter_matches(const PeftLoraConfig& file, const model::LoraConfig& lora,
                           const std::string& type, const std::string& dir) {
  const std::string at = dir + "/" + kAdapterConfigFile;
  check(file.r == lora.rank, "{}: r = {}, but lora.rank = {}", at, file.r, lora.rank);
  check(file.lora_alpha == lora.alpha, "{}: lora_alpha = {}, but lora.alpha = {}", at,
        file.lora_alpha, lora.alpha);
  check(file.use_rslora == lora.use_rslora, "{}: use_rslora = {}, but lora.use_rslora = {}", at,
        file.use_rslora, lora.use_rslora);
  std::vector<std::string> mine = model::lora_resolve_targets(type, lora.targets);
  std::vector<std::string> theirs;
  for (const std::string& t : file.target_modules) {
    if (t == "all-linear") {
      theirs = model::lora_family_targets(type);
      break;
    }
    theirs.push_back(t);
  }
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  check(mine == theirs, "{}: target_modules = [{}], but lora.targets = [{}]", at,
        fmt::join(theirs, ", "), fmt::join(mine, ", "));
}

}  // namespace longtron::train
