#include "train/config_keys.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "model/families.h"
#include "ops/precision.h"
#include "packing/pair_pack.h"
#include "train/config_binding.h"

namespace longtron::train {
namespace {

const char* toml_type_name(const toml::node& n) {
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

/// The member a key binds: a function from the config to it. Written AT(model.vocab_size).
template <class T>
using Access = T& (*)(TrainConfig&);
#define AT(member) +[](TrainConfig& c) -> auto& { return c.member; }

/// A member of type T: reads and writes go through `at_` (the const config of write() is only
/// read).
template <class T>
class Member : public KeyMember {
 public:
  explicit Member(Access<T> at) : at_(at) {}

 protected:
  T& of(TrainConfig& c) const { return at_(c); }
  const T& of(const TrainConfig& c) const { return at_(const_cast<TrainConfig&>(c)); }

 private:
  Access<T> at_;
};

class IntegerMember final : public Member<int64_t> {
 public:
  using Member::Member;
  const char* type_name() const override { return "integer"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (!n.is_integer()) wrong_type(p.at, "an integer", n);
    of(c) = n.as_integer()->get();
  }
  nlohmann::json write(const TrainConfig& c) const override { return of(c); }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_number_integer()) return false;
    of(c) = v.get<int64_t>();
    return true;
  }
};

/// A float; an integer is taken as its value. With `fraction`, also "a/b" written as a string
/// (model.mlp_ratio = "8/3": TOML has no fractions).
class RealMember final : public Member<double> {
 public:
  RealMember(Access<double> at, bool fraction) : Member(at), fraction_(fraction) {}
  const char* type_name() const override { return fraction_ ? "number or fraction" : "float"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (n.is_integer()) {
      of(c) = double(n.as_integer()->get());
    } else if (n.is_floating_point()) {
      of(c) = n.as_floating_point()->get();
    } else if (fraction_ && n.is_string()) {
      const std::string s = n.as_string()->get();
      double a = 0, b = 0;
      char slash = 0, extra = 0;
      std::istringstream in(s);
      if (!(in >> a >> slash >> b) || slash != '/' || b == 0 || (in >> extra))
        fail("{}: expected a number or a fraction like \"8/3\", got \"{}\"", p.at, s);
      of(c) = a / b;
    } else {
      wrong_type(p.at, "a number", n);
    }
  }
  nlohmann::json write(const TrainConfig& c) const override { return of(c); }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_number()) return false;
    of(c) = v.get<double>();
    return true;
  }

 private:
  bool fraction_;
};

class BooleanMember final : public Member<bool> {
 public:
  using Member::Member;
  const char* type_name() const override { return "boolean"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (!n.is_boolean()) wrong_type(p.at, "true or false", n);
    of(c) = n.as_boolean()->get();
  }
  nlohmann::json write(const TrainConfig& c) const override { return of(c); }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_boolean()) return false;
    of(c) = v.get<bool>();
    return true;
  }
};

/// A string: kept as written ("string"), one of ops::canonical_dtype's spellings stored canonical
/// ("dtype"), or a path made absolute from the working directory ("path", docs/configuration.md).
class StringMember final : public Member<std::string> {
 public:
  enum class Form { kText, kDtype, kPath };
  StringMember(Access<std::string> at, Form form) : Member(at), form_(form) {}
  const char* type_name() const override { return form_ == Form::kPath ? "path" : "string"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (!n.is_string()) wrong_type(p.at, form_ == Form::kPath ? "a path string" : "a string", n);
    const std::string s = n.as_string()->get();
    switch (form_) {
      case Form::kText: of(c) = s; break;
      case Form::kDtype:
        of(c) = ops::canonical_dtype(s);
        check(!of(c).empty(), "{}: \"{}\" is not one of float32 | bfloat16 | auto (or torch.float32 | "
              "torch.bfloat16)", p.at, s);
        break;
      case Form::kPath:
        of(c) = s.empty() ? s : std::filesystem::absolute(s).lexically_normal().string();
        break;
    }
  }
  nlohmann::json write(const TrainConfig& c) const override { return of(c); }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_string()) return false;
    const std::string s = v.get<std::string>();
    if (form_ == Form::kDtype && ops::canonical_dtype(s).empty()) return false;
    of(c) = form_ == Form::kDtype ? ops::canonical_dtype(s) : s;
    return true;
  }

 private:
  Form form_;
};

