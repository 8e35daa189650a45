// Collective tests shared by comm_np2_test and comm_np4_test: every collective (and its async
// handle) on the world and on split groups, checked against a direct computation — each rank's
// input is a known function of (rank, index), so every rank can compute the expected result.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_grid.h"
#include "core/error.h"
#include "mpi_test_main.h"
#include "parallel/layout.h"

namespace longtron::comm {
namespace {

using longtron::testing::world;
using parallel::Layout;
using parallel::TensorMode;

// The value rank r contributes at index i.
double value(int r, int64_t i) { return 0.25 * (r + 1) + 0.5 * double(i) - 0.125 * (r * i % 5); }

template <typename T>
std::vector<T> input(int r, int64_t n, int64_t offset = 0) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = value(r, i + offset);
    if constexpr (std::is_integral_v<T>)
      v[size_t(i)] = T(std::llround(x * 8));  // distinct integers
    else
      v[size_t(i)] = T(x);
  }
  return v;
}

template <typename T>
void check_all_reduce(Communicator& c) {
  const int64_t n = 37;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    std::vector<T> data = input<T>(c.rank(), n);
    c.all_reduce(data.data(), n, op);
    for (int64_t i = 0; i < n; ++i) {
      T want = op == ReduceOp::kSum ? T(0) : input<T>(0, n)[size_t(i)];
      for (int r = 0; r < c.size(); ++r) {
        T x = input<T>(r, n)[size_t(i)];
        want = op == ReduceOp::kSum ? T(want + x) : std::max(want, x);
      }
      EXPECT_NEAR(double(data[size_t(i)]), double(want), 1e-5) << "i=" << i;
    }
  }
}

TEST(Comm, AllReduceEachType) {
  Communicator& c = *world();
  check_all_reduce<float>(c);
  check_all_reduce<double>(c);
  check_all_reduce<int64_t>(c);
  check_all_reduce<int32_t>(c);
}

// Replicated parameters stay identical only if a float all-reduce gives bitwise the same result
// on every rank, for small (recursive doubling) and large (ring) messages alike.
TEST(Comm, AllReduceIsBitwiseReplicated) {
  Communicator& c = *world();
  for (int64_t n : {int64_t(7), int64_t(1) << 18}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(std::sin(0.37 * double(i) + c.rank())) * 1e3f;
    c.all_reduce(x.data(), n);
    std::vector<float> root = x;
    c.broadcast(root.data(), n, 0);
    EXPECT_EQ(root, x) << "n=" << n;
  }
}

TEST(Comm, AllGatherPlainInPlaceAndUneven) {
  Communicator& c = *world();
  const int T = c.size();
  const int64_t n = 5;
  std::vector<float> send = input<float>(c.rank(), n);
  std::vector<float> recv(static_cast<size_t>(T * n), -1.f);
  c.all_gather(recv.data(), send.data(), n);
  for (int r = 0; r < T; ++r)
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(recv[size_t(r * n + i)], input<float>(r, n)[size_t(i)]);
  // In place: this rank's chunk already sits in recv.
  std::vector<double> inplace(static_cast<size_t>(T * n), 0.0);
  auto mine = input<double>(c.rank(), n);
  std::copy(mine.begin(), mine.end(), inplace.begin() + c.rank() * n);
  c.all_gather(inplace.data(), inplace.data() + c.rank() * n, n);
  for (int r = 0; r < T; ++r)
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(inplace[size_t(r * n + i)], input<double>(r, n)[size_t(i)]);
  // Uneven: rank r sends r + 1 elements.
  std::vector<int64_t> counts(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) counts[size_t(r)] = r + 1;
  std::vector<int64_t> v = input<int64_t>(c.rank(), c.rank() + 1);
  std::vector<int64_t> all(static_cast<size_t>(T * (T + 1) / 2));
  c.all_gather_v(all.data(), v.data(), counts);
  size_t k = 0;
  for (int r = 0; r < T; ++r)
    for (int64_t i = 0; i <= r; ++i) EXPECT_EQ(all[k++], input<int64_t>(r, r + 1)[size_t(i)]);
}

