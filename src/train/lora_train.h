// The trainer's side of LoRA (docs/lora.md): the engine's adapter table as a PEFT adapter
// (train/peft.h) and back, whatever the layout.
#pragma once
#include <string>

#include "model/lora_config.h"
#include "model/params.h"
#include "modes/engine.h"
#include "train/peft.h"

namespace longtron::train {

/// PEFT's adapter_config.json fields of `lora` on a model of family `type` (targets resolved to
/// the family's names), with base_model_name_or_path = `base`.
PeftLoraConfig peft_config_of(const model::LoraConfig& lora, const std::string& type,
                              const std::string& base);

/// A local buffer over engine.train_layout() (the adapter's values, gradients or AdamW moments)
/// as a full PeftAdapter in the family's module names, with config `config`. Collective over the
/// engine's model-parallel groups (every rank gets it). Throws Error when the engine has no LoRA.
PeftAdapter gather_peft_adapter(const parallel::ParallelEngine& engine,
                                const model::Params<float>& local, const PeftLoraConfig& config);

/// Loads `adapter` into `local` (over engine.train_layout(), e.g. engine.train_params()) in any
/// layout. Throws Error naming `where` and the module when a module is missing or extra or its
/// [r, in] / [out, r] shapes disagree with the model's. No communication.
void load_peft_adapter(const parallel::ParallelEngine& engine, const PeftAdapter& adapter,
                       model::Params<float>& local, const std::string& where);

/// `--init-adapter`: adapter_config.json's r, lora_alpha, target_modules and use_rslora must be
/// [lora]'s (rank, alpha, targets, use_rslora); throws Error naming both values and `dir`.
void check_adapter_matches(const PeftLoraConfig& file, const model::LoraConfig& lora,
                           const std::string& type, const std::string& dir);

}  // namespace longtron::train