/// An array of numbers (integers or floats), e.g. data.balance_cost = [1.0, 0.5].
class NumbersMember final : public Member<std::vector<double>> {
 public:
  using Member::Member;
  const char* type_name() const override { return "array of 2 numbers"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (!n.is_array()) wrong_type(p.at, "an array of numbers", n);
    std::vector<double>& out = of(c);
    out.clear();
    for (const toml::node& e : *n.as_array()) {
      if (e.is_integer())
        out.push_back(double(e.as_integer()->get()));
      else if (e.is_floating_point())
        out.push_back(e.as_floating_point()->get());
      else
        wrong_type(p.at, "an array of numbers", n);
    }
  }
  nlohmann::json write(const TrainConfig& c) const override { return of(c); }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_array()) return false;
    std::vector<double> out;
    for (const auto& e : v) {
      if (!e.is_number()) return false;
      out.push_back(e.get<double>());
    }
    of(c) = std::move(out);
    return true;
  }
};

/// An array of strings, e.g. lora.targets = ["q_proj", "v_proj"].
class StringsMember final : public Member<std::vector<std::string>> {
 public:
  using Member::Member;
  const char* type_name() const override { return "array of strings"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (n.is_string()) {  // one name (e.g. "all-linear"), as PEFT's target_modules accepts
      of(c) = {n.as_string()->get()};
      return;
    }
    if (!n.is_array()) wrong_type(p.at, "an array of strings", n);
    std::vector<std::string>& out = of(c);
    out.clear();
    for (const toml::node& e : *n.as_array()) {
      if (!e.is_string()) wrong_type(p.at, "an array of strings", n);
      out.push_back(e.as_string()->get());
    }
  }
  nlohmann::json write(const TrainConfig& c) const override { return of(c); }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_array()) return false;
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.is_string()) return false;
      out.push_back(e.get<std::string>());
    }
    of(c) = std::move(out);
    return true;
  }
};

/// One name of an enum's name table, stored as the enum: the string becomes the value once, here.
template <class E, size_t N>
class ChoiceMember final : public Member<E> {
 public:
  ChoiceMember(Access<E> at, const std::array<EnumName<E>, N>& names) : Member<E>(at), names_(names) {}
  const char* type_name() const override { return "string"; }
  void read(TrainConfig& c, const toml::node& n, const KeyPlace& p) const override {
    if (!n.is_string()) wrong_type(p.at, "a string", n);
    const std::string s = n.as_string()->get();
    const std::optional<E> value = find_enum(names_, s);
    if (!value) fail("{}: \"{}\" is not one of {}", p.origin, s, enum_names(names_, " | "));
    this->of(c) = *value;
  }
  nlohmann::json write(const TrainConfig& c) const override {
    return enum_name(names_, this->of(c));
  }
  bool read_json(TrainConfig& c, const nlohmann::json& v) const override {
    if (!v.is_string()) return false;
    const std::optional<E> value = find_enum(names_, v.get<std::string>());
    if (value) this->of(c) = *value;
    return value.has_value();
  }

 private:
  const std::array<EnumName<E>, N>& names_;
};

using MemberPtr = std::shared_ptr<const KeyMember>;
MemberPtr integer(Access<int64_t> at) { return std::make_shared<IntegerMember>(at); }
MemberPtr real(Access<double> at) { return std::make_shared<RealMember>(at, false); }
MemberPtr fraction(Access<double> at) { return std::make_shared<RealMember>(at, true); }
MemberPtr boolean(Access<bool> at) { return std::make_shared<BooleanMember>(at); }
MemberPtr text(Access<std::string> at) {
  return std::make_shared<StringMember>(at, StringMember::Form::kText);
}
MemberPtr dtype(Access<std::string> at) {
  return std::make_shared<StringMember>(at, StringMember::Form::kDtype);
}
MemberPtr path(Access<std::string> at) {
  return std::make_shared<StringMember>(at, StringMember::Form::kPath);
}
MemberPtr numbers(Access<std::vector<double>> at) { return std::make_shared<NumbersMember>(at); }
MemberPtr strings(Access<std::vector<std::string>> at) {
  return std::make_shared<StringsMember>(at);
}
template <class E, size_t N>
MemberPtr choice(Access<E> at, const std::array<EnumName<E>, N>& names) {
  return std::make_shared<ChoiceMember<E, N>>(at, names);
}


