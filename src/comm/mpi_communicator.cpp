// The MPI communicator and the process-level MPI helpers (init, finalize, abort). This file and its
// siblings in src/comm/ are the only ones that include <mpi.h>.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <optional>
#include <thread>
#include <new>
#include <cstdlib>
#include <unistd.h>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/phase.h"

namespace longtron::comm {
namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kUInt16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// MPI counts are int: refuse larger chunks instead of truncating them.
int mpi_count(int64_t count, Kind kind) {
  check(count <= INT_MAX, "communicator: {} of {} elements exceeds MPI's int count limit",
        kind_name(kind), count);
  return int(count);
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// An MPI request behind a Work handle.
struct MpiWork final : Work::Impl {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<int> counts;  // a non-blocking _v collective's count array, alive until completion
  void wait() override {
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  bool test() override {
    int done = 1;
    if (request != MPI_REQUEST_NULL) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  ~MpiWork() override {
    if (request != MPI_REQUEST_NULL && !mpi_finalized()) MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
};

class MpiCommunicator final : public Communicator {
 public:
  // `owned`: the communicator came from MPI_Comm_split and is freed with this object.
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    if (owned_ && comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<Communicator> split(int color, int key) override {
    check(color >= 0, "communicator: split color must be >= 0, got {}", color);
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm_, color, key, &sub);
    auto result = std::make_shared<MpiCommunicator>(sub, true);
    result->set_checking(checking());
    return result;
  }

 protected:
  Work do_issue(const Op& op, const void* send, void* recv,
                const std::vector<int64_t>* counts) override {
    if (counts && op.kind == Kind::kReduceScatter) return reduce_scatter_v(op, send, recv, *counts);
    if (counts) return all_gather_v(op, send, recv, *counts);
    auto work = std::make_unique<MpiWork>();
    MPI_Request* req = &work->request;
    MPI_Datatype type = mpi_type(op.dtype);
    int n = mpi_count(op.count, op.kind);
    switch (op.kind) {
      case Kind::kAllReduce:
        MPI_Iallreduce(MPI_IN_PLACE, recv, n, type, mpi_op(op.reduce), comm_, req);
        break;
      case Kind::kAllGather: {
        // send aliasing recv's own chunk is the in-place form.
        auto* own = static_cast<char*>(recv) + int64_t(rank_) * op.count * dtype_size(op.dtype);
        const void* s = (send == own) ? MPI_IN_PLACE : send;
        MPI_Iallgather(s, n, type, recv, n, type, comm_, req);
        break;
      }
      case Kind::kReduceScatter:
        MPI_Ireduce_scatter_block(send, recv, n, type, mpi_op(op.reduce), comm_, req);
        break;
      case Kind::kAllToAll: MPI_Ialltoall(send, n, type, recv, n, type, comm_, req); break;
      case Kind::kBroadcast: MPI_Ibcast(recv, n, type, op.root, comm_, req); break;
      case Kind::kBarrier: MPI_Ibarrier(comm_, req); break;
      case Kind::kSend: fail("communicator: a send is not a collective");
    }
    return Work(std::move(work));
  }

  Work do_point_to_point(bool send, void* data, int64_t count, DType dtype, int peer,
                         int tag) override {
    auto work = std::make_unique<MpiWork>();
    const int n = mpi_count(count, Kind::kSend);
    if (send)
      MPI_Isend(data, n, mpi_type(dtype), peer, tag, comm_, &work->request);
    else
      MPI_Irecv(data, n, mpi_type(dtype), peer, tag, comm_, &work->request);
    return Work(std::move(work));
  }

  std::vector<int64_t> gather_check_words(const std::vector<int64_t>& words) override {
    std::vector<int64_t> all(words.size() * size_t(size_));
    MPI_Allgather(words.data(), int(words.size()), MPI_INT64_T, all.data(), int(words.size()),
                  MPI_INT64_T, comm_);
    return all;
  }

 private:
  Work all_gather_v(const Op& op, const void* send, void* recv,
                    const std::vector<int64_t>& counts) {
    std::vector<int> n(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      check(counts[r] >= 0, "communicator: all_gather_v count {} of rank {} is negative",
            counts[r], r);
      n[r] = mpi_count(counts[r], op.kind);
      displs[r] = mpi_count(offset, op.kind);
      offset += counts[r];
    }
    MPI_Datatype type = mpi_type(op.dtype);
    // send aliasing recv's own segment is the in-place form (MPI forbids overlapping buffers).
    const auto* own = static_cast<const char*>(recv) + int64_t(displs[rank_]) * dtype_size(op.dtype);
    const void* s = (send == own) ? MPI_IN_PLACE : send;
    MPI_Allgatherv(s, n[rank_], type, recv, n.data(), displs.data(), type, comm_);
    return Work();
  }

  // MPI_Ireduce_scatter (uneven chunks); send and recv do not overlap (the header's rule). The
  // count array lives in the handle: MPI reads it until the operation completes.
  Work reduce_scatter_v(const Op& op, const void* send, void* recv,
                        const std::vector<int64_t>& counts) {
    auto work = std::make_unique<MpiWork>();
    work->counts.resize(static_cast<size_t>(size_));
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      work->counts[size_t(r)] = mpi_count(counts[size_t(r)], op.kind);
      total += counts[size_t(r)];
    }
    mpi_count(total, op.kind);
    MPI_Ireduce_scatter(send, recv, work->counts.data(), mpi_type(op.dtype), mpi_op(op.reduce),
                        comm_, &work->request);
    return Work(std::move(work));
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

bool g_we_initialised = false;
CommPtr g_world;
// A duplicate of MPI_COMM_WORLD used only by the error agreement (agree_on_error), so that its
// barrier can never match a collective of the job's own communicators.
MPI_Comm g_error_comm = MPI_COMM_NULL;

// How long a failing rank waits for the others to fail too before it aborts the job: ranks that
// hit the same error (a config or checkpoint-folder check, done by every rank at the same point)
// arrive within this; a rank failing alone while the others wait in a collective costs the job
// this much more before MPI_Abort ends it.
constexpr std::chrono::seconds kErrorAgreementWait{3};

}  // namespace

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(name)) return true;
  return false;
}

CommPtr init(int& argc, char**& argv) {
  if (g_world) return g_world;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised && launched_by_mpi()) {
    int provided = 0;
    // Only the main thread calls MPI (OpenMP threads compute), so FUNNELED is enough.
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    g_we_initialised = true;
    initialised = 1;
  }
  if (initialised) {
    g_world = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, false);
    if (g_error_comm == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &g_error_comm);
  } else
    g_world = make_local_communicator();
  return g_world;
}

void finalize() {
  g_world.reset();
  if (g_error_comm != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&g_error_comm);
  g_error_comm = MPI_COMM_NULL;
  if (g_we_initialised && !mpi_finalized()) MPI_Finalize();
  g_we_initialised = false;
}

bool mpi_active() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised || mpi_finalized()) return false;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size > 1;
}

