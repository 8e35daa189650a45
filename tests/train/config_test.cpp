// TrainConfig: defaults, the --set grammar, and every error naming its key (docs/configuration.md).
#include "train/config.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "modes/engine.h"
#include "parallel/layout.h"
#include "train/memory_plan.h"

using longtron::Error;
using longtron::train::ConfigNeeds;
using longtron::train::parse_config;
using longtron::train::TrainConfig;
namespace fs = std::filesystem;

namespace {

const std::string kBase = R"(
[model]
vocab_size = 100
hidden_size = 32
num_layers = 2
num_attention_heads = 4
num_kv_attention_heads = 2

[data]
train_folder = "corpus/train"
seq_len = 16
micro_bsz = 2

[train]
total_steps = 10
)";

TrainConfig parse(const std::vector<std::string>& sets = {}, const std::string& text = kBase) {
  return parse_config(text, "job.toml", sets);
}

// Expects an Error whose message contains every part.
void expect_error(const std::vector<std::string>& sets, std::initializer_list<std::string> parts,
                  const std::string& text = kBase, const ConfigNeeds& needs = {}) {
  try {
    parse_config(text, "job.toml", sets, needs);
    FAIL() << "no error for --set " << (sets.empty() ? "" : sets.back());
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

}  // namespace

TEST(Config, DefaultsOfSpec41) {
  const TrainConfig c = parse();
  EXPECT_EQ(c.train.max_skipped_steps, 5);
  EXPECT_DOUBLE_EQ(c.model.mlp_ratio, 8.0 / 3.0);
  EXPECT_EQ(c.model.multiple_of, 256);
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.model.rope_base, 10000);
  EXPECT_FALSE(c.model.qkv_bias || c.model.o_bias || c.model.checkpoint);
  EXPECT_EQ(c.data.micro_num, 1);
  EXPECT_TRUE(c.data.use_packed_dataset);
  EXPECT_FALSE(c.data.pack_sample_into_one);
  EXPECT_EQ(c.data.pack_tail, longtron::data::PackTail::kPad);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.data.seed, 1024);
  EXPECT_EQ(c.data.min_length, 0);
  EXPECT_EQ(c.data.valid_folder, "");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer.clip_grad_norm, 1.0);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(c.lr_scheduler.min_lr, 1e-4);
  EXPECT_EQ(c.parallel.tensor.size, 1);
  EXPECT_EQ(c.parallel.tensor.mode, longtron::parallel::TensorMode::kMtp);
  EXPECT_EQ(c.parallel.weight.size, 1);
  EXPECT_FALSE(c.parallel.weight.overlap);
  EXPECT_EQ(c.parallel.zero1.size, -1);
  EXPECT_FALSE(c.parallel.tensor_2d.given);
  EXPECT_EQ(c.train.seed, 0);
  EXPECT_EQ(c.train.num_threads, 0);
  EXPECT_EQ(c.train.log_every, 1);
  EXPECT_EQ(c.train.valid_every, 0);
  EXPECT_EQ(c.train.save_every, 0);
  EXPECT_EQ(c.train.loss_reduction, longtron::train::LossReduction::kToken);
  EXPECT_EQ(c.model_keys_given.size(), 5u);
  // Relative paths resolve from the working directory.
  EXPECT_EQ(c.data.train_folder, (fs::current_path() / "corpus/train").lexically_normal().string());
}

TEST(Config, MinLrFollowsOverriddenLr) {
  EXPECT_DOUBLE_EQ(parse({"optimizer.lr=0.02"}).lr_scheduler.min_lr, 0.002);
  EXPECT_DOUBLE_EQ(parse({"optimizer.lr=0.02", "lr_scheduler.min_lr=0"}).lr_scheduler.min_lr, 0.0);
}

TEST(Config, SetGrammar) {
  const TrainConfig c = parse({"data.seq_len=64", "optimizer.lr=3e-4", "data.shuffle=false",
                               "train.loss_reduction=micro_mean", "data.pack_tail=\"drop\"",
                               "train.metrics_file=out/m.jsonl", "model.mlp_ratio=8/3",
                               "optimizer.weight_decay=0", "data.seq_len=128"});
  EXPECT_EQ(c.data.seq_len, 128);  // later wins
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.train.loss_reduction, longtron::train::LossReduction::kMicroMean);  // bare string
  EXPECT_EQ(c.data.pack_tail, longtron::data::PackTail::kDrop);  // quoted string
  EXPECT_EQ(c.train.metrics_file, (fs::current_path() / "out/m.jsonl").string());
  EXPECT_DOUBLE_EQ(c.model.mlp_ratio, 8.0 / 3.0);  // "8/3" is not TOML → string → fraction
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);  // an integer where a float is expected
}