const char* kRequired = "required";
const char* kRequiredShape = "required unless `--init-from` or `--resume` gives the shape";

// section.key, default (TOML), meaning of an absent key when no default is written, meaning, and
// the member it sets (its type column follows from the member).
const std::vector<ConfigKey> kConfigKeys = {
    // [model]: InternEvo's config.py `model` names (docs/model.md).
    {"model.type", "\"internlm2\"", "",
     "Model family: " + model::or_list(model::model_types()) +
         " (docs/families.md). It chooses the tensor names and config.json keys of checkpoints, "
         "--dump-grads and export; with --init-from it comes from config.json.",
     text(AT(model.type))},
    {"model.vocab_size", "", kRequiredShape,
     "Vocabulary size: rows of the token embedding and of the output head (more than the largest "
     "token id of the data).",
     integer(AT(model.vocab_size))},
    {"model.hidden_size", "", kRequiredShape, "Width H of the residual stream.",
     integer(AT(model.hidden_size))},
    {"model.num_layers", "", kRequiredShape, "Number of transformer blocks.",
     integer(AT(model.num_layers))},
    {"model.num_attention_heads", "", kRequiredShape,
     "Query heads; divides hidden_size (head dim = hidden_size / num_attention_heads).",
     integer(AT(model.num_attention_heads))},
    {"model.num_kv_attention_heads", "", kRequiredShape,
     "Key/value heads (grouped-query attention); divides num_attention_heads.",
     integer(AT(model.num_kv_attention_heads))},
    {"model.head_dim", "0", "",
     "Features per attention head when not hidden_size / num_attention_heads (Hugging Face's "
     "head_dim); 0: hidden_size / num_attention_heads.",
     integer(AT(model.explicit_head_dim))},
    {"model.sliding_window", "0", "",
     "Sliding-window attention (" + model::or_list(model::window_families()) +
         "): a query sees the last sliding_window keys of its document, in every layer; 0: none. "
         "With --init-from it comes from config.json (Qwen2, Qwen3: only layers >= "
         "max_window_layers).",
     integer(AT(model.sliding_window))},
    {"model.mlp_ratio", "\"8/3\"", "",
     "FFN width = multiple_of × ceil(int(hidden_size × mlp_ratio) / multiple_of); a fraction is "
     "written as a string.",
     fraction(AT(model.mlp_ratio))},
    {"model.multiple_of", "256", "", "The FFN width is rounded up to a multiple of this.",
     integer(AT(model.multiple_of))},
    {"model.norm_eps", "1e-5", "", "RMSNorm epsilon (InternEvo's layer_norm_epsilon).",
     real(AT(model.norm_eps))},
    {"model.rope_base", "10000.0", "", "RoPE base: inv_freq = rope_base^(−2i/head_dim).",
     real(AT(model.rope_base))},
    {"model.qkv_bias", "false", "", "Bias on the wqkv projection.",
     boolean(AT(model.qkv_bias))},
    {"model.o_bias", "false", "", "Bias on the wo projection.",
     boolean(AT(model.o_bias))},
    {"model.mlp_bias", "false", "",
     "Biases on the FFN's w1, w3 and w2 (Llama's mlp_bias: gate/up/down_proj); model.type = "
     "\"llama\" only.",
     boolean(AT(model.mlp_bias))},
    {"model.tie_word_embeddings", "false", "",
     "The output head is the token embedding (one tensor; Hugging Face's tie_word_embeddings). "
     "Every layout: under tensor parallel the one table is split on vocabulary rows as the head "
     "(Megatron's vocab-parallel embedding).",
     boolean(AT(model.tie_word_embeddings))},
    {"model.checkpoint", "false", "",
     "Activation recomputation: each block's forward runs again in backward (less memory).",
     boolean(AT(model.checkpoint))},
    {"model.chunk_tokens", "4096", "",
     "With model.checkpoint: tokens per chunk of the recomputed blocks' token-wise parts (norms, "
     "linears, MLP, head and cross-entropy), so only attention holds row-sized tensors; the "
     "attention kernels run over groups of whole documents of about 4 × this many tokens "
     "(docs/memory.md). Smaller: less memory, thinner GEMMs.",
     integer(AT(model.chunk_tokens))},
    {"model.dtype", "\"float32\"", "",
     "GEMM precision: \"float32\", \"bfloat16\" (mixed precision: bf16 GEMM inputs, fp32 "
     "accumulation, fp32 master weights, optimizer state and checkpoints; needs AVX512-BF16) or "
     "\"auto\" (bfloat16 where the CPU has AVX512-BF16, else float32); \"torch.float32\" and "
     "\"torch.bfloat16\" are accepted (docs/training.md).",
     dtype(AT(model.dtype))},

    // [data]: docs/data.md.
    {"data.train_folder", "", kRequired,
     "Tokenized training data: one file or a folder of files in any format of docs/data.md.",
     path(AT(data.train_folder))},
    {"data.valid_folder", "\"\"", "", "Held-out data for valid_loss; empty: no validation.",
     path(AT(data.valid_folder))},
    {"data.seq_len", "", kRequired,
     "Longest attention segment L; a packed row holds micro_bsz × seq_len tokens.",
     integer(AT(data.seq_len))},
    {"data.micro_bsz", "", kRequired,
     "Sequences per row: a row has P = micro_bsz × seq_len tokens.",
     integer(AT(data.micro_bsz))},
    {"data.micro_num", "1", "",
     "Rows (micro-batches) per step and data-parallel rank; gradients accumulate over them.",
     integer(AT(data.micro_num))},
    {"data.use_packed_dataset", "true", "",
     "true: documents concatenated and cut into P-token rows; false: micro_bsz documents per row, "
     "each truncated to seq_len.",
     boolean(AT(data.use_packed_dataset))},
    {"data.pack_sample_into_one", "false", "",
     "Packed rows attend in fixed seq_len windows that ignore document boundaries (InternEvo's "
     "option).",
     boolean(AT(data.pack_sample_into_one))},
    {"data.pack_tail", "\"pad\"", "",
     "The last partial packed row of a file: \"pad\" (one pad segment, no loss) or \"drop\".",
     choice(AT(data.pack_tail), data::kPackTailNames)},
    {"data.shuffle", "true", "",
     "Shuffle the documents of each file and the rows (NumPy RandomState order, as InternEvo).",
     boolean(AT(data.shuffle))},
    {"data.seed", "1024", "", "Seed of the document and row shuffles, in [0, 2^32).",
     integer(AT(data.seed))},
    {"data.min_length", "0", "",
     "Documents shorter than this many tokens are dropped before packing.",
     integer(AT(data.min_length))},
    {"data.balance", "\"none\"", "",
     "Balance attention work over data-parallel ranks: \"none\" (rows in data order), \"rows\" "
     "(a step's rows re-assigned to ranks and micro-batches by cost) or \"documents\" (documents "
     "packed into rows by cost within a window); docs/balance.md.",
     choice(AT(data.balance), data::kBalanceModeNames)},
    {"data.balance_window", "8", "",
     "data.balance = \"documents\": steps' worth of documents repacked together.",
     integer(AT(data.balance_window))},
    {"data.balance_cost", "", "a and b from the model's FLOP count",
     "Row cost model a × tokens + b × causal pairs over its segments (docs/balance.md).",
     numbers(AT(data.balance_cost))},
    {"data.split_documents", "true", "",
     "false: a document that does not fit the rest of a row starts the next row (the rest is "
     "padding); a document longer than a row is still cut.",
     boolean(AT(data.split_documents))},

    // [optimizer]: AdamW (docs/training.md).
    {"optimizer.lr", "0.001", "", "Peak learning rate.",
     real(AT(optimizer.lr))},
    {"optimizer.beta1", "0.9", "", "AdamW β1, in [0, 1).",
     real(AT(optimizer.beta1))},
    {"optimizer.beta2", "0.95", "", "AdamW β2, in [0, 1).",
     real(AT(optimizer.beta2))},
    {"optimizer.eps", "1e-8", "", "AdamW ε.",
     real(AT(optimizer.eps))},
    {"optimizer.weight_decay", "0.01", "",
     "Decoupled weight decay, on matrices only (not norms or biases).",
     real(AT(optimizer.weight_decay))},
    {"optimizer.clip_grad_norm", "1.0", "",
     "Global gradient-norm clipping threshold; <= 0: no clipping.",
     real(AT(optimizer.clip_grad_norm))},

    // [lr_scheduler]: linear warmup, then cosine decay (docs/training.md).
    {"lr_scheduler.warmup_steps", "0", "",
     "Linear warmup: lr × s / warmup_steps at step s, then cosine decay.",
     integer(AT(lr_scheduler.warmup_steps))},
    {"lr_scheduler.min_lr", "", "0.1 × optimizer.lr",
     "Learning rate at train.total_steps, the end of the cosine decay.",
     real(AT(lr_scheduler.min_lr))},

    // [parallel]: InternEvo's names (docs/parallel.md, docs/isp.md, docs/tp2d.md).
    {"parallel.tensor.size", "1", "",
     "Tensor-parallel group size T (consecutive ranks); `parallel.tensor = T` is short for "
     "{size = T}.",
     integer(AT(parallel.tensor.size))},
    {"parallel.tensor.mode", "\"mtp\"", "",
     "\"mtp\" (Megatron TP), \"msp\" (with sequence parallel), \"fsp\" (MSP gathering again in "
     "backward) or \"isp\" (InternEvo's Ulysses + weight parallel).",
     choice(AT(parallel.tensor.mode), parallel::kTensorModeNames)},
    {"parallel.weight.size", "1", "",
     "ISP weight-parallel group size W: linear weights sharded over W consecutive ranks.",
     integer(AT(parallel.weight.size))},
    {"parallel.weight.overlap", "false", "",
     "ISP: all-gather the next weight while the current one computes.",
     boolean(AT(parallel.weight.overlap))},
    {"parallel.zero1.size", "-1", "",
     "ZeRO-1 optimizer-state sharding group: -1 the whole data-parallel group, 1 off.",
     integer(AT(parallel.zero1.size))},
    {"parallel.tensor_2d.x", "", "1 once the table is given; no table: 2D TP off",
     "2D tensor parallel (MindSpeed): size of the x groups (consecutive ranks); tp = x × y.",
     integer(AT(parallel.tensor_2d.x))},
    {"parallel.tensor_2d.y", "", "1 once the table is given",
     "2D tensor parallel: size of the y groups (ranks x apart).",
     integer(AT(parallel.tensor_2d.y))},
    {"parallel.tensor_2d.overlap", "", "\"none\" once the table is given",
     "2D tensor parallel forward overlap (MindSpeed's names): \"none\", \"ag_with_matmul\" "
     "(all-gather with the matmul) or \"matmul_with_rs\" (matmul with the reduce-scatter); one at "
     "a time.",
     choice(AT(parallel.tensor_2d.overlap), parallel::kOverlap2DNames)},
    {"parallel.sequence_2D.enable", "false", "",
     "ISP 2D-Attention (InternEvo, LoongTrain): Ulysses over head groups × context parallel "
     "attention over context groups (ring attention, docs/isp.md). While false the other "
     "sequence_2D keys are read and checked but have no effect (as in InternEvo's configs).",
     boolean(AT(parallel.sequence_2d.enable))},
    {"parallel.sequence_2D.head_size", "1", "",
     "2D-Attention head-parallel size; head_size × context_size = parallel.tensor.size.",
     integer(AT(parallel.sequence_2d.head_size))},
    {"parallel.sequence_2D.context_size", "1", "",
     "2D-Attention context-parallel size C (free of the head count).",
     integer(AT(parallel.sequence_2d.context_size))},
    {"parallel.sequence_2D.window_size", "1", "",
     "LoongTrain's double ring: inner rings of window_size context ranks, an outer ring between them; must divide context_size.",
     integer(AT(parallel.sequence_2d.window_size))},
    {"parallel.sequence_2D.balance", "\"zigzag\"", "",
     "Token-to-context-rank assignment: \"contiguous\", \"zigzag\" or \"document\" "
     "(per-document zigzag + greedy, docs/isp.md).",
     choice(AT(parallel.sequence_2d.balance), data::kContextBalanceNames)},
    {"parallel.sequence_2D.device_placement_strategy.head_first", "true", "",
     "Head groups of consecutive ranks (else context groups consecutive).",
     boolean(AT(parallel.sequence_2d.head_first))},
    {"parallel.sequence_2D.device_placement_strategy.interleaved", "false", "",
     "InternEvo's interleaved context ranks for window_size > 1; needs head_first = false when "
     "head_size > 1.",
     boolean(AT(parallel.sequence_2d.interleaved))},

    // [train]: the job (docs/training.md).
    {"train.total_steps", "", kRequired, "Optimizer steps of the run.",
     integer(AT(train.total_steps))},
    {"train.seed", "0", "", "Seed of the parameter initialisation.",
     integer(AT(train.seed))},
    {"train.num_threads", "0", "",
     "Threads per rank (OpenMP and BLAS), at most 4096; 0: the cores ÷ the ranks on the node, at "
     "least 1.",
     integer(AT(train.num_threads))},
    {"train.log_every", "1", "",
     "A console and metrics row every N steps (and at the last step).",
     integer(AT(train.log_every))},
    {"train.valid_every", "0", "",
     "Validation every N steps; 0: only at step 0 and at the end.",
     integer(AT(train.valid_every))},
    {"train.save_every", "0", "", "A checkpoint every N steps; 0: only at the end.",
     integer(AT(train.save_every))},
    {"train.checkpoint_dir", "\"\"", "",
     "Checkpoint root (step_N/ folders and `latest`); empty: no checkpoints.",
     path(AT(train.checkpoint_dir))},
    {"train.metrics_file", "\"\"", "",
     "JSON-lines metrics (a loss picture <stem>.png is written next to it); empty: console only.",
     path(AT(train.metrics_file))},
    {"train.loss_reduction", "\"token\"", "",
     "\"token\": token-weighted mean over the step; \"micro_mean\": the mean of per-micro-batch "
     "means (InternEvo's).",
     choice(AT(train.loss_reduction), kLossReductionNames)},
    {"train.max_skipped_steps", "5", "",
     "Consecutive steps with a non-finite loss or gradient norm (updates skipped) that end the run "
     "with an error; the last good checkpoint stays.",
     integer(AT(train.max_skipped_steps))},
    // [lora]: PEFT's LoraConfig names where it has one (r → rank, lora_alpha → alpha,
    // lora_dropout → dropout, target_modules → targets), docs/lora.md.
    {"lora.rank", "0", "",
     "LoRA rank r (0: off, full fine-tuning). With r > 0 the model is frozen and only low-rank "
     "adapters train: y = W x + s·B A dropout(x), A [r, in], B [out, r]; needs --init-from (or "
     "--resume) (docs/lora.md).",
     integer(AT(model.lora.rank))},
    {"lora.alpha", "8.0", "", "PEFT's lora_alpha: the scale s = alpha / rank.",
     real(AT(model.lora.alpha))},
    {"lora.dropout", "0.0", "",
     "Probability in [0, 1) of dropping an input feature of A in training (none in eval and "
     "generate); the mask is a function of (seed, step, layer, module, token position, feature).",
     real(AT(model.lora.dropout))},
    {"lora.targets", "[\"all-linear\"]", "",
     "The linears that get adapters, as the family's Hugging Face names: q_proj, k_proj, v_proj, "
     "o_proj, gate_proj, up_proj, down_proj (Llama, Qwen2, Mistral) or wqkv, wo, w1, w3, w2 "
     "(InternLM2); \"all-linear\": every linear but the head.",
     strings(AT(model.lora.targets))},
    {"lora.use_rslora", "false", "", "Rank-stabilised scale s = alpha / sqrt(rank) (rsLoRA).",
     boolean(AT(model.lora.use_rslora))},
    {"lora.base_dtype", "\"auto\"", "",
     "The frozen base's dtype: \"float32\", \"bfloat16\", or \"auto\" (bfloat16 when model.dtype "
     "resolves to bfloat16). A bfloat16 base under float32 compute is allowed and not exact.",
     choice(AT(model.lora.base_dtype), model::kLoraBaseDtypeNames)},
    {"lora.seed", "0", "", "Seed of A's initialisation and of dropout's masks.",
     integer(AT(model.lora.seed))},
    // [preference]: TRL's DPOConfig / ORPOConfig / CPOConfig names, docs/preference.md. Read
    // when the training data holds preference pairs.
    {"preference.loss_type", "\"sigmoid\"", "",
     "The pair loss when data.train_folder holds preference pairs, as TRL computes it "
     "(docs/preference.md): \"sigmoid\" (DPO), \"ipo\", \"hinge\" and \"robust\" against the "
     "reference model (the starting weights, frozen); \"orpo\" (ORPOTrainer) and \"simpo\" "
     "(CPOTrainer, no NLL term) need none.",
     choice(AT(preference.loss_type), kPreferenceLossNames)},
    {"preference.beta", "0.1", "",
     "β: the temperature of the log-ratios (orpo: the weight of the odds-ratio term).",
     real(AT(preference.beta))},
    {"preference.label_smoothing", "0.0", "",
     "ε in [0, 0.5): the label noise of cDPO (sigmoid), robust and simpo.",
     real(AT(preference.label_smoothing))},
    {"preference.simpo_gamma", "0.5", "", "SimPO's target reward margin γ (simpo).",
     real(AT(preference.simpo_gamma))},
    {"preference.max_length", "0", "",
     "Longest sequence (prompt + answer) in tokens, cut per truncation_mode; 0: none, and a "
     "sequence longer than data.seq_len is an error.",
     integer(AT(preference.max_length))},
    {"preference.truncation_mode", "\"keep_start\"", "",
     "How max_length cuts a sequence: \"keep_start\" keeps its first tokens, \"keep_end\" its "
     "last (the prompt loses its head).",
     choice(AT(preference.truncation_keep_end), data::kTruncationModeNames)},
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
      out.append(line).append(1, '\n');
      line.resize(1);  // "#" (GCC 12's -Wrestrict misfires on assigning or prefixing literals)
    }
    line.append(1, ' ').append(word);
    b = e + 1;
  }
  return out + line + "\n";
}