// Uneven reduce-scatter: rank r receives chunk r (r + 1 elements, one chunk empty when T > 2 by
// giving rank 1 zero) summed over the group; the adjoint check: all_gather_v of the chunks is the
// all_reduce of the whole buffer.
TEST(Comm, ReduceScatterVSumMaxAndItsAdjoint) {
  Communicator& c = *world();
  const int T = c.size();
  std::vector<int64_t> counts(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) counts[size_t(r)] = (T > 2 && r == 1) ? 0 : r + 2;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  int64_t off = 0;
  for (int r = 0; r < c.rank(); ++r) off += counts[size_t(r)];
  const int64_t mine = counts[size_t(c.rank())];
  const std::vector<double> send = input<double>(c.rank(), total);
  std::vector<double> recv(static_cast<size_t>(mine) + 1, -7.0);  // one guard element
  c.reduce_scatter_v(recv.data(), send.data(), counts);
  for (int64_t i = 0; i < mine; ++i) {
    double want = 0;
    for (int r = 0; r < T; ++r) want += input<double>(r, total)[size_t(off + i)];
    EXPECT_NEAR(recv[size_t(i)], want, 1e-12 * (1 + std::abs(want)));
  }
  EXPECT_EQ(recv[size_t(mine)], -7.0);  // nothing written past this rank's chunk
  // Max, integers: exact.
  const std::vector<int64_t> isend = input<int64_t>(c.rank(), total);
  std::vector<int64_t> imax(static_cast<size_t>(std::max<int64_t>(mine, 1)));
  c.reduce_scatter_v(imax.data(), isend.data(), counts, ReduceOp::kMax);
  for (int64_t i = 0; i < mine; ++i) {
    int64_t want = input<int64_t>(0, total)[size_t(off + i)];
    for (int r = 1; r < T; ++r) want = std::max(want, input<int64_t>(r, total)[size_t(off + i)]);
    EXPECT_EQ(imax[size_t(i)], want);
  }
  // all_gather_v(reduce_scatter_v(x)) == all_reduce(x) (integers: exact whatever the order).
  std::vector<int64_t> isum(static_cast<size_t>(std::max<int64_t>(mine, 1)));
  c.reduce_scatter_v(isum.data(), isend.data(), counts);
  std::vector<int64_t> gathered(static_cast<size_t>(total)), reduced = isend;
  c.all_gather_v(gathered.data(), isum.data(), counts);
  c.all_reduce(reduced.data(), total);
  EXPECT_EQ(gathered, reduced);
  EXPECT_THROW(c.reduce_scatter_v(recv.data(), send.data(), std::vector<int64_t>{1}), Error);
}

// Ring bytes each rank sends: all_reduce 2(T-1)/T·S, reduce_scatter / all_gather (T-1)/T·S,
// the uneven forms the whole buffer less the chunk a ring leaves out.
TEST(Comm, SentBytesAreRingBytes) {
  Communicator& w = *world();
  CommPtr c = w.split(0, w.rank());
  const int64_t T = c->size();
  const int r = c->rank();
  std::vector<float> x(static_cast<size_t>(12 * T)), y(static_cast<size_t>(12 * T));
  c->all_reduce(x.data(), 12 * T);
  EXPECT_EQ(c->stats().sent[int(Kind::kAllReduce)], uint64_t(2 * (T - 1) * 12 * 4));
  c->reduce_scatter(y.data(), x.data(), 12);
  EXPECT_EQ(c->stats().sent[int(Kind::kReduceScatter)], uint64_t((T - 1) * 12 * 4));
  c->all_gather(y.data(), x.data(), 12);
  EXPECT_EQ(c->stats().sent[int(Kind::kAllGather)], uint64_t((T - 1) * 12 * 4));
  std::vector<int64_t> counts(static_cast<size_t>(T));
  for (int k = 0; k < T; ++k) counts[size_t(k)] = k + 1;
  const int64_t total = T * (T + 1) / 2;
  c->reset_stats();
  c->reduce_scatter_v(y.data(), x.data(), counts);
  c->all_gather_v(y.data(), x.data(), counts);
  EXPECT_EQ(c->stats().sent[int(Kind::kReduceScatter)], uint64_t((total - (r + 1)) * 4));
  EXPECT_EQ(c->stats().sent[int(Kind::kAllGather)], uint64_t((total - ((r + 1) % T + 1)) * 4));
  EXPECT_EQ(c->stats().total_sent(), uint64_t((2 * total - (r + 1) - ((r + 1) % T + 1)) * 4));
}