TEST(Config, SetParallelTables) {
  auto c = parse({"parallel.tensor={size=2, mode=\"isp\"}", "parallel.zero1.size=1"});
  EXPECT_EQ(c.parallel.tensor.size, 2);
  EXPECT_EQ(c.parallel.tensor.mode, longtron::parallel::TensorMode::kIsp);
  EXPECT_EQ(c.parallel.zero1.size, 1);
  c = parse({" parallel.tensor = 4"});  // a bare integer means mtp; spaces are trimmed
  EXPECT_EQ(c.parallel.tensor.size, 4);
  EXPECT_EQ(c.parallel.tensor.mode, longtron::parallel::TensorMode::kMtp);
  // The file says tensor = 4; a dotted --set changes the mode and keeps the size.
  c = parse({"parallel.tensor.mode=fsp"}, kBase + "[parallel]\ntensor = 4\n");
  EXPECT_EQ(c.parallel.tensor.size, 4);
  EXPECT_EQ(c.parallel.tensor.mode, longtron::parallel::TensorMode::kFsp);
  c = parse({"parallel.tensor_2d.x=2", "parallel.tensor_2d.y=2", "parallel.weight.overlap=true"});
  EXPECT_TRUE(c.parallel.tensor_2d.given);
  EXPECT_EQ(c.parallel.tensor_2d.x * c.parallel.tensor_2d.y, 4);
  EXPECT_TRUE(c.parallel.weight.overlap);
}

TEST(Config, UnknownKeysNameTheFullKey) {
  expect_error({"data.seq_lenn=3"}, {"--set data.seq_lenn", "unknown key"});
  expect_error({}, {"job.toml:3: data.seq_lenn: unknown key"},
               "\n[data]\nseq_lenn = 4\n");
  expect_error({"parallel.tensor.sizee=2"}, {"parallel.tensor.sizee", "unknown key"});
  expect_error({"parallel.tensor_2d.z=2"}, {"parallel.tensor_2d.z", "unknown key"});
  expect_error({"modle.hidden_size=2"}, {"modle", "unknown section"});
}

TEST(Config, WrongTypesNameTheKey) {
  expect_error({"data.seq_len=abc"}, {"--set data.seq_len", "expected an integer", "abc"});
  expect_error({"data.seq_len=1.5"}, {"data.seq_len", "expected an integer", "float"});
  expect_error({"data.shuffle=1"}, {"data.shuffle", "true or false"});
  expect_error({"optimizer.lr=fast"}, {"optimizer.lr", "expected a number"});
  expect_error({"model.mlp_ratio=8/0"}, {"model.mlp_ratio", "fraction"});
  expect_error({"train.loss_reduction=3"}, {"train.loss_reduction", "expected a string"});
  expect_error({"parallel.tensor=\"big\""}, {"parallel.tensor", "integer size or a table"});
  expect_error({"parallel.tensor_2d=2"}, {"parallel.tensor_2d", "table"});
  expect_error({}, {"job.toml:1: data", "expected a table"}, "data = 3\n");
  expect_error({}, {"job.toml:3", "model.hidden_size", "expected an integer"},
               "[model]\nvocab_size = 1\nhidden_size = \"big\"\n");
}

