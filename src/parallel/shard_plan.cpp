// Sharded parameter plan (see shard_plan.h).
#include "parallel/shard_plan.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/vocab_parallel.h"

namespace longtron::parallel {

int64_t TensorPlan::split_parts() const {
  int64_t p = 1;
  for (const Split& s : splits) p *= s.parts;
  return p;
}

ShardPlan::ShardPlan(const model::ParamTable& full, const Grid& grid)
    : full_(&full), grid_(&grid), plans_(full.views().size()) {}

void ShardPlan::add_split(int view, Split s) {
  TensorPlan& t = plans_.at(static_cast<size_t>(view));
  const auto& shape = full_->view(view).shape;
  check(s.dim >= 0 && s.dim < static_cast<int>(shape.size()),
        "shard plan: {} has no dim {}", full_->view(view).name, s.dim);
  for (const Split& o : t.splits)
    check(o.dim != s.dim, "shard plan: {} is already split on dim {}", full_->view(view).name,
          s.dim);
  check(s.start >= 0 && s.count >= 0 && s.start + s.count <= shape[size_t(s.dim)],
        "shard plan: range [{}, {}) outside dim {} of {} (extent {})", s.start, s.start + s.count,
        s.dim, full_->view(view).name, shape[size_t(s.dim)]);
  t.splits.push_back(s);
}

void ShardPlan::split(int view, int dim, comm::Group group) {
  if (view < 0) return;
  const comm::CommPtr& c = grid_->get(group);
  const int64_t extent = full_->view(view).shape.at(size_t(dim));
  const Range r = shard_range(extent, c->size(), c->rank());
  add_split(view, Split{dim, group, c->size(), r.start, r.count});
}

void ShardPlan::split_range(int view, int dim, comm::Group group, int64_t start, int64_t count) {
  if (view < 0) return;
  add_split(view, Split{dim, group, grid_->get(group)->size(), start, count});
}

void ShardPlan::split_attention_heads(const model::BlockParamIds& b, comm::Group group) {
  const model::ModelConfig& c = full_->config();
  const comm::CommPtr& g = grid_->get(group);
  const int64_t d = c.head_dim();
  const int64_t groups = c.num_kv_attention_heads / g->size();  // kv groups per rank
  const int64_t group_rows = (c.num_attention_heads / c.num_kv_attention_heads + 2) * d;
  const int64_t q_cols = c.num_attention_heads / g->size() * d;
  const int64_t r = g->rank();
  split_range(b.wqkv, 0, group, r * groups * group_rows, groups * group_rows);
  split_range(b.wqkv_bias, 0, group, r * groups * group_rows, groups * group_rows);
  split_range(b.wo, 1, group, r * q_cols, q_cols);
}

void ShardPlan::sum_gradient(int view, comm::Group group) {
  if (view < 0) return;
  auto& g = plans_.at(static_cast<size_t>(view)).grad_sum_groups;
  if (std::find(g.begin(), g.end(), group) == g.end()) g.push_back(group);
}

std::vector<int64_t> ShardPlan::local_shape(int view) const {
  std::vector<int64_t> shape = full_->view(view).shape;
  for (const Split& s : tensor(view).splits) shape[size_t(s.dim)] = s.count;
  return shape;
}

model::ParamTable ShardPlan::local_layout() const {
  std::vector<std::vector<int64_t>> shapes;
  for (int v = 0; v < num_views(); ++v) shapes.push_back(local_shape(v));
  return full_->with_shapes(shapes);
}

namespace {

// Row/column ranges of a 1-D or 2-D view under its splits.
struct Box {
  int64_t r0 = 0, rows = 1, c0 = 0, cols = 1, full_cols = 1;
};

Box box_of(const std::vector<int64_t>& shape, const TensorPlan& t) {
  Box b;
  if (shape.size() == 1) {
    b.rows = 1, b.cols = b.full_cols = shape[0];
    for (const Split& s : t.splits) b.c0 = s.start, b.cols = s.count;
    return b;
  }
  check(shape.size() == 2, "shard plan: only 1-D and 2-D tensors, got {} dims", shape.size());
  b.rows = shape[0], b.cols = b.full_cols = shape[1];
  for (const Split& s : t.splits) {
    if (s.dim == 0) b.r0 = s.start, b.rows = s.count;
    else b.c0 = s.start, b.cols = s.count;
  }
  return b;
}

}  // namespace

ShardPlan::Block ShardPlan::block(int view) const {
  const Box b = box_of(full_->view(view).shape, tensor(view));
  return Block{b.r0, b.rows, b.c0, b.cols, b.full_cols};
}

void ShardPlan::slice(float* local, const float* full, int view) const {
  const Box b = box_of(full_->view(view).shape, tensor(view));
  for (int64_t r = 0; r < b.rows; ++r)
    std::memcpy(local + r * b.cols, full + (b.r0 + r) * b.full_cols + b.c0,
                size_t(b.cols) * sizeof(float));
}

void ShardPlan::unslice(float* full, const float* local, int view) const {
  const Box b = box_of(full_->view(view).shape, tensor(view));
  for (int64_t r = 0; r < b.rows; ++r)
    std::memcpy(full + (b.r0 + r) * b.full_cols + b.c0, local + r * b.cols,
                size_t(b.cols) * sizeof(float));
}

}  // namespace longtron::parallel
