// The embedding and output head of the tensor-parallel modes, shared by Megatron's MTP/MSP/FSP
// and MindSpeed's 2D tensor parallel: they differ only in how the residual stream is held between
// the blocks (replicated, row blocks, or the 2D grid of blocks: parallel/activation_blocks.h).
#pragma once
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "model/layers.h"
#include "model/params.h"
#include "parallel/activation_blocks.h"

namespace longtron::parallel {

/// The embedding over the tensor group `tensor`. Untied: InternEvo's Embedding1D (table columns
/// split over the group, lookup, all-gather along hidden). Tied (tie_word_embeddings): Megatron's
/// VocabParallelEmbedding (the head's vocabulary rows, partial lookup, then a sum over the group).
/// `blocks`: how the output is held (std::nullopt: replicated over the group, Megatron TP without
/// sequence parallel); backward gathers the blocks. `full`/`local`: the whole and this rank's
/// parameter tables; `table`: the embedding's id. Throws Error for a token id outside [0, V).
std::unique_ptr<model::EmbeddingOp<float>> make_tensor_parallel_embedding(
    const model::ParamTable& full, const model::ParamTable& local, int table,
    comm::CommPtr tensor, std::optional<ActivationBlocks> blocks);

/// The vocabulary-parallel output head + cross-entropy over `tensor` (VocabParallelHeadLoss): the
/// final norm's blocks gathered to full rows, logits per chunk of rows on this rank's vocabulary
/// shard, and dX summed over the group back into the blocks (or all-reduced when `blocks` is
/// std::nullopt). `generation`: whether logits_row (whole-vocabulary logits of one replicated row)
/// is offered; when false it throws Error naming `mode`.
std::unique_ptr<model::HeadLossOp<float>> make_tensor_parallel_head(
    const model::ParamTable& full, const model::ParamTable& local, int weight,
    comm::CommPtr tensor, std::optional<ActivationBlocks> blocks, bool generation,
    const char* mode);

}  // namespace longtron::parallel
