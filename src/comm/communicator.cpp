// The implementation-independent part of Communicator: handles, byte counters and the cross-rank
// order check (see communicator.h).
#include "comm/communicator.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace longtron::comm {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kAllGather: return "all_gather";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kBarrier: return "barrier";
    case Kind::kSend: return "send";
  }
  return "unknown";
}

static const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kUInt16: return "uint16";
  }
  return "unknown";
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt64: return 8;
    case DType::kInt32: return 4;
    case DType::kUInt16: return 2;
  }
  return 0;
}

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total;
}

uint64_t CommStats::total_sent() const {
  uint64_t total = 0;
  for (uint64_t b : sent) total += b;
  return total;
}

void CommStats::add(const CommStats& other) {
  for (int i = 0; i < kNumKinds; ++i) {
    sent[i] += other.sent[i];
    calls[i] += other.calls[i];
    bytes[i] += other.bytes[i];
    skipped[i] += other.skipped[i];
  }
}

CommStats& global_stats() {
  static CommStats stats;
  return stats;
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->wait();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Work::~Work() {
  // An un-waited handle must not leave MPI writing into freed buffers.
  if (impl_) impl_->wait();
}

void Work::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool Work::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

// The check is on when LONGTRON_COMM_CHECK=1, off when =0, and by default on only in debug builds.
static bool check_from_env() {
  const char* env = std::getenv("LONGTRON_COMM_CHECK");
  if (env && *env) return std::strcmp(env, "0") != 0;
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

Communicator::Communicator() : check_(check_from_env()) {}

void Communicator::barrier() {
  issue({Kind::kBarrier, DType::kInt32, 0, ReduceOp::kSum, 0}, nullptr, nullptr, nullptr).wait();
}

// Payload bytes this rank hands to the collective (see the header for the definition).
static uint64_t payload_bytes(const Communicator::Op& op, int size,
                              const std::vector<int64_t>* counts, int rank) {
  if (size <= 1) return 0;
  int64_t elem = dtype_size(op.dtype);
  switch (op.kind) {
    case Kind::kAllReduce:
    case Kind::kBroadcast: return uint64_t(op.count * elem);
    case Kind::kAllGather:
      return uint64_t((counts ? (*counts)[rank] : op.count) * elem);
    case Kind::kReduceScatter:
      if (counts) {
        int64_t total = 0;
        for (int64_t c : *counts) total += c;
        return uint64_t(total * elem);
      }
      return uint64_t(op.count * size * elem);
    case Kind::kAllToAll: return uint64_t(op.count * size * elem);
    case Kind::kBarrier:
    case Kind::kSend: return 0;
  }
  return 0;
}

// Ring-algorithm bytes this rank sends (see the header): NCCL's bus-byte factors, with the exact
// chunk a ring leaves out for the uneven forms.
static uint64_t ring_bytes(const Communicator::Op& op, int size,
                           const std::vector<int64_t>* counts, int rank) {
  if (size <= 1) return 0;
  const int64_t elem = dtype_size(op.dtype), n = size;
  int64_t total = 0;  // elements of the whole (gathered / unscattered) buffer
  if (counts)
    for (int64_t c : *counts) total += c;
  switch (op.kind) {
    case Kind::kAllReduce: return uint64_t(2 * (n - 1) * op.count * elem / n);
    case Kind::kReduceScatter:  // every chunk but this rank's own
      return uint64_t((counts ? total - (*counts)[size_t(rank)] : (n - 1) * op.count) * elem);
    case Kind::kAllGather:  // every chunk but the successor's (it arrives last and stays)
      return uint64_t(
          (counts ? total - (*counts)[size_t((rank + 1) % size)] : (n - 1) * op.count) * elem);
    case Kind::kAllToAll: return uint64_t((n - 1) * op.count * elem);
    case Kind::kBroadcast:
      return (rank + 1) % size == op.root ? 0 : uint64_t(op.count * elem);
    case Kind::kBarrier:
    case Kind::kSend: return 0;
  }
  return 0;
}

Work Communicator::issue(const Op& op, const void* send, void* recv,
                         const std::vector<int64_t>* counts) {
  check(op.count >= 0 || counts, "communicator: negative count {} for {}", op.count,
        kind_name(op.kind));
  if (counts) {
    check(int64_t(counts->size()) == size(),
          "communicator: {}_v needs {} counts (one per rank), got {}", kind_name(op.kind), size(),
          counts->size());
    for (size_t r = 0; r < counts->size(); ++r)
      check((*counts)[r] >= 0, "communicator: {}_v count {} of rank {} is negative",
            kind_name(op.kind), (*counts)[r], r);
  }
  check(op.dtype != DType::kUInt16 ||
            (op.kind != Kind::kAllReduce && op.kind != Kind::kReduceScatter),
        "communicator: {} of uint16 words (they are moved, never reduced)", kind_name(op.kind));
  if (op.kind == Kind::kBroadcast)
    check(op.root >= 0 && op.root < size(), "communicator: broadcast root {} outside [0, {})",
          op.root, size());
  if (check_) check_order(op);
  ++sequence_;
  int k = int(op.kind);
  uint64_t bytes = payload_bytes(op, size(), counts, rank());
  const uint64_t sent = ring_bytes(op, size(), counts, rank());
  stats_.calls[k] += 1;
  stats_.bytes[k] += bytes;
  stats_.sent[k] += sent;
  global_stats().calls[k] += 1;
  global_stats().bytes[k] += bytes;
  global_stats().sent[k] += sent;
  return do_issue(op, send, recv, counts);
}

Work Communicator::point_to_point(bool send, void* data, int64_t count, DType dtype, int peer,
                                  int tag) {
  check(count >= 0, "communicator: negative count {} for a point-to-point {}", count,
        send ? "send" : "receive");
  check(peer >= 0 && peer < size() && size() > 1,
        "communicator: point-to-point peer {} outside a group of {} ranks", peer, size());
  check(tag >= 0, "communicator: point-to-point tag must be >= 0, got {}", tag);
  if (send) {
    const int k = int(Kind::kSend);
    const uint64_t bytes = uint64_t(count * dtype_size(dtype));
    stats_.calls[k] += 1;
    stats_.bytes[k] += bytes;
    stats_.sent[k] += bytes;
    global_stats().calls[k] += 1;
    global_stats().bytes[k] += bytes;
    global_stats().sent[k] += bytes;
  }
  return do_point_to_point(send, data, count, dtype, peer, tag);
}

Work Communicator::do_point_to_point(bool, void*, int64_t, DType, int, int) {
  fail("communicator: this group has no point-to-point messages");
}

void Communicator::count_skipped(Kind kind, uint64_t bytes) {
  stats_.skipped[int(kind)] += bytes;
  global_stats().skipped[int(kind)] += bytes;
}

void Communicator::check_order(const Op& op) {
  if (size() <= 1) return;
  std::vector<int64_t> mine = {int64_t(sequence_), int64_t(op.kind), int64_t(op.dtype), op.count,
                               int64_t(op.reduce), op.root};
  std::vector<int64_t> all = gather_check_words(mine);
  const size_t w = mine.size();
  auto describe = [&](size_t r) {
    const int64_t* v = &all[r * w];
    return fmt::format("#{} {}({}, count {}, op {}, root {})", v[0], kind_name(Kind(v[1])),
                       dtype_name(DType(v[2])), v[3], v[4] == 0 ? "sum" : "max", v[5]);
  };
  for (size_t r = 1; r < size_t(size()); ++r)
    for (size_t i = 0; i < w; ++i)
      if (all[r * w + i] != all[i])
        fail("collective order mismatch in a group of {} ranks: group rank 0 issued {} but group "
             "rank {} issued {} (every rank must call the same collectives in the same order)",
             size(), describe(0), r, describe(r));
}

}  // namespace longtron::comm
