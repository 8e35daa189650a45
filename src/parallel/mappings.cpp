// The adjoint pairs of mappings.h. Last-dim collectives go through a [T, rows, cols/T] staging
// buffer, as Megatron does (dim-0 collective + chunk-and-concat on the last dim).
#include "parallel/mappings.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace longtron::parallel {
namespace {

int64_t chunk_of(int64_t total, int parts, const char* what) {
  check(total % parts == 0, "{} ({}) is not divisible by the group size {}", what, total, parts);
  return total / parts;
}

// dst[rows, c] = src[:, col0 : col0 + c] where src has `src_cols` columns.
void copy_columns(float* dst, const float* src, int64_t rows, int64_t c, int64_t src_cols,
                  int64_t col0) {
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * c, src + i * src_cols + col0, size_t(c) * sizeof(float));
}

// dst[:, col0 : col0 + c] = src[rows, c] where dst has `dst_cols` columns.
void place_columns(float* dst, const float* src, int64_t rows, int64_t c, int64_t dst_cols,
                   int64_t col0) {
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * dst_cols + col0, src + i * c, size_t(c) * sizeof(float));
}

}  // namespace

void copy_to_group_backward(float* dx, int64_t n, Communicator& comm) { comm.all_reduce(dx, n); }

void reduce_from_group_forward(float* x, int64_t n, Communicator& comm) { comm.all_reduce(x, n); }

void scatter_last_dim_forward(float* shard, const float* full, int64_t rows, int64_t cols,
                              Communicator& comm) {
  int64_t c = chunk_of(cols, comm.size(), "last dimension");
  copy_columns(shard, full, rows, c, cols, comm.rank() * c);
}

void scatter_last_dim_backward(float* dfull, const float* dshard, int64_t rows, int64_t cols,
                               Communicator& comm) {
  gather_last_dim_forward(dfull, dshard, rows, cols, comm);
}

void gather_last_dim_forward(float* full, const float* shard, int64_t rows, int64_t cols,
                             Communicator& comm) {
  const int T = comm.size();
  int64_t c = chunk_of(cols, T, "last dimension");
  std::vector<float> staged(size_t(rows * cols));  // [T, rows, c]
  comm.all_gather(staged.data(), shard, rows * c);
  for (int r = 0; r < T; ++r) place_columns(full, staged.data() + r * rows * c, rows, c, cols, r * c);
}

void gather_last_dim_backward(float* dshard, const float* dfull, int64_t rows, int64_t cols,
                              Communicator& comm) {
  scatter_last_dim_forward(dshard, dfull, rows, cols, comm);
}

void scatter_first_dim_forward(float* shard, const float* full, int64_t rows, int64_t cols,
                               Communicator& comm) {
  int64_t r = chunk_of(rows, comm.size(), "first (sequence) dimension");
  std::memcpy(shard, full + comm.rank() * r * cols, size_t(r * cols) * sizeof(float));
}

void scatter_first_dim_backward(float* dfull, const float* dshard, int64_t rows, int64_t cols,
                                Communicator& comm) {
  int64_t r = chunk_of(rows, comm.size(), "first (sequence) dimension");
  comm.all_gather(dfull, dshard, r * cols);
}

void all_gather_first_dim_forward(float* full, const float* shard, int64_t rows, int64_t cols,
                                  Communicator& comm) {
  int64_t r = chunk_of(rows, comm.size(), "first (sequence) dimension");
  comm.all_gather(full, shard, r * cols);
}

void all_gather_first_dim_backward(float* dshard, const float* dfull, int64_t rows, int64_t cols,
                                   Communicator& comm) {
  int64_t r = chunk_of(rows, comm.size(), "first (sequence) dimension");
  comm.reduce_scatter(dshard, dfull, r * cols);
}

void reduce_scatter_first_dim_forward(float* shard, const float* full, int64_t rows, int64_t cols,
                                      Communicator& comm) {
  all_gather_first_dim_backward(shard, full, rows, cols, comm);
}

void reduce_scatter_first_dim_backward(float* dfull, const float* dshard, int64_t rows,
                                       int64_t cols, Communicator& comm) {
  all_gather_first_dim_forward(dfull, dshard, rows, cols, comm);
}

void ulysses_scatter_heads(float* out, const float* in, int64_t n_local, int64_t heads,
                           int64_t head_dim, Communicator& comm) {
  const int T = comm.size();
  int64_t hl = chunk_of(heads, T, "number of attention heads");
  // send chunk j = in[:, j·hl : (j+1)·hl, :]; the chunk received from rank j is its tokens, so the
  // receive buffer [T, n_local, hl, d] is exactly out[T·n_local, hl, d].
  std::vector<float> send(size_t(n_local * heads * head_dim));
  const int64_t c = hl * head_dim;
  for (int j = 0; j < T; ++j)
    copy_columns(send.data() + j * n_local * c, in, n_local, c, heads * head_dim, j * c);
  comm.all_to_all(out, send.data(), n_local * c);
}

void ulysses_gather_heads(float* out, const float* in, int64_t n_local, int64_t heads,
                          int64_t head_dim, Communicator& comm) {
  const int T = comm.size();
  int64_t hl = chunk_of(heads, T, "number of attention heads");
  // send chunk j = rows [j·n_local, (j+1)·n_local) of in (contiguous); the chunk from rank j holds
  // head block j of this rank's tokens.
  const int64_t c = hl * head_dim;
  std::vector<float> recv(size_t(n_local * heads * head_dim));
  comm.all_to_all(recv.data(), in, n_local * c);
  for (int j = 0; j < T; ++j)
    place_columns(out, recv.data() + j * n_local * c, n_local, c, heads * head_dim, j * c);
}

}  // namespace longtron::parallel
