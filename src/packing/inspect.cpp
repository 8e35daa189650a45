#include "packing/inspect.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "packing/sequence_split.h"
#include "packing/unpack.h"

namespace longtron::data {

namespace {

nlohmann::json rows_of(const std::vector<int32_t>& flat, int64_t width) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < flat.size(); i += width)
    out.push_back(std::vector<int32_t>(flat.begin() + i, flat.begin() + i + width));
  return out;
}

// "cp_ranks" and "cp_imbalance" of one normalized row (inspect.h).
void add_context_ranks(nlohmann::json& j, const MicroBatch& row, const InspectOptions& o) {
  MicroBatch padded = row;
  pad_for_sequence_parallel(padded, o.cp_size);
  const auto shares = context_assignment(padded.cu_seqlens, o.cp_size, o.cp_balance);
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < shares.size(); ++r)
    ranks.push_back({{"rank", r},
                     {"positions", shares[r]},
                     {"attention_work", attention_work(padded.cu_seqlens, shares[r], o.cp_window)}});
  j["cp_ranks"] = std::move(ranks);
  j["cp_imbalance"] = context_imbalance(padded.cu_seqlens, shares, o.cp_window);
}

nlohmann::json micro_batch_json(const MicroBatch& row, const InspectOptions& o) {
  MicroBatch m = row;
  packed_data_normalizer(m);
  const MicroBatch s = split_for_sequence_parallel(m, o.sp_size, o.sp_rank);
  nlohmann::json j{{"input_ids", s.input_ids}, {"labels", s.labels},
                   {"cu_seqlens", s.cu_seqlens}, {"indexes", s.indexes},
                   {"max_seqlen", s.max_seqlen}};
  if (o.cp_size > 1) add_context_ranks(j, m, o);
  if (!row.pairs.empty()) {  // preference pairs: where each pair's sequences and answers lie
    j["pairs"] = nlohmann::json::array();
    for (const PairInRow& p : row.pairs)
      j["pairs"].push_back({{"id", p.id},
                            {"chosen", {p.chosen_begin, p.chosen_answer, p.chosen_end}},
                            {"rejected", {p.rejected_begin, p.rejected_answer, p.rejected_end}}});
  }
  if (!o.data.pack.use_packed_dataset) {
    UnpackedBatch u = unpack_data(m, o.data.pack.micro_bsz, o.data.pack.seq_len);
    u = split_for_sequence_parallel(u, o.sp_size, o.sp_rank);
    j["unpacked"] = {{"input_ids", rows_of(u.input_ids, u.seq_len)},
                     {"labels", rows_of(u.labels, u.seq_len)}};
  }
  return j;
}

// `tensor([[a, b], [c, d]])` on several lines, as PyTorch (and InternEvo's logs) print a 2-D tensor.
std::string tensor(const nlohmann::json& rows, bool two_d) {
  if (!two_d) return fmt::format("tensor([{}])", fmt::join(rows.get<std::vector<int32_t>>(), ", "));
  std::string out = "tensor([";
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) out += ",\n        ";
    out += fmt::format("[{}]", fmt::join(rows[i].get<std::vector<int32_t>>(), ", "));
  }
  return out + "])";
}

// One line per micro-batch with --cp-size: the work of each context rank and max ÷ mean.
std::string context_text(const nlohmann::json& mb, const InspectOptions& o) {
  std::vector<int64_t> work;
  for (const auto& r : mb["cp_ranks"]) work.push_back(r["attention_work"].get<int64_t>());
  return fmt::format("context ranks ({} of size {}): attention work [{}], max / mean {:.4f}\n",
                     context_balance_name(o.cp_balance), o.cp_size, fmt::join(work, ", "),
                     mb["cp_imbalance"].get<double>());
}

nlohmann::json stack(const nlohmann::json& mbs, const char* key) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : mbs) out.push_back(m[key]);
  return out;
}

}  // namespace