TEST(Comm, ReduceScatterSumAndMax) {
  Communicator& c = *world();
  const int T = c.size();
  const int64_t n = 6;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    std::vector<double> send = input<double>(c.rank(), T * n);
    std::vector<double> recv(static_cast<size_t>(n));
    c.reduce_scatter(recv.data(), send.data(), n, op);
    for (int64_t i = 0; i < n; ++i) {
      int64_t g = c.rank() * n + i;
      double want = op == ReduceOp::kSum ? 0.0 : -1e300;
      for (int r = 0; r < T; ++r) {
        double x = input<double>(r, T * n)[size_t(g)];
        want = op == ReduceOp::kSum ? want + x : std::max(want, x);
      }
      EXPECT_NEAR(recv[size_t(i)], want, 1e-12);
    }
  }
}

TEST(Comm, AllToAll) {
  Communicator& c = *world();
  const int T = c.size();
  const int64_t n = 3;
  // Rank r sends value(r, j*n + i) as element i of chunk j.
  std::vector<float> send = input<float>(c.rank(), T * n);
  std::vector<float> recv(static_cast<size_t>(T * n));
  c.all_to_all(recv.data(), send.data(), n);
  for (int j = 0; j < T; ++j)
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(recv[size_t(j * n + i)], input<float>(j, T * n)[size_t(c.rank() * n + i)]);
}

TEST(Comm, BroadcastFromEveryRoot) {
  Communicator& c = *world();
  for (int root = 0; root < c.size(); ++root) {
    std::vector<double> data = input<double>(c.rank(), 9);
    c.broadcast(data.data(), 9, root);
    EXPECT_EQ(data, input<double>(root, 9));
  }
  double dummy = 0;
  EXPECT_THROW(c.broadcast(&dummy, 1, c.size()), Error);
}

TEST(Comm, AsyncHandlesOverlapAndWaitOutOfOrder) {
  Communicator& c = *world();
  const int T = c.size();
  std::vector<float> a = input<float>(c.rank(), 100);
  std::vector<float> g(static_cast<size_t>(T * 10));
  std::vector<float> gs = input<float>(c.rank(), 10);
  std::vector<float> rs_in = input<float>(c.rank(), T * 4), rs_out(4);
  std::vector<float> b = input<float>(c.rank(), 7);
  std::vector<float> tin = input<float>(c.rank(), T * 2), tout(size_t(T * 2));
  Work w1 = c.all_reduce_async(a.data(), 100);
  Work w2 = c.all_gather_async(g.data(), gs.data(), 10);
  Work w3 = c.reduce_scatter_async(rs_out.data(), rs_in.data(), 4);
  Work w4 = c.broadcast_async(b.data(), 7, T - 1);
  Work w5 = c.all_to_all_async(tout.data(), tin.data(), 2);
  EXPECT_TRUE(w1.pending());
  w5.wait();
  w3.wait();
  w1.wait();
  w1.wait();  // idempotent
  w4.wait();
  w2.wait();
  EXPECT_FALSE(w1.pending());
  for (int64_t i = 0; i < 100; ++i) {
    double want = 0;
    for (int r = 0; r < T; ++r) want += input<float>(r, 100)[size_t(i)];
    EXPECT_NEAR(a[size_t(i)], want, 1e-4);
  }
  for (int r = 0; r < T; ++r) EXPECT_EQ(g[size_t(r * 10 + 3)], input<float>(r, 10)[3]);
  double want_rs = 0;
  for (int r = 0; r < T; ++r) want_rs += input<float>(r, T * 4)[size_t(c.rank() * 4 + 1)];
  EXPECT_NEAR(rs_out[1], want_rs, 1e-5);
  EXPECT_EQ(b, input<float>(T - 1, 7));
  for (int j = 0; j < T; ++j) EXPECT_EQ(tout[size_t(j * 2 + 1)], input<float>(j, T * 2)[size_t(c.rank() * 2 + 1)]);
}

