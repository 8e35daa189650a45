// The one-rank communicator: identity all-reduce/broadcast, copying gathers and scatters, split,
// async handles and byte counters (a group of one sends nothing); and comm::init without mpirun.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace longtron::comm {
namespace {

TEST(LocalComm, RankSizeAndIdentityCollectives) {
  CommPtr c = make_local_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> x = {1.5f, -2.f, 3.f};
  c->all_reduce(x.data(), 3);
  c->all_reduce(x.data(), 3, ReduceOp::kMax);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.f, 3.f}));
  std::vector<float> y(3, 0.f);
  c->all_gather(y.data(), x.data(), 3);
  EXPECT_EQ(y, x);
  std::vector<double> d = {4, 5}, e(2);
  c->reduce_scatter(e.data(), d.data(), 2);
  EXPECT_EQ(e, d);
  std::vector<int64_t> i = {7, 8, 9}, j(3);
  c->all_to_all(j.data(), i.data(), 3);
  EXPECT_EQ(j, i);
  c->broadcast(i.data(), 3, 0);
  EXPECT_EQ(i, (std::vector<int64_t>{7, 8, 9}));
  std::vector<int32_t> k = {1, 2}, l(2);
  c->all_gather_v(l.data(), k.data(), {2});
  EXPECT_EQ(l, k);
  c->barrier();
  EXPECT_EQ(c->sequence(), 8u);
}

TEST(LocalComm, AsyncHandlesCompleteAndCountNothingSent) {
  CommPtr c = make_local_communicator();
  std::vector<float> x = {1, 2}, y(2);
  Work w = c->all_gather_async(y.data(), x.data(), 2);
  w.wait();
  w.wait();
  EXPECT_FALSE(w.pending());
  EXPECT_EQ(y, x);
  EXPECT_EQ(c->stats().calls[int(Kind::kAllGather)], 1u);
  EXPECT_EQ(c->stats().total_bytes(), 0u);  // a group of one sends nothing
}

TEST(LocalComm, ReduceScatterVOfOneRankCopiesItsChunk) {
  CommPtr c = make_local_communicator();
  std::vector<double> x = {1.5, -2.0, 3.25}, y(4, 9.0);
  c->reduce_scatter_v(y.data(), x.data(), {3});
  EXPECT_EQ(y, (std::vector<double>{1.5, -2.0, 3.25, 9.0}));
  EXPECT_EQ(c->stats().calls[int(Kind::kReduceScatter)], 1u);
  EXPECT_EQ(c->stats().total_sent(), 0u);  // a group of one sends nothing
  EXPECT_THROW(c->reduce_scatter_v(y.data(), x.data(), {1, 2}), Error);
  EXPECT_THROW(c->reduce_scatter_v(y.data(), x.data(), {-1}), Error);
}

TEST(LocalComm, SplitAndErrors) {
  CommPtr c = make_local_communicator();
  CommPtr s = c->split(3, 0);
  EXPECT_EQ(s->size(), 1);
  EXPECT_THROW(c->split(-1, 0), Error);
  float v = 1;
  EXPECT_THROW(c->broadcast(&v, 1, 1), Error);
  EXPECT_THROW(c->all_reduce(&v, -1), Error);
  std::vector<float> out(3);
  EXPECT_THROW(c->all_gather_v(out.data(), &v, {1, 2}), Error);
}

TEST(LocalComm, InitWithoutMpirunIsOneRank) {
  if (launched_by_mpi()) GTEST_SKIP() << "running under mpirun";
  int argc = 1;
  char name[] = "local_comm_test";
  char* args[] = {name, nullptr};
  char** argv = args;
  CommPtr world = init(argc, argv);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
  EXPECT_FALSE(mpi_active());
  EXPECT_EQ(ranks_on_node(), 1);
  EXPECT_EQ(init(argc, argv), world);
  world.reset();
  finalize();
}

TEST(LocalComm, AbortOnErrorWithoutMpiReturnsStatus) {
  testing::internal::CaptureStderr();
  int status = abort_on_error([]() -> int { fail("bad key {}", "x.y"); }, "test");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1);
  EXPECT_NE(err.find("test: error: bad key x.y"), std::string::npos) << err;
  EXPECT_EQ(abort_on_error([] { return 3; }), 3);
}

}  // namespace
}  // namespace longtron::comm