// A --set error blames the --set argument, never the file the key is not in.
TEST(Config, SetErrorsBlameTheSetArgument) {
  for (const auto& [set, part] : std::vector<std::pair<std::string, std::string>>{
           {"foo.bar=1", "unknown section"},
           {"data.foo=1", "unknown key"},
           {"parallel.tensor.mode=xyz", "is not one of"},
           {"data.seq_len=0", "must be > 0"},
           {"model.vocab_size=0", "must be > 0"},
           {"model.sliding_window=16", "needs model.type = \"mistral\", \"qwen2\" or \"qwen3\""},
           {"train.max_skipped_steps=0", "must be > 0"}}) {
    try {
      parse({set});
      ADD_FAILURE() << "no error for --set " << set;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("--set " + set + ": ", 0), 0u) << message;
      EXPECT_NE(message.find(part), std::string::npos) << message;
      EXPECT_EQ(message.find("job.toml"), std::string::npos) << message;
    }
  }
  // A rule between keys blames the one given by --set, not the file the section is not in.
  for (const auto& [sets, part] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"parallel.tensor.size=2", "parallel.tensor.mode=isp", "parallel.sequence_2D.enable=true",
             "parallel.sequence_2D.context_size=4"},
            "must equal parallel.tensor.size"},
           {{"parallel.tensor.size=4", "parallel.tensor.mode=isp", "parallel.sequence_2D.enable=true",
             "parallel.sequence_2D.head_size=2", "parallel.sequence_2D.context_size=2",
             "parallel.sequence_2D.device_placement_strategy.interleaved=true"},
            "needs head_first = false"}}) {
    try {
      parse(sets);
      ADD_FAILURE() << "no error for --set " << sets.back();
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("--set " + sets.back() + ": ", 0), 0u) << message;
      EXPECT_NE(message.find(part), std::string::npos) << message;
      EXPECT_EQ(message.find("job.toml"), std::string::npos) << message;
    }
  }
  // The same mistakes in the file name the file.
  expect_error({}, {"job.toml: parallel.sequence_2D", "must equal parallel.tensor.size"},
               kBase + "[parallel]\ntensor = { size = 2, mode = \"isp\" }\n"
                       "sequence_2D = { enable = true, context_size = 4 }\n");
  expect_error({}, {"job.toml: parallel.tensor.mode", "is not one of"},
               kBase + "[parallel]\ntensor = { size = 1, mode = \"xyz\" }\n");
}

// An integer that does not fit 64 bits is "out of range", not "a string".
TEST(Config, HugeIntegerIsOutOfRange) {
  expect_error({"data.seq_len=12345678901234567890"},
               {"--set data.seq_len=12345678901234567890", "integer out of range"});
  expect_error({"data.seq_len=-12345678901234567890"}, {"integer out of range"});
  std::string text = kBase;
  text.replace(text.find("seq_len = 16"), 12, "seq_len = 12345678901234567890");
  try {
    parse({}, text);
    FAIL() << "no error for a 20-digit integer";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("job.toml:11:"), std::string::npos) << message;
    EXPECT_NE(message.find("out of range"), std::string::npos) << message;
    EXPECT_EQ(message.find("string"), std::string::npos) << message;
  }
  EXPECT_EQ(parse({"data.seq_len=9223372036854775807"}).data.seq_len, INT64_MAX);
}

TEST(Config, SetSyntaxErrors) {
  expect_error({"data.seq_len"}, {"--set data.seq_len", "section.key=value"});
  expect_error({"seq_len=4"}, {"--set seq_len=4", "no section"});
  expect_error({"data..seq_len=4"}, {"empty part"});
}

TEST(Config, TomlSyntaxErrorHasLine) {
  expect_error({}, {"job.toml:3"}, "[data]\nseq_len = 4\nmicro_bsz = = 2\n");
}

TEST(Config, RequiredKeysMissing) {
  for (const char* key : {"vocab_size", "hidden_size", "num_layers", "num_attention_heads",
                          "num_kv_attention_heads"}) {
    std::string text = kBase;
    text.erase(text.find(std::string(key) + " ="), text.find('\n', text.find(std::string(key) + " =")) -
                                                       text.find(std::string(key) + " =") + 1);
    expect_error({}, {std::string("model.") + key, "required key missing"}, text);
  }
  expect_error({}, {"data.train_folder", "required"}, "[data]\nseq_len = 4\nmicro_bsz = 1\n",
               {.model_shape = false});
  expect_error({}, {"data.seq_len", "required"}, "[data]\ntrain_folder = \"x\"\nmicro_bsz = 1\n",
               {.model_shape = false});
  expect_error({}, {"train.total_steps", "required"},
               "[data]\ntrain_folder = \"x\"\nseq_len = 4\nmicro_bsz = 1\n", {.model_shape = false});
  // Relaxed needs: a model from --init-from, no data.
  const auto c = parse_config("[train]\ntotal_steps = 3\n", "job.toml", {},
                              {.model_shape = false, .data = false});
  EXPECT_EQ(c.model.hidden_size, 0);
  EXPECT_TRUE(c.model_keys_given.empty());
}