TEST(Comm, SplitEvenOddGroups) {
  Communicator& w = *world();
  // Reverse order inside the group through the key.
  CommPtr sub = w.split(w.rank() % 2, -w.rank());
  int members = (w.size() + 1 - w.rank() % 2) / 2;
  EXPECT_EQ(sub->size(), members);
  std::vector<int32_t> ranks(static_cast<size_t>(sub->size()));
  int32_t me = w.rank();
  sub->all_gather(ranks.data(), &me, 1);
  EXPECT_EQ(ranks[size_t(sub->rank())], me);
  for (size_t i = 1; i < ranks.size(); ++i) EXPECT_GT(ranks[i - 1], ranks[i]);  // key = -rank
  for (int32_t r : ranks) EXPECT_EQ(r % 2, w.rank() % 2);
  int64_t sum = w.rank();
  sub->all_reduce(&sum, 1);
  int64_t want = 0;
  for (int r = w.rank() % 2; r < w.size(); r += 2) want += r;
  EXPECT_EQ(sum, want);
  EXPECT_THROW(w.split(-1, 0), Error);
}

// 16-bit words (bf16 bits, as ISP's bf16 weight gathers send): moved bit for bit, in place too,
// counted at 2 bytes each; reducing them is an Error on every rank before anything is sent.
TEST(Comm, AllGatherOf16BitWords) {
  Communicator& c = *world();
  const int T = c.size();
  const int64_t n = 7;
  auto word = [](int r, int64_t i) { return uint16_t(0xFF80u + 97u * unsigned(r) + unsigned(i)); };
  std::vector<uint16_t> recv(static_cast<size_t>(T * n));
  for (int64_t i = 0; i < n; ++i) recv[size_t(c.rank() * n + i)] = word(c.rank(), i);
  const uint64_t before = c.stats().bytes[int(Kind::kAllGather)];
  c.all_gather_async(recv.data(), recv.data() + c.rank() * n, n).wait();
  for (int r = 0; r < T; ++r)
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(recv[size_t(r * n + i)], word(r, i));
  EXPECT_EQ(c.stats().bytes[int(Kind::kAllGather)] - before, uint64_t(T > 1 ? 2 * n : 0));
  EXPECT_THROW(c.all_reduce(recv.data(), n), Error);
  EXPECT_THROW(c.reduce_scatter(recv.data(), recv.data(), 1), Error);
}

TEST(Comm, PayloadBytesPerKind) {
  Communicator& w = *world();
  CommPtr c = w.split(0, w.rank());
  CommStats before = global_stats();
  std::vector<float> x(static_cast<size_t>(10 * c->size()));
  std::vector<float> y(static_cast<size_t>(10 * c->size()));
  c->all_reduce(x.data(), 10);
  c->all_gather(y.data(), x.data(), 10);
  c->reduce_scatter(y.data(), x.data(), 10);
  c->all_to_all(y.data(), x.data(), 10);
  c->broadcast(x.data(), 3, 0);
  c->barrier();
  const CommStats& s = c->stats();
  int64_t T = c->size();
  EXPECT_EQ(s.bytes[int(Kind::kAllReduce)], 40u);
  EXPECT_EQ(s.bytes[int(Kind::kAllGather)], 40u);
  EXPECT_EQ(s.bytes[int(Kind::kReduceScatter)], uint64_t(40 * T));
  EXPECT_EQ(s.bytes[int(Kind::kAllToAll)], uint64_t(40 * T));
  EXPECT_EQ(s.bytes[int(Kind::kBroadcast)], 12u);
  EXPECT_EQ(s.calls[int(Kind::kBarrier)], 1u);
  EXPECT_EQ(s.total_bytes(), uint64_t(40 + 40 + 80 * T + 12));
  EXPECT_EQ(global_stats().total_bytes() - before.total_bytes(), s.total_bytes());
  EXPECT_EQ(c->sequence(), 6u);
  c->reset_stats();
  EXPECT_EQ(c->stats().total_bytes(), 0u);
}