int ranks_on_node() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised || mpi_finalized()) return 1;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int size = 1;
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return size;
}

static int world_rank() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised || mpi_finalized()) return -1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void abort_job(const std::string& message, int status) {
  // One write per line, so lines of ranks failing at once do not run into each other.
  const std::string line = message + "\n";
  std::fflush(stderr);
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0) std::fputs(line.c_str(), stderr);
  std::fflush(stdout);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);
}

namespace {

/// One write per line, so lines of ranks failing at once do not run into each other.
void write_line(const std::string& text) {
  const std::string line = text + "\n";
  std::fflush(stdout);
  std::fflush(stderr);
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0) std::fputs(line.c_str(), stderr);
}

/// Under MPI after this rank failed with `message`: waits up to kErrorAgreementWait for every rank
/// of the world to fail too (a barrier on g_error_comm that only failing ranks enter). When they
/// all do, rank 0 prints `label: message`, a rank whose message differs from rank 0's prints its
/// own with its rank, and every rank returns the largest status, so that the caller finalises MPI
/// and exits instead of aborting. nullopt when some rank did not arrive in time (it is still
/// computing or waits in a collective): the caller aborts the job.
std::optional<int> agree_on_error(const std::string& message, int status, const std::string& label) {
  if (g_error_comm == MPI_COMM_NULL) return std::nullopt;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(g_error_comm, &request);
  const auto deadline = std::chrono::steady_clock::now() + kErrorAgreementWait;
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;  // MPI_Abort follows
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int rank = 0;
  MPI_Comm_rank(g_error_comm, &rank);
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, g_error_comm);
  std::string first = rank == 0 ? message : std::string(size_t(length), '\0');
  MPI_Bcast(first.data(), length, MPI_CHAR, 0, g_error_comm);
  int worst = status;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, g_error_comm);
  if (rank == 0)
    write_line(fmt::format("{}: {}", label, message));
  else if (message != first)
    write_line(fmt::format("{}: rank {}: {}", label, rank, message));
  return worst;
}

}  // namespace

int abort_on_error(const std::function<int()>& body, const std::string& label) {
  std::string message;
  int status = 1;
  try {
    return body();
  } catch (const Error& e) {
    message = fmt::format("error: {}", e.what());
  } catch (const std::bad_alloc&) {
    message = "error: " + out_of_memory_message();
  } catch (const std::exception& e) {
    message = fmt::format("internal error: {}", e.what());
    status = 2;
  }
  if (mpi_active()) {
    if (const std::optional<int> agreed = agree_on_error(message, status, label)) return *agreed;
    abort_job(fmt::format("{}: rank {}: {}", label, world_rank(), message), status);
  }
  std::fputs(fmt::format("{}: {}\n", label, message).c_str(), stderr);
  return status;
}

int run_on_world(const std::function<int(const CommPtr& world)>& body, const std::string& label) {
  int argc = 0;
  char** argv = nullptr;
  CommPtr world = init(argc, argv);  // under mpirun: the MPI world; else one rank
  const int status = abort_on_error([&] { return body(world); }, label);
  world.reset();
  finalize();
  return status;
}

}  // namespace longtron::comm
