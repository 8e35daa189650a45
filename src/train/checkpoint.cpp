#include "train/checkpoint.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <exception>
#include <fstream>
#include <regex>
#include <set>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"
#include "core/json_read.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "core/shorten.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "parallel/shard_plan.h"

namespace longtron::train {
namespace fs = std::filesystem;
using nlohmann::json;
namespace st = safetensors;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  check(out.good(), "{}: cannot create ({})", path.string(), io_error_text());
  out << text;
  out.close();
  check(out.good(), "{}: write failed ({})", path.string(), io_error_text());
}

// The index of the first element of data[0, n) that is not finite, or (with `nonnegative`) is
// negative; -1 if none.
int64_t first_bad_value(const float* data, int64_t n, bool nonnegative) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i]) || (nonnegative && data[i] < 0)) return i;
  return -1;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Refuses to write a checkpoint holding a non-finite value (or a negative second moment): a
// checkpoint is only ever a state training can go on from.
void check_values(const std::vector<NamedTensor>& list, const char* what, bool nonnegative) {
  for (const auto& t : list) {
    if (t.data == nullptr) continue;  // as_f32 names it
    const int64_t i = first_bad_value(t.data, numel_of(t.shape), nonnegative);
    if (i >= 0)
      fail("checkpoint: {} tensor {} holds {} at element {}; nothing was written (a "
          "checkpoint holds finite values only)", what, t.name,
          std::isfinite(t.data[i]) ? fmt::format("the negative value {}", t.data[i])
                                   : fmt::format("the non-finite value {}", t.data[i]), i);
  }
}

// Refuses optimizer state read from `file` that no training could have written: a moment that is
// not finite, or a second moment below zero (AdamW divides by its square root).
void check_moment(const float* data, int64_t n, bool second, const std::string& file,
                  const std::string& tensor) {
  const int64_t i = first_bad_value(data, n, second);
  if (i >= 0)
    fail("{}: {} holds {} at element {} ({}); the optimizer state is corrupt (resume from "
        "another checkpoint, or start the optimizer afresh with --init-from on the step folder)",
        file, tensor, data[i], i, second ? "second moments must be finite and >= 0"
                                         : "first moments must be finite");
}

std::vector<st::WriteTensor> as_f32(const std::vector<NamedTensor>& list, const std::string& prefix,
                                    const std::string& what) {
  std::vector<st::WriteTensor> out;
  for (const auto& t : list) {
    check(t.data != nullptr, "checkpoint: {} tensor {} has no data", what, t.name);
    out.push_back({prefix + t.name, t.shape, st::DType::F32, t.data, nullptr});
  }
  return out;
}

void check_same_layout(const std::vector<NamedTensor>& params, const std::vector<NamedTensor>& other,
                       const char* what) {
  check(other.size() == params.size(), "checkpoint: {} lists {} tensors but params has {}", what,
        other.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i)
    check(other[i].name == params[i].name && other[i].shape == params[i].shape,
          "checkpoint: {} tensor {} {} does not match parameter {} {}", what, other[i].name,
          st::shape_string(other[i].shape), params[i].name, st::shape_string(params[i].shape));
}

json read_json(const fs::path& path) {
  check(std::ifstream(path).good(), "{}: cannot open", path.string());
  return read_json_file(path);
}

void fill(const st::Reader& reader, const std::string& prefix, const std::vector<MutableTensor>& list) {
  for (const auto& t : list) {
    check(t.data != nullptr, "checkpoint: destination for {} is null", t.name);
    reader.read_floats(prefix + t.name, t.shape, t.data);
  }
}

/// The PID of a write_atomically temporary of a checkpoint root ("step_12.tmp.345" → 345), or -1.
long temporary_pid(const std::string& name) {
  static const std::regex pattern(R"((step_[0-9]+|latest)\.tmp\.([0-9]{1,9}))");
  std::smatch m;
  return std::regex_match(name, m, pattern) ? std::stol(m[2].str()) : -1;
}

bool process_exists(long pid) { return kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

}  // namespace