TEST(Config, SanityChecksNameTheKey) {
  expect_error({"data.seq_len=0"}, {"data.seq_len", "> 0"});
  expect_error({"data.micro_bsz=-1"}, {"data.micro_bsz", "> 0"});
  expect_error({"data.micro_num=0"}, {"data.micro_num", "> 0"});
  expect_error({"train.total_steps=0"}, {"train.total_steps", "> 0"});
  expect_error({"model.hidden_size=30"}, {"model.num_attention_heads", "does not divide", "30"});
  expect_error({"model.num_kv_attention_heads=3"}, {"model.num_kv_attention_heads", "does not divide"});
  expect_error({"model.vocab_size=0"}, {"model.vocab_size", "> 0"});
  expect_error({"parallel.tensor.mode=sp"}, {"parallel.tensor.mode", "\"sp\"", "mtp | msp | fsp | isp"});
  expect_error({"train.loss_reduction=mean"}, {"train.loss_reduction", "token | micro_mean"});
  expect_error({"data.pack_tail=keep"}, {"data.pack_tail", "pad | drop"});
  expect_error({"parallel.tensor=2", "parallel.tensor_2d={x=2, y=1}"}, {"parallel.tensor_2d", "parallel.tensor"});
  expect_error({"parallel.tensor_2d.overlap=yes"}, {"parallel.tensor_2d.overlap"});
  expect_error({"parallel.zero1.size=0"}, {"parallel.zero1.size"});
  expect_error({"parallel.weight.size=0"}, {"parallel.weight.size"});
  expect_error({"optimizer.lr=inf"}, {"--set optimizer.lr=inf", "finite"});
  expect_error({"optimizer.eps=inf"}, {"--set optimizer.eps=inf", "finite"});
  expect_error({"optimizer.weight_decay=inf"}, {"--set optimizer.weight_decay=inf", "finite"});
  expect_error({"optimizer.clip_grad_norm=nan"}, {"--set optimizer.clip_grad_norm=nan", "nan"});
  expect_error({"model.rope_base=inf"}, {"--set model.rope_base=inf", "finite"});
  expect_error({"data.seed=4294967296"}, {"--set data.seed=4294967296", "[0, 2^32)"});
  EXPECT_EQ(parse({"data.seed=4294967295"}).data.seed, 4294967295);
  expect_error({"train.num_threads=2147483648"}, {"--set train.num_threads=2147483648", "[0, 4096]"});
  expect_error({"model.num_layers=9223372036854775807"}, {"--set model.num_layers", "too large"});
  expect_error({"model.multiple_of=9223372036854775807"}, {"--set model.multiple_of", "too large"});
  expect_error({"model.mlp_ratio=1e300"}, {"--set model.mlp_ratio", "FFN width"});
  // A warmup longer than the run is accepted (the trainer prints a notice).
  EXPECT_EQ(parse({"lr_scheduler.warmup_steps=11"}).lr_scheduler.warmup_steps, 11);
  expect_error({"lr_scheduler.min_lr=0.1"}, {"lr_scheduler.min_lr"});
  expect_error({"optimizer.beta2=1"}, {"optimizer.beta2"});
  expect_error({"optimizer.lr=0"}, {"optimizer.lr"});
  expect_error({"train.log_every=0"}, {"train.log_every"});
  expect_error({"train.num_threads=-2"}, {"train.num_threads"});
}

TEST(Config, ToJsonUsesSectionKeys) {
  const auto j = longtron::train::to_json(parse({"parallel.tensor_2d={x=2, y=2}"}));
  EXPECT_EQ(j["model"]["hidden_size"], 32);
  EXPECT_EQ(j["data"]["seq_len"], 16);
  EXPECT_EQ(j["parallel"]["tensor"]["mode"], "mtp");
  EXPECT_EQ(j["parallel"]["tensor_2d"]["x"], 2);
  EXPECT_EQ(j["train"]["total_steps"], 10);
  EXPECT_DOUBLE_EQ(j["lr_scheduler"]["min_lr"].get<double>(), 1e-4);
}

