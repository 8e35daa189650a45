#include "train/config_keys.h"

#include <fmt/core.h>

#include <algorithm>

namespace longtron::train {
namespace {

const char* kRequired = "required";
const char* kRequiredShape = "required unless `--init-from` or `--resume` gives the shape";

// section.key, type, default (TOML), meaning of an absent key when no default is written, meaning.
const std::vector<ConfigKey> kConfigKeys = {
    // [model]: InternEvo's config.py `model` names (docs/model.md).
    {"model.type", "string", "\"internlm2\"", "",
     "Model family: internlm2, llama, qwen2 or mistral (docs/model.md). It chooses the tensor names "
     "and config.json keys of checkpoints, --dump-grads and export; with --init-from it comes from "
     "config.json."},
    {"model.vocab_size", "integer", "", kRequiredShape,
     "Vocabulary size: rows of the token embedding and of the output head (more than the largest "
     "token id of the data)."},
    {"model.hidden_size", "integer", "", kRequiredShape, "Width H of the residual stream."},
    {"model.num_layers", "integer", "", kRequiredShape, "Number of transformer blocks."},
    {"model.num_attention_heads", "integer", "", kRequiredShape,
     "Query heads; divides hidden_size (head dim = hidden_size / num_attention_heads)."},
    {"model.num_kv_attention_heads", "integer", "", kRequiredShape,
     "Key/value heads (grouped-query attention); divides num_attention_heads."},
    {"model.head_dim", "integer", "0", "",
     "Features per attention head when not hidden_size / num_attention_heads (Hugging Face's "
     "head_dim); 0: hidden_size / num_attention_heads."},
    {"model.sliding_window", "integer", "0", "",
     "Sliding-window attention (mistral, qwen2): a query sees the last sliding_window keys of its "
     "document; 0: none. With --init-from it comes from config.json."},
    {"model.mlp_ratio", "number or fraction", "\"8/3\"", "",
     "FFN width = multiple_of × ceil(int(hidden_size × mlp_ratio) / multiple_of); a fraction is "
     "written as a string."},
    {"model.multiple_of", "integer", "256", "", "The FFN width is rounded up to a multiple of this."},
    {"model.norm_eps", "float", "1e-5", "", "RMSNorm epsilon (InternEvo's layer_norm_epsilon)."},
    {"model.rope_base", "float", "10000.0", "", "RoPE base: inv_freq = rope_base^(−2i/head_dim)."},
    {"model.qkv_bias", "boolean", "false", "", "Bias on the wqkv projection."},
    {"model.o_bias", "boolean", "false", "", "Bias on the wo projection."},
    {"model.mlp_bias", "boolean", "false", "",
     "Biases on the FFN's w1, w3 and w2 (Llama's mlp_bias: gate/up/down_proj); model.type = "
     "\"llama\" only."},
    {"model.tie_word_embeddings", "boolean", "false", "",
     "The output head is the token embedding (one tensor; Hugging Face's tie_word_embeddings). "
     "Every layout: under tensor parallel the one table is split on vocabulary rows as the head "
     "(Megatron's vocab-parallel embedding)."},
    {"model.checkpoint", "boolean", "false", "",
     "Activation recomputation: each block's forward runs again in backward (less memory)."},
    {"model.dtype", "string", "\"float32\"", "",
     "GEMM precision: \"float32\", \"bfloat16\" (mixed precision: bf16 GEMM inputs, fp32 "
     "accumulation, fp32 master weights, optimizer state and checkpoints; needs AVX512-BF16) or "
     "\"auto\" (bfloat16 where the CPU has AVX512-BF16, else float32); \"torch.float32\" and "
     "\"torch.bfloat16\" are accepted (docs/training.md)."},

    // [data]: docs/data.md.
    {"data.train_folder", "path", "", kRequired,
     "Tokenized training data: one file or a folder of files in any format of docs/data.md."},
    {"data.valid_folder", "path", "\"\"", "", "Held-out data for valid_loss; empty: no validation."},
    {"data.seq_len", "integer", "", kRequired,
     "Longest attention segment L; a packed row holds micro_bsz × seq_len tokens."},
    {"data.micro_bsz", "integer", "", kRequired,
     "Sequences per row: a row has P = micro_bsz × seq_len tokens."},
    {"data.micro_num", "integer", "1", "",
     "Rows (micro-batches) per step and data-parallel rank; gradients accumulate over them."},
    {"data.use_packed_dataset", "boolean", "true", "",
     "true: documents concatenated and cut into P-token rows; false: micro_bsz documents per row, "
     "each truncated to seq_len."},
    {"data.pack_sample_into_one", "boolean", "false", "",
     "Packed rows attend in fixed seq_len windows that ignore document boundaries (InternEvo's "
     "option)."},
    {"data.pack_tail", "string", "\"pad\"", "",
     "The last partial packed row of a file: \"pad\" (one pad segment, no loss) or \"drop\"."},
    {"data.shuffle", "boolean", "true", "",
     "Shuffle the documents of each file and the rows (NumPy RandomState order, as InternEvo)."},
    {"data.seed", "integer", "1024", "", "Seed of the document and row shuffles, in [0, 2^32)."},
    {"data.min_length", "integer", "0", "",
     "Documents shorter than this many tokens are dropped before packing."},
    {"data.balance", "string", "\"none\"", "",
     "Balance attention work over data-parallel ranks: \"none\" (rows in data order), \"rows\" "
     "(a step's rows re-assigned to ranks and micro-batches by cost) or \"documents\" (documents "
     "packed into rows by cost within a window); docs/balance.md."},
    {"data.balance_window", "integer", "8", "",
     "data.balance = \"documents\": steps' worth of documents repacked together."},
    {"data.balance_cost", "array of 2 numbers", "", "a and b from the model's FLOP count",
     "Row cost model a × tokens + b × causal pairs over its segments (docs/balance.md)."},
    {"data.split_documents", "boolean", "true", "",
     "false: a document that does not fit the rest of a row starts the next row (the rest is "
     "padding); a document longer than a row is still cut."},

    // [optimizer]: AdamW (docs/training.md).
    {"optimizer.lr", "float", "0.001", "", "Peak learning rate."},
    {"optimizer.beta1", "float", "0.9", "", "AdamW β1, in [0, 1)."},
    {"optimizer.beta2", "float", "0.95", "", "AdamW β2, in [0, 1)."},
    {"optimizer.eps", "float", "1e-8", "", "AdamW ε."},
    {"optimizer.weight_decay", "float", "0.01", "",
     "Decoupled weight decay, on matrices only (not norms or biases)."},
    {"optimizer.clip_grad_norm", "float", "1.0", "",
     "Global gradient-norm clipping threshold; <= 0: no clipping."},

    // [lr_scheduler]: linear warmup, then cosine decay (docs/training.md).
    {"lr_scheduler.warmup_steps", "integer", "0", "",
     "Linear warmup: lr × s / warmup_steps at step s, then cosine decay."},
    {"lr_scheduler.min_lr", "float", "", "0.1 × optimizer.lr",
     "Learning rate at train.total_steps, the end of the cosine decay."},

    // [parallel]: InternEvo's names (docs/parallel.md, docs/isp.md, docs/tp2d.md).
    {"parallel.tensor.size", "integer", "1", "",
     "Tensor-parallel group size T (consecutive ranks); `parallel.tensor = T` is short for "
     "{size = T}."},
    {"parallel.tensor.mode", "string", "\"mtp\"", "",
     "\"mtp\" (Megatron TP), \"msp\" (with sequence parallel), \"fsp\" (MSP gathering again in "
     "backward) or \"isp\" (InternEvo's Ulysses + weight parallel)."},
    {"parallel.weight.size", "integer", "1", "",
     "ISP weight-parallel group size W: linear weights sharded over W consecutive ranks."},
    {"parallel.weight.overlap", "boolean", "false", "",
     "ISP: all-gather the next weight while the current one computes."},
    {"parallel.zero1.size", "integer", "-1", "",
     "ZeRO-1 optimizer-state sharding group: -1 the whole data-parallel group, 1 off."},
    {"parallel.tensor_2d.x", "integer", "", "1 once the table is given; no table: 2D TP off",
     "2D tensor parallel (MindSpeed): size of the x groups (consecutive ranks); tp = x × y."},
    {"parallel.tensor_2d.y", "integer", "", "1 once the table is given",
     "2D tensor parallel: size of the y groups (ranks x apart)."},
    {"parallel.tensor_2d.overlap", "string", "", "\"none\" once the table is given",
     "2D tensor parallel forward overlap (MindSpeed's names): \"none\", \"ag_with_matmul\" "
     "(all-gather with the matmul) or \"matmul_with_rs\" (matmul with the reduce-scatter); one at "
     "a time."},
    {"parallel.sequence_2D.enable", "boolean", "false", "",
     "ISP 2D-Attention (InternEvo, LoongTrain): Ulysses over head groups × context parallel "
     "attention over context groups (ring attention, docs/isp.md). While false the other "
     "sequence_2D keys are read and checked but have no effect (as in InternEvo's configs)."},
    {"parallel.sequence_2D.head_size", "integer", "1", "",
     "2D-Attention head-parallel size; head_size × context_size = parallel.tensor.size."},
    {"parallel.sequence_2D.context_size", "integer", "1", "",
     "2D-Attention context-parallel size C (free of the head count)."},
    {"parallel.sequence_2D.window_size", "integer", "1", "",
     "LoongTrain's double ring: inner rings of window_size context ranks, an outer ring between them; must divide context_size."},
    {"parallel.sequence_2D.balance", "string", "\"zigzag\"", "",
     "Token-to-context-rank assignment: \"contiguous\", \"zigzag\" or \"document\" "
     "(per-document zigzag + greedy, docs/isp.md)."},
    {"parallel.sequence_2D.device_placement_strategy.head_first", "boolean", "true", "",
     "Head groups of consecutive ranks (else context groups consecutive)."},
    {"parallel.sequence_2D.device_placement_strategy.interleaved", "boolean", "false", "",
     "InternEvo's interleaved context ranks for window_size > 1; needs head_first = false when "
     "head_size > 1."},

    // [train]: the job (docs/training.md).
    {"train.total_steps", "integer", "", kRequired, "Optimizer steps of the run."},
    {"train.seed", "integer", "0", "", "Seed of the parameter initialisation."},
    {"train.num_threads", "integer", "0", "",
     "Threads per rank (OpenMP and BLAS), at most 4096; 0: the cores ÷ the ranks on the node, at "
     "least 1."},
    {"train.log_every", "integer", "1", "",
     "A console and metrics row every N steps (and at the last step)."},
    {"train.valid_every", "integer", "0", "",
     "Validation every N steps; 0: only at step 0 and at the end."},
    {"train.save_every", "integer", "0", "", "A checkpoint every N steps; 0: only at the end."},
    {"train.checkpoint_dir", "path", "\"\"", "",
     "Checkpoint root (step_N/ folders and `latest`); empty: no checkpoints."},
    {"train.metrics_file", "path", "\"\"", "",
     "JSON-lines metrics (a loss picture <stem>.png is written next to it); empty: console only."},
    {"train.loss_reduction", "string", "\"token\"", "",
     "\"token\": token-weighted mean over the step; \"micro_mean\": the mean of per-micro-batch "
     "means (InternEvo's)."},
    {"train.max_skipped_steps", "integer", "5", "",
     "Consecutive steps with a non-finite loss or gradient norm (updates skipped) that end the run "
     "with an error; the last good checkpoint stays."},
};

std::string table_of(const std::string& key) { return key.substr(0, key.rfind('.')); }
std::string leaf_of(const std::string& key) { return key.substr(key.rfind('.') + 1); }
std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

/// `text` as comment lines of at most ~100 columns.
std::string comment(const std::string& text) {
  std::string out, line = "#";
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find(' ', b);
    if (e == std::string::npos) e = text.size();
    const std::string word = text.substr(b, e - b);
    if (line.size() > 1 && line.size() + 1 + word.size() > 100) {
      out += line + "\n";
      line.assign(1, '#');  // not `line = "#"`: GCC 12's false -Wrestrict there (GCC bug 105329)
    }
    line += " " + word;
    b = e + 1;
  }
  return out + line + "\n";
}

std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

const std::vector<ConfigKey>& config_keys() { return kConfigKeys; }

bool is_config_key(const std::string& key) {
  return std::any_of(kConfigKeys.begin(), kConfigKeys.end(), [&](const ConfigKey& k) {
    return k.key == key || k.key.rfind(key + ".", 0) == 0;
  });
}

std::string default_config_toml() {
  std::string out =
      "# longtron training config: every key with its default (`longtron config --defaults`).\n"
      "# Keys without a default are commented out: required keys must be set here or with\n"
      "# `--set section.key=value`. Meanings and types: docs/configuration.md.\n";
  std::string table;
  for (size_t i = 0; i < kConfigKeys.size(); ++i) {
    const ConfigKey& k = kConfigKeys[i];
    if (table_of(k.key) != table) {
      table = table_of(k.key);
      // A table whose keys are all unset stays commented: its mere presence switches a feature on.
      bool any_value = false;
      for (size_t j = i; j < kConfigKeys.size() && table_of(kConfigKeys[j].key) == table; ++j)
        any_value = any_value || !kConfigKeys[j].value.empty();
      out += fmt::format("\n{}[{}]\n", any_value ? "" : "# ", table);
    }
    if (k.value.empty()) {
      out += comment(k.meaning);
      out += fmt::format("# {} = <{}>   # {}\n", leaf_of(k.key), k.type, k.absent);
    } else {
      out += comment(k.meaning + " (" + k.type + ")");
      out += fmt::format("{} = {}\n", leaf_of(k.key), k.value);
    }
  }
  return out;
}

std::string config_markdown() {
  std::string out =
      "# Configuration\n\n"
      "<!-- Generated from the key table in src/train/config_keys.cpp by `longtron config "
      "--markdown`;\n     edit the table, then run `build/longtron config --markdown > "
      "docs/configuration.md`. -->\n\n"
      "A training job is one TOML file (`longtron train --config FILE.toml`) with the sections\n"
      "`[model]`, `[data]`, `[optimizer]`, `[lr_scheduler]`, `[parallel]` and `[train]`; key names\n"
      "follow InternEvo's `config.py` where it has one. `longtron config --defaults` prints the\n"
      "whole file with every default. `--set section.key=value` (repeatable) overrides a key: the\n"
      "value is read as a TOML value when it parses as one (numbers, `true`/`false`, quoted\n"
      "strings, inline tables), else as a bare string; dotted keys reach sub-tables\n"
      "(`--set parallel.tensor.size=2`). Relative paths resolve from the working directory.\n"
      "Unknown keys, wrong types and out-of-range values are errors naming the key and where it\n"
      "was set. Examples: `configs/`.\n";
  std::string section;
  for (const ConfigKey& k : kConfigKeys) {
    if (section_of(k.key) != section) {
      section = section_of(k.key);
      out += fmt::format("\n## `[{}]`\n\n| key | type | default | meaning |\n|---|---|---|---|\n",
                         section);
    }
    const std::string def = k.value.empty() ? "*" + k.absent + "*" : "`" + k.value + "`";
    out += fmt::format("| `{}` | {} | {} | {} |\n", k.key, k.type, cell(def), cell(k.meaning));
  }
  return out;
}

}  // namespace longtron::train