std::vector<fs::path> remove_stale_temporaries(const fs::path& root) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const long pid = temporary_pid(entry.path().filename().string());
    if (pid <= 0 || process_exists(pid)) continue;
    fs::remove_all(entry.path(), ec);
    check(!ec, "{}: cannot remove the leftover of an interrupted save ({})", entry.path().string(),
          ec.message());
    removed.push_back(entry.path());
  }
  return removed;
}

void remove_checkpoints(const fs::path& root) {
  static const std::regex pattern(R"(step_[0-9]+|latest)");
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> doomed;  // collected first: removing while iterating is unspecified
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (std::regex_match(entry.path().filename().string(), pattern)) doomed.push_back(entry.path());
  for (const auto& path : doomed) {
    fs::remove_all(path, ec);
    check(!ec, "{}: cannot remove ({})", path.string(), ec.message());
  }
}

fs::path save_checkpoint(const fs::path& root, const CheckpointData& d) {
  check(d.state.step >= 0, "checkpoint: negative step {}", d.state.step);
  const bool with_optimizer = !d.adam_m.empty() || !d.adam_v.empty();
  if (with_optimizer) {
    check_same_layout(d.params, d.adam_m, "adam_m");
    check_same_layout(d.params, d.adam_v, "adam_v");
  }
  // Without model.safetensors the params give names and shapes only: their data may be a rank's
  // shard of a larger tensor (a LoRA step folder, whose adapter write_extra checks and writes).
  if (d.write_model) check_values(d.params, "model", false);
  check_values(d.adam_m, "adam_m", false);
  check_values(d.adam_v, "adam_v", true);
  std::error_code ec;
  fs::create_directories(root, ec);
  check(!ec, "{}: cannot create checkpoint folder ({})", root.string(), ec.message());
  remove_stale_temporaries(root);
  const std::string name = "step_" + std::to_string(d.state.step);
  const fs::path dir = root / name;
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  write_atomically(dir, [&](const fs::path& tmp) {
    fs::create_directory(tmp);
    // Progress lines name the final folder (the temporary one is renamed to it).
    if (d.write_model)
      st::write_file(tmp / "model.safetensors", as_f32(d.params, "", "model"), meta,
                     d.progress ? "saving " + (dir / "model.safetensors").string() : "");
    if (d.write_extra) d.write_extra(tmp);
    if (with_optimizer) {
      auto tensors = as_f32(d.adam_m, kAdamM, "adam_m");
      auto v = as_f32(d.adam_v, kAdamV, "adam_v");
      tensors.insert(tensors.end(), v.begin(), v.end());
      tensors.push_back({kAdamStep, {}, st::DType::I64, nullptr, &d.adam_step});
      st::write_file(tmp / "optimizer.safetensors", tensors, meta,
                     d.progress ? "saving " + (dir / "optimizer.safetensors").string() : "");
    }
    model::write_hf_config(tmp / "config.json", d.model, d.max_position_embeddings);
    const json state = {{"step", d.state.step}, {"config", d.state.config},
                        {"sampler", d.state.sampler}, {"rng", d.state.rng}, {"extra", d.state.extra}};
    write_text(tmp / "state.json", state.dump(2) + "\n");
  });
  write_atomically(root / "latest", [&](const fs::path& tmp) { write_text(tmp, name + "\n"); });
  return dir;
}

fs::path resolve_checkpoint(const fs::path& path) {
  check(fs::exists(path), "{}: no such checkpoint", path.string());
  if (fs::exists(path / "state.json")) return path;
  const fs::path latest = path / "latest";
  check(fs::exists(latest), "{}: neither a step folder (no state.json) nor a checkpoint root "
        "(no latest)", path.string());
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  check(!name.empty() && name.find('/') == std::string::npos,
        "{}: expected the name of a step folder, got '{}'", latest.string(), name);
  const fs::path dir = path / name;
  check(fs::exists(dir / "state.json"), "{}: names {}, which is not a complete checkpoint",
        latest.string(), dir.string());
  return dir;
}

