// `longtron inspect` as a library: the micro-batches a data config produces (docs/data.md), as
// InternEvo's data pipeline prints them or as JSON. The CLI (src/cli/inspect.cpp) only parses flags
// and opens the dataset.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/progress_hook.h"
#include "packing/context_split.h"
#include "packing/loader.h"

namespace longtron::data {

/// What to show. data.shuffle turns both document and row shuffling on (docs/data.md: inspect
/// shuffles nothing unless asked). sp_size/sp_rank select one rank's sequence shard (docs/data.md).
struct InspectOptions {
  DataConfig data;
  int64_t steps = 1;
  int64_t sp_size = 1;
  int64_t sp_rank = 0;
  /// > 0: show every data-parallel rank of a dp run of this size (`--dp-size`); 0: rank 0 of 1.
  int64_t dp_size = 0;
  /// > 1: add each micro-batch's context-parallel assignment ("cp_ranks", `--cp-size`).
  int64_t cp_size = 1;
  ContextBalance cp_balance = ContextBalance::kZigzag;
  /// The model's sliding window when every layer has it (0 = none): caps each query's keys in
  /// "attention_work" and "cp_imbalance".
  int64_t cp_window = 0;
};

/// {"steps": [{"micro_batches": [{"input_ids", "labels", "cu_seqlens", "indexes", "max_seqlen"
/// [, "unpacked": {"input_ids": [[…]], "labels": [[…]]}]}, …]}, …]} for dp rank 0 of dp size 1.
/// With sp_size > 1 the arrays are rank sp_rank's slice; cu_seqlens/max_seqlen stay global; the
/// unpacked arrays are split on their L dimension. Throws Error for bad options (steps, seq_len,
/// micro_bsz, micro_num <= 0; sp_rank >= sp_size; a size not dividing the row) or an empty dataset.
/// With dp_size > 0 each step is {"dp_ranks": [{"rank", "micro_batches": […as above], "cost"}],
/// "imbalance"}: the rows of every rank under data.balance (BatchLoader::plan), their modelled cost
/// (RowCost) and max cost ÷ mean. With cp_size > 1 each micro-batch also has "cp_ranks":
/// [{"rank", "positions", "attention_work"}] (context_assignment of the row padded to a multiple of
/// cp_size, and the causal work of each rank's queries) and "cp_imbalance" (max work ÷ mean).
/// `progress` (may be null) sees the row index being built (BatchLoader).
nlohmann::json inspect_json(Dataset dataset, const InspectOptions& options,
                            ProgressHook* progress = nullptr);

/// The same content laid out as InternEvo's data pipeline prints it (`batch_data[0]['input_ids']:
/// tensor([[…]])`, then per micro-batch `data[...]` after packed_data_normalizer / unpack_data and
/// the split).
std::string inspect_text(const nlohmann::json& batches, const InspectOptions& options);

}  // namespace longtron::data