// A ring of nonblocking point-to-point messages (ring attention's K/V hop): rank r sends r-filled
// data of r + 1 floats to r + 1 and receives rank r − 1's, with two tags in flight at once; sends
// count their bytes under "send", receives nothing, skipped bytes are kept beside them.
TEST(Comm, PointToPointRingAndSkippedBytes) {
  CommPtr c = world()->split(0, world()->rank());
  const int T = c->size(), r = c->rank();
  if (T == 1) {
    float x = 0;
    EXPECT_THROW((void)c->send_async(&x, 1, 0, 0), Error);
    return;
  }
  const int next = (r + 1) % T, prev = (r + T - 1) % T;
  std::vector<float> out(size_t(r + 1), float(r)), in(size_t(prev + 1), -1.f);
  std::vector<int32_t> out2{r, 7}, in2(2, -1);
  Work a = c->recv_async(in.data(), prev + 1, prev, 1);
  Work b = c->recv_async(in2.data(), 2, prev, 2);
  Work s2 = c->send_async(out2.data(), 2, next, 2);
  Work s1 = c->send_async(out.data(), r + 1, next, 1);
  a.wait();
  b.wait();
  s1.wait();
  s2.wait();
  for (float v : in) EXPECT_EQ(v, float(prev));
  EXPECT_EQ(in2, (std::vector<int32_t>{prev, 7}));
  c->count_skipped(Kind::kSend, 100);
  EXPECT_EQ(c->stats().calls[int(Kind::kSend)], 2u);
  EXPECT_EQ(c->stats().bytes[int(Kind::kSend)], uint64_t(4 * (r + 1) + 8));
  EXPECT_EQ(c->stats().skipped[int(Kind::kSend)], 100u);
  EXPECT_EQ(c->sequence(), 0u);  // not collectives: no order-check sequence number
  float x = 0;
  EXPECT_THROW((void)c->send_async(&x, 1, T, 0), Error);
}

TEST(Comm, OrderCheckNamesTheMismatch) {
  Communicator& w = *world();
  CommPtr c = w.split(0, w.rank());
  c->set_checking(true);
  std::vector<float> x(8, 1.f);
  // Different counts on rank 0: the check throws on every rank before any data moves.
  try {
    c->all_reduce(x.data(), c->rank() == 0 ? 3 : 4);
    ADD_FAILURE() << "no error for mismatched counts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collective order mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("count 3"), std::string::npos) << e.what();
  }
  // Different kinds.
  try {
    if (c->rank() == c->size() - 1)
      c->broadcast(x.data(), 4, 0);
    else
      c->all_reduce(x.data(), 4);
    ADD_FAILURE() << "no error for mismatched kinds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast"), std::string::npos) << e.what();
  }
  // Matching calls pass the check and still compute.
  c->all_reduce(x.data(), 8);
  EXPECT_EQ(x[0], float(c->size()));
}

// The communicators of a grid hold exactly the world ranks group_ranks names.
void check_grid(const Layout& layout) {
  Communicator& w = *world();
  parallel::Grid g = parallel::make_grid(world(), layout);
  EXPECT_EQ(g.tp * g.dp, w.size());
  for (Group kind : {Group::kTensor, Group::kData, Group::kWeight, Group::kWeightData, Group::kZero1,
                     Group::kZero1Replica, Group::kX, Group::kY}) {
    std::vector<int> want = parallel::group_ranks(layout, w.size(), kind, w.rank());
    Communicator& c = *g.get(kind);
    std::vector<int32_t> got(static_cast<size_t>(c.size()));
    int32_t me = w.rank();
    c.all_gather(got.data(), &me, 1);
    EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want) << group_name(kind);
  }
}

TEST(Comm, AllRanksOnThisMachine) {
  // mpirun on one machine: every rank shares the node (the MPI tests never span machines).
  EXPECT_EQ(ranks_on_node(), world()->size());
  EXPECT_TRUE(mpi_active());
}

TEST(Comm, ProcessGridLayouts) {
  const int W = world()->size();
  check_grid(Layout{});
  check_grid(Layout{.tensor_size = 2, .tensor_mode = TensorMode::kMsp, .zero1_size = -1});
  check_grid(Layout{.tensor_size = 2, .tensor_mode = TensorMode::kIsp, .weight_size = W});
  check_grid(Layout{.zero1_size = W});
  check_grid(Layout{.tensor_2d_x = 2, .tensor_2d_y = 1});
  if (W >= 4) {
    check_grid(Layout{.tensor_size = 4, .tensor_mode = TensorMode::kFsp});
    check_grid(Layout{.tensor_size = 2, .tensor_mode = TensorMode::kIsp, .weight_size = 4,
                      .zero1_size = -1});
    check_grid(Layout{.tensor_2d_x = 2, .tensor_2d_y = 2});
    check_grid(Layout{.zero1_size = 2, .tensor_2d_x = 1, .tensor_2d_y = 2});
    check_grid(Layout{.zero1_size = 2});
  }
  EXPECT_THROW(parallel::make_grid(world(), Layout{.tensor_size = W + 1}), Error);
}

}  // namespace
}  // namespace longtron::comm
