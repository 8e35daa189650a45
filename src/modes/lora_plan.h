// Where a rank holds the LoRA adapters in each layout (docs/lora.md, "what each layout does with A
// and B"): the engine's plan of the adapter table, shared with the memory plan.
#pragma once
#include <string>
#include <vector>

#include "model/lora.h"
#include "parallel/shard_plan.h"

namespace longtron::parallel {

/// Splits the adapter table's plan `plan` (built over lora_table of `modules`, every tensor
/// replicated) to match the base's plan `base` under mode `mode` (a ModeFactory name): A and B
/// follow their linear's splits (column-parallel: B's rows; row-parallel: A's columns; 2D: both),
/// copies whose ranks saw other tokens are summed over that group; under "isp" every adapter is
/// split on dim 0 over WEIGHT (shard_range: uneven and empty shards allowed) as the base's
/// linears. Other modes (dense, mtp) keep the replicated copies of one process's tokens.
void plan_lora(ShardPlan& plan, const std::vector<model::LoraModule>& modules,
               const ShardPlan& base, const std::string& mode);

}  // namespace longtron::parallel
