#include "train/peft.h"

#include "core/error.h"

namespace longtron::train {

double lora_scale(const PeftLoraConfig&) { fail("peft: lora_scale not implemented yet"); }
void write_peft_adapter(const std::string&, const PeftAdapter&) {
  fail("peft: write_peft_adapter not implemented yet");
}
PeftAdapter read_peft_adapter(const std::string&) { fail("peft: read_peft_adapter not implemented yet"); }
std::string base_fingerprint(const std::string&) { fail("peft: base_fingerprint not implemented yet"); }
std::vector<std::string> lora_target_names(const std::string&) {
  fail("peft: lora_target_names not implemented yet");
}
std::vector<std::string> resolve_lora_targets(const std::string&, const std::vector<std::string>&,
                                              const std::string&) {
  fail("peft: resolve_lora_targets not implemented yet");
}
std::vector<LoraModuleInfo> lora_modules(const model::ParamTable&, const std::vector<std::string>&,
                                         const std::string&) {
  fail("peft: lora_modules not implemented yet");
}
void check_adapter_fits(const PeftAdapter&, const model::ParamTable&, const std::string&) {
  fail("peft: check_adapter_fits not implemented yet");
}
void merge_peft_adapter(const PeftAdapter&, model::Params<float>&, const std::string&) {
  fail("peft: merge_peft_adapter not implemented yet");
}
PeftAdapter internlm2_adapter_as_llama(const PeftAdapter&, const model::ModelConfig&) {
  fail("peft: internlm2_adapter_as_llama not implemented yet");
}
PeftAdapter llama_adapter_as_internlm2(const PeftAdapter&, const model::ModelConfig&, bool) {
  fail("peft: llama_adapter_as_internlm2 not implemented yet");
}

}  // namespace longtron::train