std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The tables with a rule of their own (parse_config, to_json).
const std::vector<ConfigTable> kConfigTables = {
    {"parallel.tensor", "an integer size or a table",
     +[](TrainConfig& c) -> bool& { return c.parallel.tensor_given; }, true, false},
    {"parallel.weight", "an integer size or a table", nullptr, true, false},
    {"parallel.zero1", "an integer size or a table", nullptr, true, false},
    {"parallel.tensor_2d", "a table {x, y, overlap}",
     +[](TrainConfig& c) -> bool& { return c.parallel.tensor_2d.given; }, false, true},
    {"parallel.sequence_2D", "a table {enable, head_size, context_size, ...}",
     +[](TrainConfig& c) -> bool& { return c.parallel.sequence_2d.given; }, false, false},
    {"parallel.sequence_2D.device_placement_strategy", "a table {head_first, interleaved}", nullptr,
     false, false},
};

}  // namespace

ConfigKey::ConfigKey(std::string key_, std::string value_, std::string absent_,
                     std::string meaning_, std::shared_ptr<const KeyMember> member_)
    : key(std::move(key_)),
      type(member_->type_name()),
      value(std::move(value_)),
      absent(std::move(absent_)),
      meaning(std::move(meaning_)),
      member(std::move(member_)) {}

[[noreturn]] void wrong_type(const std::string& where, const char* want, const toml::node& n) {
  fail("{}: expected {}, got {} ({})", where, want, toml_type_name(n), node_text(n));
}

const std::vector<ConfigTable>& config_tables() { return kConfigTables; }

const ConfigKey* find_config_key(const std::string& key) {
  const auto it = std::find_if(kConfigKeys.begin(), kConfigKeys.end(),
                               [&](const ConfigKey& k) { return k.key == key; });
  return it == kConfigKeys.end() ? nullptr : &*it;
}

const ConfigTable* find_config_table(const std::string& key) {
  const auto it = std::find_if(kConfigTables.begin(), kConfigTables.end(),
                               [&](const ConfigTable& t) { return key == t.key; });
  return it == kConfigTables.end() ? nullptr : &*it;
}

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
