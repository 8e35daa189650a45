// The communicator: rank, size, sub-groups and collectives with async handles, in the shape of
// PyTorch c10d's ProcessGroup. Two implementations: over MPI (mpi_communicator.cpp,
// the only files that include <mpi.h>) and a one-rank identity one (local_communicator.cpp, Marian's
// fake single-process communicator), so a plain `longtron train` needs no mpirun.
//
// Rules every caller relies on:
// - Collectives are called in the same order, with the same kind and count, on every rank of a
//   group. With LONGTRON_COMM_CHECK=1 (default on in builds without NDEBUG, off with =0) each
//   collective first all-gathers (sequence number, kind, count, dtype, op/root) across the group and
//   throws longtron::Error naming the first mismatching rank — instead of hanging or corrupting.
// - Chunks are in group-rank order: chunk r of a gather/scatter belongs to group rank r.
// - Buffers of an async call must stay alive and untouched until wait() returns.
// - Payload bytes (stats()) are the bytes of the buffer this rank hands to the collective: count ×
//   element size for all_reduce/broadcast, the send chunk for all_gather, the whole send buffer
//   (size × chunk) for reduce_scatter and all_to_all, the message for a point-to-point send (a
//   receive counts nothing). Groups of one rank send nothing and count 0 bytes (their calls are
//   still counted).
// - Sent bytes (stats().sent) are what this rank puts on the wire under the ring algorithms, the
//   way NCCL's tests count "bus bytes": all_reduce 2(n−1)/n·S of an S-byte buffer (a ring
//   reduce-scatter then a ring all-gather); reduce_scatter and all_gather (n−1)/n·S of the whole
//   S-byte result (exactly S minus one chunk: a ring reduce-scatter sends every chunk but this
//   rank's own, a ring all-gather every chunk but the successor's, so uneven _v forms count the
//   real chunk sizes); all_to_all (n−1) chunks; broadcast S (a chain from the root: the rank
//   before the root sends 0); a point-to-point send its message. Whatever MPI really runs, these
//   are the bytes an ideal ring implementation moves per rank. Skipped bytes (count_skipped) are what a caller chose not to send because no
//   receiver could use them (ring attention's invisible K/V rows), counted per kind beside them.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace longtron::comm {

/// Reduction of all_reduce / reduce_scatter.
enum class ReduceOp { kSum, kMax };

/// Element types the collectives accept (the template wrappers map C++ types onto these).
/// kUInt16: raw 16-bit words (uint16_t), e.g. bf16 bits; only moved (all_gather, all_to_all,
/// broadcast, send), never reduced: all_reduce / reduce_scatter of kUInt16 is an Error.
enum class DType { kFloat32, kFloat64, kInt64, kInt32, kUInt16 };

/// Collective kinds, for the byte counters and the order check.
enum class Kind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kBarrier, kSend };
inline constexpr int kNumKinds = 7;
/// "all_reduce", "all_gather", ... (stable names for benchmark output).
const char* kind_name(Kind kind);

/// Calls, payload bytes and skipped bytes per collective kind (indexed by int(Kind)).
struct CommStats {
  std::array<uint64_t, kNumKinds> calls{};
  std::array<uint64_t, kNumKinds> bytes{};
  std::array<uint64_t, kNumKinds> skipped{};
  std::array<uint64_t, kNumKinds> sent{};  ///< ring-algorithm bytes this rank sends (see above)
  uint64_t total_bytes() const;
  /// Σ sent over every kind.
  uint64_t total_sent() const;
  void add(const CommStats& other);
};

/// The process-wide sum of every communicator's stats (all groups of this rank).
CommStats& global_stats();

/// An in-flight collective. wait() blocks until the buffers may be used (idempotent). A handle that
/// was never waited on waits in its destructor. test() asks without blocking (MPI_Test): besides
/// answering, it lets MPI progress the collective, which a non-blocking collective needs on a
/// process without an MPI progress thread (call it between pieces of computation to overlap a
/// reduction with them, as PyTorch DDP's bucketed all-reduce does). Move-only.
class Work {
 public:
  /// What an implementation puts behind a handle.
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
    /// Whether the operation is complete (then the buffers may be used); never blocks. The
    /// default waits (for implementations that complete synchronously).
    virtual bool test() {
      wait();
      return true;
    }
  };
  Work() = default;  ///< an already-complete handle
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();
  void wait();
  /// Progresses the operation and returns whether it is complete (then the handle is released,
  /// as by wait()). Never blocks; true for an already-complete handle.
  bool test();
  bool pending() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
};

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::kUInt16; }
/// Bytes of one element.
int64_t dtype_size(DType dtype);