TEST(Config, TinyConfigLoads) {
  const auto c = longtron::train::load_config(fs::path(LONGTRON_SOURCE_DIR) / "configs/tiny.toml");
  EXPECT_EQ(c.model.ffn_size(), 192);
  EXPECT_EQ(c.data.micro_num, 2);
  EXPECT_TRUE(fs::path(c.train.checkpoint_dir).is_absolute());
  try {
    longtron::train::load_config("no/such.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such.toml"), std::string::npos);
  }
}

TEST(Config, BalanceKeys) {
  const TrainConfig d = parse();
  EXPECT_EQ(d.data.balance, longtron::data::BalanceMode::kNone);
  EXPECT_EQ(d.data.balance_window, 8);
  EXPECT_TRUE(d.data.balance_cost.empty());  // from the model's FLOPs
  const TrainConfig c = parse({"data.balance=documents", "data.balance_window=3",
                               "data.balance_cost=[2, 0.5]"});
  EXPECT_EQ(c.data.balance, longtron::data::BalanceMode::kDocuments);
  EXPECT_EQ(c.data.balance_window, 3);
  EXPECT_EQ(c.data.balance_cost, (std::vector<double>{2.0, 0.5}));
  EXPECT_EQ(longtron::train::to_json(c)["data"]["balance_cost"], nlohmann::json::array({2.0, 0.5}));
  expect_error({"data.balance=tokens"}, {"data.balance", "\"tokens\"", "none | rows | documents"});
  expect_error({"data.balance_window=0"}, {"data.balance_window", "> 0"});
  expect_error({"data.balance_cost=[1]"}, {"data.balance_cost", "got [1]"});
  expect_error({"data.balance_cost=[0, 0]"}, {"data.balance_cost", "not both 0"});
  expect_error({"data.balance_cost=[1, -1]"}, {"data.balance_cost", "got [1, -1]"});
  expect_error({"data.balance_cost=[1, \"a\"]"}, {"data.balance_cost", "an array of numbers"});
  expect_error({"data.balance=documents", "data.use_packed_dataset=false"},
               {"data.balance = \"documents\"", "data.use_packed_dataset"});
  expect_error({"data.balance=documents", "data.pack_sample_into_one=true"},
               {"data.pack_sample_into_one"});
  expect_error({"data.balance=documents", "data.split_documents=false"}, {"data.split_documents"});
  parse({"data.balance=rows", "data.use_packed_dataset=false"});  // "rows" works on any rows
}

// One set of names from the TOML to the engine: every parallel.tensor_2d.overlap value the config
// accepts builds a 2D engine, and every value it refuses the engine refuses too (the names once
// disagreed: "both" passed the config and failed the engine).
TEST(Config, Tensor2dOverlapNamesAreTheEngines) {
  const std::string with_2d = kBase + "\n[parallel]\ntensor_2d = {x = 1, y = 1}\n";
  for (const std::string name : {"none", "ag_with_matmul", "matmul_with_rs", "ag_matmul",
                                 "matmul_rs", "both", "yes", ""}) {
    bool config_ok = true, engine_ok = true;
    TrainConfig c;
    longtron::parallel::Layout layout;
    try {
      c = parse({"parallel.tensor_2d.overlap=" + name}, with_2d);
      layout = longtron::train::layout_of(c.parallel);
    } catch (const Error&) {
      config_ok = false;  // the config holds no such value: hand the name to the engine directly
      c = parse({}, with_2d);
      layout = longtron::train::layout_of(c.parallel);
      layout.tensor_2d_overlap = name;
    }
    try {
      const auto grid = longtron::parallel::make_grid(longtron::comm::make_local_communicator(), layout);
      longtron::parallel::ParallelEngine engine(c.model, grid, 1, c.data.seq_len);
      EXPECT_EQ(engine.mode(), "2d");
    } catch (const Error&) {
      engine_ok = false;
    }
    EXPECT_EQ(config_ok, engine_ok) << "'" << name << "': config " << config_ok << ", engine " << engine_ok;
  }
  EXPECT_NO_THROW(parse({"parallel.tensor_2d.overlap=ag_with_matmul"}, with_2d));
  expect_error({"parallel.tensor_2d.overlap=both"}, {"parallel.tensor_2d.overlap", "ag_with_matmul"}, with_2d);
}