CheckpointState read_checkpoint_state(const fs::path& step_dir) {
  const fs::path file = step_dir / "state.json";
  const json j = read_json(file);
  check(j.is_object() && j.contains("step") && j["step"].is_number_integer(),
        "{}: missing integer 'step'", file.string());
  CheckpointState s;
  s.step = j["step"].get<int64_t>();
  auto take = [&](const char* key, json& out) {
    if (j.contains(key)) out = j[key];
  };
  take("config", s.config);
  take("sampler", s.sampler);
  take("rng", s.rng);
  take("extra", s.extra);
  return s;
}

void load_model(const fs::path& step_dir, const std::vector<MutableTensor>& params) {
  const st::Reader reader(step_dir);
  fill(reader, "", params);
  std::set<std::string> wanted;
  for (const auto& t : params) wanted.insert(t.name);
  for (const auto& name : reader.names())
    check(wanted.count(name), "{}: tensor {} is not a parameter of this model (different model "
          "shape or architecture?)", step_dir.string(), shorten(name));
}

HfTensors hf_named_tensors(const model::Params<float>& full, const std::string& prefix,
                           const std::string& format) {
  HfTensors out;
  const model::ParamTable& layout = full.layout();
  const auto list = model::hf_tensors(layout, format);
  out.storage.reserve(list.size());
  for (const auto& t : list) {
    // A tensor that lies in the view as it is is not copied (the save's peak holds the full
    // parameters and AdamW moments once, not twice).
    NamedTensor named{prefix + t.name, t.shape, model::hf_in_place(t, layout, full.data())};
    if (named.data == nullptr) {
      out.storage.emplace_back(static_cast<size_t>(named.numel()));
      model::gather_hf(t, layout, full.data(), out.storage.back().data());
      named.data = out.storage.back().data();
    }
    out.tensors.push_back(std::move(named));
  }
  return out;
}