nlohmann::json inspect_json(Dataset dataset, const InspectOptions& o, ProgressHook* progress) {
  check(o.steps > 0, "--steps must be > 0, got {}", o.steps);
  check_sequence_parallel(o.sp_size, o.sp_rank);
  check(o.dp_size >= 0, "--dp-size must be > 0, got {}", o.dp_size);
  check(o.cp_size >= 1, "--cp-size must be >= 1, got {}", o.cp_size);
  BatchLoader loader(std::move(dataset), o.data, std::max<int64_t>(o.dp_size, 1), progress);
  nlohmann::json steps = nlohmann::json::array();
  for (int64_t step = 0; step < o.steps; ++step) {
    const StepPlan plan = loader.plan(step);
    auto mbs_of = [&](int64_t rank) {
      nlohmann::json mbs = nlohmann::json::array();
      for (const MicroBatch& row : loader.micro_batches(plan, rank))
        mbs.push_back(micro_batch_json(row, o));
      return mbs;
    };
    if (o.dp_size == 0) {
      steps.push_back({{"micro_batches", mbs_of(0)}});
      continue;
    }
    nlohmann::json ranks = nlohmann::json::array();
    for (int64_t r = 0; r < o.dp_size; ++r)
      ranks.push_back({{"rank", r}, {"micro_batches", mbs_of(r)}, {"cost", plan.cost[r]}});
    steps.push_back({{"dp_ranks", ranks}, {"imbalance", plan.imbalance()}});
  }
  return {{"steps", steps}};
}

std::string inspect_text(const nlohmann::json& batches, const InspectOptions& o) {
  const bool sp = o.sp_size > 1;
  std::string out;
  const auto& steps = batches["steps"];
  // One block per step, or per (step, dp rank) with --dp-size.
  std::vector<std::pair<std::string, nlohmann::json>> blocks;
  for (size_t k = 0; k < steps.size(); ++k) {
    const std::string sp_note = sp ? fmt::format(" (sp rank {} of {})", o.sp_rank, o.sp_size) : "";
    if (!steps[k].contains("dp_ranks")) {
      blocks.push_back({fmt::format("step {}{}", k, sp_note), steps[k]["micro_batches"]});
      continue;
    }
    for (const auto& r : steps[k]["dp_ranks"])
      blocks.push_back({fmt::format("step {} dp rank {} of {}{} (cost {:.6g}, step imbalance {:.4f})",
                                    k, r["rank"].get<int64_t>(), steps[k]["dp_ranks"].size(), sp_note,
                                    r["cost"].get<double>(), steps[k]["imbalance"].get<double>()),
                        r["micro_batches"]});
  }
  for (const auto& [title, mbs] : blocks) {
    out += title + "\n\n";
    out += "batch_data[0]['input_ids']:\n" + tensor(stack(mbs, "input_ids"), true) + "\n";
    out += "batch_data[0]['cu_seqlens']:\n" + tensor(stack(mbs, "cu_seqlens"), true) + "\n";
    out += "batch_data[0]['indexes']:\n" + tensor(stack(mbs, "indexes"), true) + "\n";
    out += "batch_data[1]:\n" + tensor(stack(mbs, "labels"), true) + "\n\n";
    for (size_t m = 0; m < mbs.size(); ++m) {
      const auto& mb = mbs[m];
      out += fmt::format("micro batch {}:\n", m);
      if (mb.contains("cp_ranks")) out += context_text(mb, o);
      if (mb.contains("unpacked")) {
        out += "data[\"input_ids\"]:\n" + tensor(mb["unpacked"]["input_ids"], true) + "\n";
        out += "label:\n" + tensor(mb["unpacked"]["labels"], true) + "\n\n";
        continue;
      }
      nlohmann::json one_row = nlohmann::json::array({mb["input_ids"]});
      nlohmann::json one_label = nlohmann::json::array({mb["labels"]});
      out += "data['input_ids']:\n" + tensor(one_row, true) + "\n";
      out += "data['cu_seqlens']:\n" + tensor(mb["cu_seqlens"], false) + "\n";
      out += "data['indexes']:\n" + tensor(mb["indexes"], false) + "\n";
      out += fmt::format("data['max_seqlen']:\n{}\n", mb["max_seqlen"].get<int32_t>());
      out += "label:\n" + tensor(one_label, true) + "\n\n";
    }
  }
  return out;
}

}  // namespace longtron::data