/// A group of ranks. All typed methods accept T in {float, double, int64_t, int32_t}, and the ones
/// that only move data also uint16_t (16-bit words such as bf16 bits).
/// Counts are element counts (int64_t); every error (bad root, negative count, mismatched
/// collective order under the check) is a longtron::Error.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;
  /// Collective over this group (MPI_Comm_split semantics): ranks with the same color form a new
  /// group, ordered by (key, rank in this group). color must be >= 0.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;
  /// Blocks until every rank of the group has arrived.
  void barrier();

  /// In place: data[count] becomes the element-wise reduction over the group.
  template <typename T>
  void all_reduce(T* data, int64_t count, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(data, count, op).wait();
  }
  template <typename T>
  [[nodiscard]] Work all_reduce_async(T* data, int64_t count, ReduceOp op = ReduceOp::kSum) {
    return issue({Kind::kAllReduce, dtype_of<T>(), count, op, 0}, data, data, nullptr);
  }

  /// recv[size()*count] = concat over group ranks r of rank r's send[count]. send may alias
  /// recv + rank()*count (in place).
  template <typename T>
  void all_gather(T* recv, const T* send, int64_t count) {
    all_gather_async(recv, send, count).wait();
  }
  template <typename T>
  [[nodiscard]] Work all_gather_async(T* recv, const T* send, int64_t count) {
    return issue({Kind::kAllGather, dtype_of<T>(), count, ReduceOp::kSum, 0}, send, recv, nullptr);
  }

  /// Uneven gather: recv[Σ counts] = concat of rank r's send[counts[r]]; counts has size() entries
  /// and is the same on every rank. send may alias recv + Σ_{r<rank()} counts[r] (in place).
  template <typename T>
  void all_gather_v(T* recv, const T* send, const std::vector<int64_t>& counts) {
    issue({Kind::kAllGather, dtype_of<T>(), -1, ReduceOp::kSum, 0}, send, recv, &counts).wait();
  }

  /// recv[count] = Σ (or max) over group ranks of their send[r*count .. (r+1)*count) where r is
  /// this rank: chunk r of the reduced send[size()*count].
  template <typename T>
  void reduce_scatter(T* recv, const T* send, int64_t count, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(recv, send, count, op).wait();
  }
  /// Uneven reduce-scatter: recv[counts[rank()]] = Σ (or max) over group ranks of their chunk
  /// rank() of send[Σ counts], the chunks laid out in group-rank order (chunk r starts at
  /// Σ_{j<r} counts[j]). counts has size() entries and is the same on every rank; recv must not
  /// overlap send. Its adjoint is all_gather_v with the same counts (and vice versa): the gradient
  /// of a sum-reduce-scatter is the gather of the chunks' gradients.
  template <typename T>
  void reduce_scatter_v(T* recv, const T* send, const std::vector<int64_t>& counts,
                        ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_v_async(recv, send, counts, op).wait();
  }
  /// The non-blocking reduce_scatter_v (MPI_Ireduce_scatter): the handle keeps its own copy of
  /// `counts`; send and recv stay untouched until wait().
  template <typename T>
  [[nodiscard]] Work reduce_scatter_v_async(T* recv, const T* send,
                                            const std::vector<int64_t>& counts,
                                            ReduceOp op = ReduceOp::kSum) {
    return issue({Kind::kReduceScatter, dtype_of<T>(), -1, op, 0}, send, recv, &counts);
  }
  template <typename T>
  [[nodiscard]] Work reduce_scatter_async(T* recv, const T* send, int64_t count,
                                          ReduceOp op = ReduceOp::kSum) {
    return issue({Kind::kReduceScatter, dtype_of<T>(), count, op, 0}, send, recv, nullptr);
  }

  /// send[size()*count]: chunk j goes to group rank j; recv[size()*count]: chunk j came from group
  /// rank j. send and recv must not overlap.
  template <typename T>
  void all_to_all(T* recv, const T* send, int64_t count) {
    all_to_all_async(recv, send, count).wait();
  }
  template <typename T>
  [[nodiscard]] Work all_to_all_async(T* recv, const T* send, int64_t count) {
    return issue({Kind::kAllToAll, dtype_of<T>(), count, ReduceOp::kSum, 0}, send, recv, nullptr);
  }

  /// data[count] on every rank becomes root's data[count].
  template <typename T>
  void broadcast(T* data, int64_t count, int root) {
    broadcast_async(data, count, root).wait();
  }
  template <typename T>
  [[nodiscard]] Work broadcast_async(T* data, int64_t count, int root) {
    return issue({Kind::kBroadcast, dtype_of<T>(), count, ReduceOp::kSum, root}, data, data,
                 nullptr);
  }

  /// Point-to-point, nonblocking (MPI_Isend / MPI_Irecv): data[count] to / from group rank
  /// `peer` with message tag `tag` (>= 0). Not collective and not order-checked: the caller
  /// pairs every send with the peer's receive of the same count and tag (messages between two
  /// ranks with one tag arrive in order). A send counts as Kind::kSend; a receive counts nothing.
  /// A one-rank group has no peer: Error.
  template <typename T>
  [[nodiscard]] Work send_async(const T* data, int64_t count, int peer, int tag) {
    return point_to_point(true, const_cast<T*>(data), count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  [[nodiscard]] Work recv_async(T* data, int64_t count, int peer, int tag) {
    return point_to_point(false, data, count, dtype_of<T>(), peer, tag);
  }
  /// Records `bytes` of kind `kind` that this rank did not send because no receiver could use
  /// them (stats().skipped and global_stats().skipped).
  void count_skipped(Kind kind, uint64_t bytes);

  /// Calls and payload bytes of this group since creation (or the last reset_stats()).
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  /// Number of collectives issued on this group so far (the order-check sequence number).
  uint64_t sequence() const { return sequence_; }
  /// Whether the cross-rank order check runs before each collective (LONGTRON_COMM_CHECK).
  bool checking() const { return check_; }
  void set_checking(bool on) { check_ = on; }

  /// Description of one collective call (what the order check compares).
  struct Op {
    Kind kind;
    DType dtype;
    int64_t count;  ///< per-rank chunk (all_gather, reduce_scatter, all_to_all) or buffer size; -1 = v
    ReduceOp reduce;
    int root;
  };

 protected:
  Communicator();
  /// The implementation of every collective: `send`/`recv` as documented per method above
  /// (all_reduce and broadcast pass the same in-place buffer twice); `counts` only for all_gather_v
  /// and reduce_scatter_v (op.kind tells which).
  virtual Work do_issue(const Op& op, const void* send, void* recv,
                        const std::vector<int64_t>* counts) = 0;
  /// Starts MPI_Isend (send) or MPI_Irecv of data[count] with group rank `peer`. The default
  /// (groups that never talk point to point) throws Error.
  virtual Work do_point_to_point(bool send, void* data, int64_t count, DType dtype, int peer,
                                 int tag);
  /// Gathers `words` from every rank (blocking, NOT counted): used by the order check.
  virtual std::vector<int64_t> gather_check_words(const std::vector<int64_t>& words) = 0;

 private:
  Work issue(const Op& op, const void* send, void* recv, const std::vector<int64_t>* counts);
  Work point_to_point(bool send, void* data, int64_t count, DType dtype, int peer, int tag);
  void check_order(const Op& op);
  CommStats stats_;
  uint64_t sequence_ = 0;
  bool check_ = false;
};

using CommPtr = std::shared_ptr<Communicator>;

/// A one-rank group with identity semantics (all_reduce leaves data, gathers and scatters copy).
CommPtr make_local_communicator();

/// Whether this process was started by mpirun/mpiexec (OpenMPI, PMIx or MPICH environment).
bool launched_by_mpi();

/// Starts communication for the process: under mpirun initialises MPI (thread level FUNNELED) and
/// returns the MPI world; otherwise returns a one-rank local communicator and never touches MPI.
/// Safe to call more than once (returns the same world).
CommPtr init(int& argc, char**& argv);

/// Finalises MPI if init() started it (all communicators must be destroyed first or unused).
void finalize();

/// Whether MPI is initialised with more than one rank in the world.
bool mpi_active();

/// Number of ranks of the world on this machine (MPI_Comm_split_type SHARED; 1 without MPI), for
/// set_num_threads(n, ranks_on_node) so several ranks never oversubscribe the cores (docs/cluster.md).
int ranks_on_node();

/// Runs body() and returns its exit status. If it throws (Error: status 1, out of memory: 1, any
/// other exception: 2), the error ends the job:
///  - without MPI (or on one rank) it prints "<label>: error: <what>" to stderr and returns the
///    status;
///  - under MPI, when every rank fails within a few seconds of each other (an error each rank
///    sees, e.g. a config check), the ranks agree: rank 0 prints "<label>: error: <what>" once (a
///    rank failing differently adds its own line with its rank), and every rank returns the
///    largest status, for the caller to finalise MPI and exit without MPI_Abort's noise;
///  - under MPI when some rank does not fail (it computes on or waits in a collective), the rank
///    prints "<label>: rank R: error: <what>" and calls MPI_Abort, so that the whole job ends
///    within seconds instead of leaving the other ranks blocked.
int abort_on_error(const std::function<int()>& body, const std::string& label = "longtron");

/// The process-level wrapper of a command that may run under mpirun: init() (the MPI world under
/// mpirun, else one rank), body(world) inside abort_on_error, then finalize(). Returns the exit
/// status (body's, or abort_on_error's after an error every rank saw).
int run_on_world(const std::function<int(const CommPtr& world)>& body,
                 const std::string& label = "longtron");

/// Ends the whole job now with `message` on stderr (MPI_Abort under MPI, exit otherwise).
[[noreturn]] void abort_job(const std::string& message, int status = 1);

}  // namespace longtron::comm