namespace {
/// Where a view's values go: this rank's block of the full view (parallel::ShardPlan::Block), with
/// a 1-D view seen as rows of one value (hf_names' convention: a row is the last dimension).
parallel::ShardPlan::Block rows_block(const model::ParamView& full_view, parallel::ShardPlan::Block b) {
  if (full_view.shape.size() == 1) return {b.col0, b.cols, 0, 1, 1};
  return b;
}

/// file.read_block on the compute threads, in chunks of about 2^20 values (the first write of
/// fresh pages, the conversion): the values, and the error of the lowest chunk with a non-finite
/// element, are those of one call.
void read_block_parallel(const st::File& file, const std::string& name, int64_t row0, int64_t rows,
                         int64_t col0, int64_t cols, float* out) {
  const int64_t per = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(cols, 1));
  const int64_t tasks = (rows + per - 1) / per;
  if (tasks <= 1) {
    file.read_block(name, row0, rows, col0, cols, out);
    return;
  }
  std::exception_ptr error;
  int64_t error_task = tasks;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r = t * per, n = std::min(per, rows - r);
    try {
      file.read_block(name, row0 + r, n, col0, cols, out + r * cols);
    } catch (...) {
#pragma omp critical(longtron_read_block_error)
      if (t < error_task) error_task = t, error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

/// Decodes the tensors of `layout`'s family from `reader` (names prefixed by `prefix`) into
/// `local`: view v receives block(v) of the full view. Each HF tensor is checked against its full
/// shape, and only the rows and columns of the block are read. `progress` (may be null) counts
/// decoded bytes.
template <typename BlockOf>
void fill_blocks(const st::Reader& reader, const std::string& prefix,
                 const model::ParamTable& layout, const BlockOf& block_of,
                 model::Params<float>& local, std::set<std::string>* wanted, Progress* progress,
                 const uint64_t* decoded) {
  for (const auto& t : model::hf_tensors(layout)) {
    const std::string name = prefix + t.name;
    const st::File& file = reader.file_of(name);
    const st::TensorInfo& info = file.info(name);
    check(info.shape == t.shape, "{}: tensor {} has shape {} but the model expects {}",
          file.path().string(), name, st::shape_string(info.shape), st::shape_string(t.shape));
    const parallel::ShardPlan::Block b = rows_block(layout.view(t.view), block_of(t.view));
    float* out = local.ptr(t.view);
    int64_t hf_row = 0;  // first row of the current block of rows inside the HF tensor
    for (const auto& [first, count] : t.rows) {
      const int64_t lo = std::max(first, b.row0), hi = std::min(first + count, b.row0 + b.rows);
      if (lo < hi)
        read_block_parallel(file, name, hf_row + (lo - first), hi - lo, b.col0, b.cols,
                            out + (lo - b.row0) * b.cols);
      hf_row += count;
    }
    if (wanted) wanted->insert(name);
    if (progress) progress->update(static_cast<int64_t>(reader.bytes_decoded() - *decoded));
  }
}

/// Refuses AdamW moments (`moment` 1 or 2; 0 = weights, unchecked) that no training could have
/// written, naming the file and the tensor (check_moment).
void check_moments(const model::Params<float>& buffer, int moment, const std::string& file,
                   const std::string& prefix) {
  if (moment == 0) return;
  const model::ParamTable& layout = buffer.layout();
  for (int v = 0; v < static_cast<int>(layout.views().size()); ++v)
    check_moment(buffer.ptr(v), layout.view(v).numel, moment == 2, file, prefix + layout.view(v).name);
}

void fill_hf(const st::Reader& reader, const std::string& prefix, model::Params<float>& full,
             std::set<std::string>* wanted, Progress* progress = nullptr) {
  const model::ParamTable& layout = full.layout();
  const auto whole = [&layout](int v) {
    const model::ParamView& view = layout.view(v);
    const int64_t cols = view.shape.size() == 2 ? view.shape[1] : view.numel;
    return parallel::ShardPlan::Block{0, view.shape.size() == 2 ? view.shape[0] : 1, 0, cols, cols};
  };
  const uint64_t decoded = reader.bytes_decoded();
  fill_blocks(reader, prefix, layout, whole, full, wanted, progress, &decoded);
}

/// Bytes of `reader`'s tensors (names prefixed by `prefix`) that the blocks of `plan` cover.
uint64_t shard_bytes(const st::Reader& reader, const std::string& prefix,
                     const parallel::ShardPlan& plan) {
  const model::ParamTable& layout = plan.full_layout();
  uint64_t bytes = 0;
  for (const auto& t : model::hf_tensors(layout)) {
    if (!reader.contains(prefix + t.name)) continue;  // reported by fill_blocks
    const parallel::ShardPlan::Block b = rows_block(layout.view(t.view), plan.block(t.view));
    int64_t rows = 0;
    for (const auto& [first, count] : t.rows)
      rows += std::max<int64_t>(0, std::min(first + count, b.row0 + b.rows) - std::max(first, b.row0));
    bytes += uint64_t(rows * b.cols) * st::dtype_size(reader.info(prefix + t.name).dtype);
  }
  return bytes;
}

/// Names of `reader` that are not model tensors: an error naming the first (as load_hf_model).
void check_no_extra(const st::Reader& reader, const fs::path& path, const model::ParamTable& layout,
                    const std::set<std::string>& wanted) {
  for (const auto& name : reader.names()) {
    check(wanted.count(name) || name != "lm_head.weight" || !layout.config().tie_word_embeddings,
          "{}: tensor lm_head.weight is present but config.json has tie_word_embeddings = true (the "
          "head is model.embed_tokens.weight; remove one or the other)", path.string());
    check(wanted.count(name), "{}: tensor {} is not a parameter of this {} model (different model "
          "shape or architecture?)", path.string(), shorten(name), layout.config().type);
  }
}

/// Fills `local` from `reader` under `prefix`s, with a progress line when `show`.
void fill_shards(const st::Reader& reader, const std::string& what,
                 const std::vector<std::pair<std::string, model::Params<float>*>>& targets,
                 const parallel::ShardPlan& plan, std::set<std::string>* wanted, bool show) {
  uint64_t total = 0;
  for (const auto& [prefix, _] : targets) total += shard_bytes(reader, prefix, plan);
  Progress progress(what, static_cast<int64_t>(total), "bytes",
                    show && total >= uint64_t(kProgressMinBytes));
  const uint64_t decoded = reader.bytes_decoded();
  const auto block_of = [&plan](int v) { return plan.block(v); };
  for (const auto& [prefix, local] : targets) {
    check(local->numel() == plan.local_layout().numel(),
          "load: a buffer of {} elements for a rank layout of {}", local->numel(),
          plan.local_layout().numel());
    fill_blocks(reader, prefix, plan.full_layout(), block_of, *local, wanted, &progress, &decoded);
  }
  progress.finish();
}
}  // namespace

void load_hf_model(const fs::path& path, model::Params<float>& full, bool progress) {
  const st::Reader reader(path);
  std::set<std::string> wanted;
  uint64_t bytes = 0;
  for (const auto& t : model::hf_tensors(full.layout()))
    if (reader.contains(t.name)) bytes += reader.info(t.name).end - reader.info(t.name).begin;
  Progress shown("loading " + path.string(), static_cast<int64_t>(bytes), "bytes",
                 progress && bytes >= uint64_t(kProgressMinBytes));
  fill_hf(reader, "", full, &wanted, &shown);
  shown.finish();
  check_no_extra(reader, path, full.layout(), wanted);
}

uint64_t load_hf_shards(const fs::path& path, const parallel::ShardPlan& plan,
                        model::Params<float>& local, bool progress) {
  const st::Reader reader(path);
  std::set<std::string> wanted;
  fill_shards(reader, "loading " + path.string(), {{"", &local}}, plan, &wanted, progress);
  check_no_extra(reader, path, plan.full_layout(), wanted);
  return reader.bytes_decoded();
}

int64_t load_hf_optimizer_shards(const fs::path& step_dir, const parallel::ShardPlan& plan,
                                 model::Params<float>& exp_avg, model::Params<float>& exp_avg_sq,
                                 bool progress) {
  const fs::path file = step_dir / "optimizer.safetensors";
  const st::Reader reader(file);
  fill_shards(reader, "loading " + file.string(), {{kAdamM, &exp_avg}, {kAdamV, &exp_avg_sq}}, plan,
              nullptr, progress);
  check_moments(exp_avg, 1, file.string(), kAdamM);
  check_moments(exp_avg_sq, 2, file.string(), kAdamV);
  const auto step = reader.file_of(kAdamStep).read_ints(kAdamStep);
  check(step.size() == 1, "{}: tensor {} must hold one value", file.string(), kAdamStep);
  return step[0];
}

int64_t load_hf_optimizer(const fs::path& step_dir, model::Params<float>& exp_avg,
                          model::Params<float>& exp_avg_sq) {
  const fs::path file = step_dir / "optimizer.safetensors";
  const st::Reader reader(file);
  fill_hf(reader, kAdamM, exp_avg, nullptr);
  fill_hf(reader, kAdamV, exp_avg_sq, nullptr);
  check_moments(exp_avg, 1, file.string(), kAdamM);
  check_moments(exp_avg_sq, 2, file.string(), kAdamV);
  const auto step = reader.file_of(kAdamStep).read_ints(kAdamStep);
  check(step.size() == 1, "{}: tensor {} must hold one value", file.string(), kAdamStep);
  return step[0];
}

std::vector<std::string> copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  std::vector<std::string> copied;
  if (from.empty()) return copied;
  for (const char* name : kTokenizerFiles)
    if (fs::is_regular_file(from / name)) {
      const fs::path tmp = (to / name).string() + ".tmp";
      fs::copy_file(from / name, tmp, fs::copy_options::overwrite_existing);
      fs::rename(tmp, to / name);
      copied.push_back(name);
    }
  return copied;
}

int64_t load_optimizer(const fs::path& step_dir, const std::vector<MutableTensor>& adam_m,
                       const std::vector<MutableTensor>& adam_v) {
  const fs::path file = step_dir / "optimizer.safetensors";
  const st::Reader reader(file);
  fill(reader, kAdamM, adam_m);
  fill(reader, kAdamV, adam_v);
  for (const auto& list : {&adam_m, &adam_v})
    for (const auto& t : *list)
      check_moment(t.data, numel_of(t.shape), list == &adam_v, file.string(), t.name);
  const auto step = reader.file_of(kAdamStep).read_ints(kAdamStep);
  check(step.size() == 1, "{}: tensor {} must hold one value", file.string(), kAdamStep);
  return step[0];
}

}  // namespace longtron::train
